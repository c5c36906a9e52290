package deploy_test

import (
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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

	tenantLabels := map[string]string{policy.LabelManagedBy: policy.ManagedBy, policy.LabelCompanyID: "co-" + id}
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
