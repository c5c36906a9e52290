package deploy_test

import (
	"fmt"
	"maps"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

// TestWorkersCannotWriteOutsideTenants is issue 8's defence in depth, proven in the cluster: as
// each worker's ServiceAccount, writes to kube-system, default and kubeclip's own namespace are
// refused by the API server (RBAC, or the admission policy where RBAC must be cluster-wide),
// while the same writes in a kubeclip tenant pass. The exec-worker's exec into pods (its one
// write, a CONNECT) likewise.
func TestWorkersCannotWriteOutsideTenants(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	id := shortID()
	ns := "kubeclip-vap-" + id
	suffix := "-" + id
	objs := render(t, rendering{overlay: "dev", namespace: ns, suffix: suffix})
	c.deleteAtEnd(t, ns, objs)
	applyRBAC(t, c, objs)
	tenantNS := applyTenant(t, c, ns, suffix, "co-"+id)
	as := func(worker string) kubernetes.Interface {
		return c.impersonate(t, fmt.Sprintf("system:serviceaccount:%s:%s%s", ns, worker, suffix), ns)
	}
	tenantWorker, dispatcher, execWorker := as("tenant-worker"), as("dispatcher"), as("exec-worker")
	ctx := t.Context()

	netpol := func(namespace string) error {
		np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "vap-probe-" + id, Namespace: namespace},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}}}
		_, err := tenantWorker.NetworkingV1().NetworkPolicies(namespace).Create(ctx, np, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	// The policies take effect once the API server's admission sees them: wait for a refusal.
	eventually(t, time.Minute, "the admission policy in force", func() error {
		if err := netpol("default"); !apierrors.IsForbidden(err) {
			return fmt.Errorf("a NetworkPolicy in default as the tenant-worker: %w", err)
		}
		return nil
	})

	tenantLabels := map[string]string{policy.LabelManagedBy: policy.ManagedBy, policy.LabelCompanyID: "co-" + id, labelPSSEnforce: "restricted"}
	createNS := func(name string, labels map[string]string) error {
		_, err := tenantWorker.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}},
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	labelNS := func(name string) error {
		patch := fmt.Sprintf(`{"metadata":{"labels":{%q:%q,%q:%q}}}`, policy.LabelManagedBy, policy.ManagedBy, policy.LabelCompanyID, "co-"+id)
		_, err := tenantWorker.CoreV1().Namespaces().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	secret := func(namespace string) error {
		_, err := dispatcher.CoreV1().Secrets(namespace).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "vap-probe-" + id}},
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	// An exec into a pod that does not exist: authorization and admission come first, so a
	// refusal is Forbidden and a request they let through is answered NotFound.
	podExec := func(verb, namespace string) error {
		return execWorker.CoreV1().RESTClient().Verb(verb).Namespace(namespace).Resource("pods").Name("vap-probe-"+id).
			SubResource("exec").Param("command", "true").Param("stdout", "true").Do(ctx).Error()
	}
	pod := func(namespace string) error {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "vap-probe-" + id},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "kubeclip.local/sandbox:dev"}}}}
		_, err := execWorker.CoreV1().Pods(namespace).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	refused := []struct {
		what string
		do   func() error
	}{
		{"tenant-worker: NetworkPolicy in kube-system", func() error { return netpol("kube-system") }},
		{"tenant-worker: NetworkPolicy in default", func() error { return netpol("default") }},
		{"tenant-worker: NetworkPolicy in kubeclip's namespace", func() error { return netpol(ns) }},
		{"tenant-worker: take kube-system over", func() error { return labelNS("kube-system") }},
		{"tenant-worker: take default over", func() error { return labelNS("default") }},
		{"tenant-worker: take kubeclip's namespace over", func() error { return labelNS(ns) }},
		{"tenant-worker: a kube- namespace", func() error { return createNS("kube-vap-"+id, tenantLabels) }},
		{"tenant-worker: a namespace outside the allowed prefixes", func() error { return createNS("other-vap-"+id, tenantLabels) }},
		{"tenant-worker: an unlabelled namespace", func() error { return createNS("paperclip-vap-"+id, nil) }},
		{"dispatcher: Secret in kube-system", func() error { return secret("kube-system") }},
		{"dispatcher: Secret in default", func() error { return secret("default") }},
		{"dispatcher: Secret in kubeclip's namespace", func() error { return secret(ns) }},
		{"exec-worker: exec (POST) in kube-system", func() error { return podExec("POST", "kube-system") }},
		{"exec-worker: exec (GET) in kube-system", func() error { return podExec("GET", "kube-system") }},
		{"exec-worker: exec in default", func() error { return podExec("POST", "default") }},
		{"exec-worker: exec in kubeclip's namespace", func() error { return podExec("POST", ns) }},
		{"exec-worker: a Pod in a tenant", func() error { return pod(tenantNS) }},
		{"exec-worker: a Pod in kube-system", func() error { return pod("kube-system") }},
	}
	for _, tc := range refused {
		if err := tc.do(); !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want Forbidden", tc.what, err)
		} else {
			t.Logf("%s: refused (%v)", tc.what, err)
		}
	}
	allowed := []struct {
		what string
		do   func() error
	}{
		{"tenant-worker: NetworkPolicy in a tenant", func() error { return netpol(tenantNS) }},
		{"tenant-worker: a tenant namespace", func() error { return createNS("paperclip-vap-"+id, tenantLabels) }},
		{"dispatcher: Secret in a tenant", func() error { return secret(tenantNS) }},
	}
	for _, tc := range allowed {
		if err := tc.do(); err != nil {
			t.Errorf("%s: %v, want allowed", tc.what, err)
		}
	}
	for _, verb := range []string{"POST", "GET"} {
		if err := podExec(verb, tenantNS); !apierrors.IsNotFound(err) {
			t.Errorf("exec-worker: exec (%s) in a tenant: %v, want NotFound (authorized and admitted; no such pod)", verb, err)
		}
	}
}

// labelPSSEnforce is the Pod Security admission label every tenant namespace carries.
const labelPSSEnforce = "pod-security.kubernetes.io/enforce"

// TestAdmissionPinsTenantSecurity is issue 15 item 8, proven in the cluster: as kubeclip's
// workers (a stolen token, or a bug), a tenant cannot be relabelled out of Pod Security
// "restricted", a RoleBinding in a tenant cannot bind anything but kubeclip's per-tenant
// ClusterRoles to their own workers, and no privileged, hostPath, host-namespace or
// added-capability pod, Job or Sandbox is admitted, even in a tenant an administrator relabelled
// privileged (so the pod rules hold on their own, not only through Pod Security). What kubeclip
// renders (pkg/policy's tenant, and its golden Pod, Job and Sandbox) is still admitted.
func TestAdmissionPinsTenantSecurity(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	id := shortID()
	ns := "kubeclip-pin-" + id
	suffix := "-" + id
	objs := render(t, rendering{overlay: "dev", namespace: ns, suffix: suffix})
	c.deleteAtEnd(t, ns, objs)
	applyRBAC(t, c, objs)
	tenantNS := applyTenant(t, c, ns, suffix, "co-"+id)
	laxNS := applyTenantWith(t, c, ns, suffix, "lax-"+id, func(ten *policy.Tenant) {
		ten.Namespace.Labels[labelPSSEnforce] = "privileged"
	})
	sa := func(worker string) string { return fmt.Sprintf("system:serviceaccount:%s:%s%s", ns, worker, suffix) }
	tenantWorker := c.impersonate(t, sa("tenant-worker"), ns)
	dispatcher := c.impersonateDynamic(t, sa("dispatcher"), ns)
	ctx := t.Context()
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}

	patchNS := func(patch string) error {
		_, err := tenantWorker.CoreV1().Namespaces().Patch(ctx, tenantNS, types.MergePatchType, []byte(patch), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	createNS := func(pss string) error {
		labels := map[string]string{policy.LabelManagedBy: policy.ManagedBy, policy.LabelCompanyID: "new-" + id}
		if pss != "" {
			labels[labelPSSEnforce] = pss
		}
		_, err := tenantWorker.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "paperclip-new-" + id, Labels: labels}}, dryRun)
		return err
	}
	binding := func(role string, subjects ...rbacv1.Subject) func() error {
		return func() error {
			rb := &rbacv1.RoleBinding{
				ObjectMeta: metav1.ObjectMeta{Name: "pin-probe-" + id, Namespace: tenantNS},
				RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
				Subjects:   subjects,
			}
			_, err := tenantWorker.RbacV1().RoleBindings(tenantNS).Create(ctx, rb, dryRun)
			return err
		}
	}
	worker := func(name string) rbacv1.Subject {
		return rbacv1.Subject{Kind: "ServiceAccount", Name: name + suffix, Namespace: ns}
	}
	dispatcherRole := "kubeclip-tenant-dispatcher" + suffix

	// Pod specs: kubeclip's own (the golden files), and each attack on them.
	golden := map[string]string{
		"Pod":     "../../pkg/policy/testdata/run/pod-defaults.yaml",
		"Job":     "../../pkg/policy/testdata/run/job-defaults.yaml",
		"Sandbox": "../../pkg/policy/testdata/run/sandbox-v1beta1.yaml",
	}
	workload := func(kind, namespace string, attack func(spec map[string]any)) func() error {
		return func() error {
			data, err := os.ReadFile(golden[kind])
			if err != nil {
				t.Fatal(err)
			}
			obj := decodeObjects(t, data)[0]
			obj.SetNamespace(namespace)
			obj.SetName("pin-probe-" + id)
			path := map[string][]string{"Pod": {"spec"}, "Job": {"spec", "template", "spec"}, "Sandbox": {"spec", "podTemplate", "spec"}}[kind]
			spec, _, err := unstructured.NestedMap(obj.Object, path...)
			if err != nil || spec == nil {
				t.Fatalf("%s golden file has no pod spec at %v: %v", kind, path, err)
			}
			attack(spec)
			if err := unstructured.SetNestedMap(obj.Object, spec, path...); err != nil {
				t.Fatal(err)
			}
			gvk := obj.GroupVersionKind()
			m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				t.Fatalf("mapping %s: %v", gvk, err)
			}
			_, err = dispatcher.Resource(m.Resource).Namespace(namespace).Create(ctx, obj, dryRun)
			return err
		}
	}
	container := func(spec map[string]any) map[string]any {
		cs, _ := spec["containers"].([]any)
		if len(cs) == 0 {
			t.Fatal("golden pod spec has no containers")
		}
		return cs[0].(map[string]any)
	}
	// initContainer adds an init container (not every route renders one) with sc.
	initContainer := func(spec map[string]any, sc map[string]any) {
		cs, _ := spec["initContainers"].([]any)
		spec["initContainers"] = append(cs, map[string]any{"name": "pin-probe", "image": "kubeclip.local/sandbox:dev", "securityContext": sc})
	}
	securityContext := func(c map[string]any) map[string]any {
		sc, _ := c["securityContext"].(map[string]any)
		if sc == nil {
			sc = map[string]any{}
			c["securityContext"] = sc
		}
		return sc
	}
	// privileged implies allowPrivilegeEscalation (the API server refuses the pair otherwise).
	privileged := map[string]any{"privileged": true, "allowPrivilegeEscalation": true}
	attacks := map[string]func(spec map[string]any){
		"privileged container": func(spec map[string]any) {
			maps.Copy(securityContext(container(spec)), privileged)
		},
		"privileged init container": func(spec map[string]any) { initContainer(spec, privileged) },
		"hostPath volume": func(spec map[string]any) {
			vols, _ := spec["volumes"].([]any)
			spec["volumes"] = append(vols, map[string]any{"name": "host", "hostPath": map[string]any{"path": "/"}})
		},
		"hostNetwork": func(spec map[string]any) { spec["hostNetwork"] = true },
		"hostPID":     func(spec map[string]any) { spec["hostPID"] = true },
		"hostIPC":     func(spec map[string]any) { spec["hostIPC"] = true },
		"added capability": func(spec map[string]any) {
			securityContext(container(spec))["capabilities"] = map[string]any{"add": []any{"NET_ADMIN"}}
		},
		"added capability in an init container": func(spec map[string]any) {
			initContainer(spec, map[string]any{"capabilities": map[string]any{"add": []any{"SYS_ADMIN"}}})
		},
	}

	type probe struct {
		what string
		do   func() error
	}
	refused := []probe{
		{"tenant-worker: relabel a tenant enforce=privileged", func() error {
			return patchNS(`{"metadata":{"labels":{"` + labelPSSEnforce + `":"privileged"}}}`)
		}},
		{"tenant-worker: relabel a tenant enforce=baseline", func() error {
			return patchNS(`{"metadata":{"labels":{"` + labelPSSEnforce + `":"baseline"}}}`)
		}},
		{"tenant-worker: drop a tenant's enforce label", func() error {
			return patchNS(`{"metadata":{"labels":{"` + labelPSSEnforce + `":null}}}`)
		}},
		{"tenant-worker: a tenant namespace without Pod Security", func() error { return createNS("") }},
		{"tenant-worker: a tenant namespace enforcing privileged", func() error { return createNS("privileged") }},
		{"tenant-worker: bind the dispatcher's role to itself", binding(dispatcherRole, worker("tenant-worker"))},
		{"tenant-worker: bind the dispatcher's role to the exec-worker", binding(dispatcherRole, worker("exec-worker"))},
		{"tenant-worker: bind the dispatcher's role to the tenant's ServiceAccount too", binding(dispatcherRole,
			worker("dispatcher"), rbacv1.Subject{Kind: "ServiceAccount", Name: policy.TenantServiceAccount, Namespace: tenantNS})},
		{"tenant-worker: bind the dispatcher's role to a dispatcher elsewhere", binding(dispatcherRole,
			rbacv1.Subject{Kind: "ServiceAccount", Name: "dispatcher" + suffix, Namespace: "default"})},
		{"tenant-worker: bind the dispatcher's role to every authenticated user", binding(dispatcherRole,
			rbacv1.Subject{Kind: "Group", APIGroup: "rbac.authorization.k8s.io", Name: "system:authenticated"})},
		{"tenant-worker: bind the run-watcher's role with no subject", binding("kubeclip-tenant-run-watcher" + suffix)},
	}
	for _, kind := range []string{"Pod", "Job", "Sandbox"} {
		for name, attack := range attacks {
			refused = append(refused, probe{"dispatcher: " + kind + " with a " + name + " in a privileged tenant", workload(kind, laxNS, attack)})
		}
		refused = append(refused, probe{"dispatcher: " + kind + " with hostNetwork in a tenant", workload(kind, tenantNS, attacks["hostNetwork"])})
	}
	// The policies take effect once the API server's admission sees them: wait for a refusal
	// by each.
	eventually(t, time.Minute, "the admission policies in force", func() error {
		for _, tc := range []probe{refused[0], refused[5], refused[len(refused)-2]} {
			if err := tc.do(); err == nil {
				return fmt.Errorf("%s: allowed", tc.what)
			} else if !apierrors.IsForbidden(err) {
				return fmt.Errorf("%s: %w", tc.what, err)
			}
		}
		return nil
	})
	for _, tc := range refused {
		if err := tc.do(); !apierrors.IsForbidden(err) {
			t.Errorf("%s: %v, want Forbidden", tc.what, err)
		} else {
			t.Logf("%s: refused (%v)", tc.what, err)
		}
	}

	allowed := []probe{
		{"tenant-worker: a tenant's own labels again", func() error {
			return patchNS(`{"metadata":{"labels":{"` + labelPSSEnforce + `":"restricted"}}}`)
		}},
		{"tenant-worker: a new tenant namespace", func() error { return createNS("restricted") }},
	}
	op := policy.DefaultOperator()
	op.KubeclipNamespace, op.RBACNameSuffix = ns, suffix
	ten, err := policy.RenderTenant(policy.DefaultConfig(), "co-"+id, op)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range ten.WorkerBindings {
		allowed = append(allowed, probe{"tenant-worker: the rendered " + b.Name, binding(b.RoleRef.Name, b.Subjects...)})
	}
	for _, kind := range []string{"Pod", "Job", "Sandbox"} {
		allowed = append(allowed,
			probe{"dispatcher: the rendered " + kind, workload(kind, tenantNS, func(map[string]any) {})},
			probe{"dispatcher: the rendered " + kind + " in a privileged tenant", workload(kind, laxNS, func(map[string]any) {})})
	}
	for _, tc := range allowed {
		if err := tc.do(); err != nil {
			t.Errorf("%s: %v, want allowed", tc.what, err)
		}
	}

	// Tenants still work (item 20 too): as the tenant-worker, with its RBAC (no Role, no
	// pods/log) and every policy above, a whole rendered tenant is server-side applied.
	t.Run("tenant-worker provisions a tenant", func(t *testing.T) {
		ctx := t.Context()
		fresh, err := policy.RenderTenant(policy.DefaultConfig(), "new-"+id, op)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := fresh.Objects()
		if err != nil {
			t.Fatal(err)
		}
		c.deleteAtEnd(t, fresh.Namespace.Name, nil)
		as := c.impersonateDynamic(t, sa("tenant-worker"), ns)
		force := true
		for _, o := range objs {
			data, err := o.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			gvk := o.GroupVersionKind()
			m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				t.Fatalf("mapping %s: %v", gvk, err)
			}
			var ri dynamic.ResourceInterface = as.Resource(m.Resource)
			if o.GetNamespace() != "" {
				ri = as.Resource(m.Resource).Namespace(o.GetNamespace())
			}
			// RBAC authorizes from caches: a RoleBinding may need a moment after its namespace.
			eventually(t, 30*time.Second, "applying "+o.GetKind()+" "+o.GetName()+" as the tenant-worker", func() error {
				_, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "kubeclip-test", Force: &force})
				return err
			})
		}
	})
}
