// Package dryrun_test sends every object pkg/policy renders to the local test cluster with
// server-side dry-run and strict field validation, so the API server's own validation, its
// admission plugins (Pod Security, LimitRanger, ResourceQuota) and the installed CRD schemas
// (Cilium, agent-sandbox) judge them. It also creates one real Pod from the Job's template to
// prove that template passes Pod Security "restricted".
package dryrun_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// klog's flush daemon starts with the first client and lives for the process.
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
		// Idle keep-alive connections of client-go's shared HTTP transport.
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("golang.org/x/net/http2.(*ClientConn).readLoop"),
	)
}

// agentImage is built from tests/images and imported into the node's containerd; the Job
// renders IfNotPresent, so no registry is needed.
const agentImage = "kubeclip.local/agent-stub:dev"

// strict makes the API server reject unknown or duplicate fields instead of dropping them.
const strict = "Strict"

var dryRunAll = []string{metav1.DryRunAll}

type cluster struct {
	cs     kubernetes.Interface
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

// warningRecorder collects the API server's warnings. kubeclip's objects should draw none: a
// warning (a non-canonical CIDR, a deprecated API) is something a future release rejects.
type warningRecorder struct {
	mu       sync.Mutex
	warnings []string
}

func (w *warningRecorder) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.warnings = append(w.warnings, text)
}

func (w *warningRecorder) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.warnings
	w.warnings = nil
	return out
}

func newCluster(t *testing.T, warnings rest.WarningHandler) cluster {
	t.Helper()
	cfg := clustertest.Config(t)
	cfg.WarningHandler = warnings
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("building clientset: %v", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("building dynamic client: %v", err)
	}
	return cluster{cs: cs, dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(cs.Discovery()))}
}

// requireResource fails the test, saying how to fix it, when the cluster does not serve a CRD.
func (c cluster) requireResource(t *testing.T, gvr schema.GroupVersionResource, crdFile string) {
	t.Helper()
	list, err := c.cs.Discovery().ServerResourcesForGroupVersion(gvr.GroupVersion().String())
	if err == nil {
		for _, r := range list.APIResources {
			if r.Name == gvr.Resource {
				return
			}
		}
	}
	t.Fatalf("the cluster does not serve %s (%v): the CRD is missing.\n"+
		"hack/cluster/cluster.sh up installs it (%s; agent-sandbox's from the module of the controller it runs); on another cluster apply it with kubectl apply --server-side",
		gvr, err, crdFile)
}

// resource returns the dynamic client for obj's kind, namespaced when the kind is.
func (c cluster) resource(t *testing.T, obj *unstructured.Unstructured) dynamic.ResourceInterface {
	t.Helper()
	gvk := obj.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("mapping %s: %v", gvk, err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return c.dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
	}
	return c.dyn.Resource(m.Resource)
}

// apply server-side applies obj as kubeclip's field manager, with strict field validation.
func (c cluster) apply(ctx context.Context, t *testing.T, obj *unstructured.Unstructured, dryRun bool) error {
	t.Helper()
	data, err := obj.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	opts := metav1.PatchOptions{FieldManager: k8s.DefaultFieldManager, Force: ptr(true), FieldValidation: strict}
	if dryRun {
		opts.DryRun = dryRunAll
	}
	_, err = c.resource(t, obj).Patch(ctx, obj.GetName(), types.ApplyPatchType, data, opts)
	return err
}

// dryRunCreate creates obj with server-side dry-run and strict field validation.
func (c cluster) dryRunCreate(ctx context.Context, t *testing.T, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	t.Helper()
	return c.resource(t, obj).Create(ctx, obj, metav1.CreateOptions{DryRun: dryRunAll, FieldValidation: strict})
}

func ptr[T any](v T) *T { return &v }

func TestRenderedObjectsPassServerDryRun(t *testing.T) {
	warnings := &warningRecorder{}
	c := newCluster(t, warnings)
	ctx := t.Context()
	t.Cleanup(func() {
		for _, w := range warnings.take() {
			t.Errorf("API server warning: %s", w)
		}
	})
	c.requireResource(t, policy.CiliumNetworkPolicyGVR, "cilium.io_ciliumnetworkpolicies.yaml")
	c.requireResource(t, policy.SandboxGVR(policy.SandboxAPIVersionV1beta1), "agents.x-k8s.io_sandboxes.yaml")

	// A fresh tenant per run: the company id carries a random ULID.
	companyID := "dryrun-" + strings.ToLower(ulid.Make().String())
	cfg, err := policy.ParseConfig([]byte(`{
		"namespacePrefix": "kubeclip-test-",
		"egressAllowCidrs": ["10.20.0.0/16", "203.0.113.7/32"],
		"egressAllowFqdns": ["github.com", "*.githubusercontent.com"],
		"serviceAccountAnnotations": {"example.com/owner": "kubeclip-tests"},
		"paperclipServerNamespace": "paperclip-system",
		"paperclipServerPodLabels": {"app.kubernetes.io/name": "paperclip"},
		"defaultResources": {"limits": {"cpu": "1"}}
	}`))
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	adapter, err := cfg.Adapter(cfg.AdapterType)
	if err != nil {
		t.Fatal(err)
	}
	// The operator allows the config's ServiceAccount annotation (default: none).
	op := policy.DefaultOperator()
	op.ServiceAccountAnnotationKeys = []string{"example.com/owner"}
	standard, err := policy.RenderTenant(cfg, companyID, op, adapter)
	if err != nil {
		t.Fatalf("RenderTenant: %v", err)
	}
	ciliumCfg := cfg
	ciliumCfg.EgressMode = policy.EgressCilium
	cilium, err := policy.RenderTenant(ciliumCfg, companyID, op, adapter)
	if err != nil {
		t.Fatalf("RenderTenant (cilium): %v", err)
	}
	ns := standard.Namespace.Name

	// The tenant namespace is created for real (dry-run objects in a namespace need it to
	// exist); its rendered labels make it enforce Pod Security "restricted".
	if got := standard.Namespace.Labels["pod-security.kubernetes.io/enforce"]; got != "restricted" {
		t.Fatalf("rendered namespace enforces %q, want restricted", got)
	}
	if _, err := c.cs.CoreV1().Namespaces().Create(ctx, standard.Namespace, metav1.CreateOptions{FieldValidation: strict}); err != nil {
		t.Fatalf("creating namespace %s: %v", ns, err)
	}
	t.Cleanup(func() {
		// t.Context is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting namespace %s: %v", ns, err)
		}
	})

	for name, tenant := range map[string]policy.Tenant{"standard": standard, "cilium": cilium} {
		t.Run("tenant/"+name, func(t *testing.T) {
			objs, err := tenant.Objects()
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range objs {
				if err := c.apply(ctx, t, o, true); err != nil {
					t.Errorf("dry-run apply of %s %s: %v", o.GetKind(), o.GetName(), err)
				}
			}
		})
	}

	// Pods need their ServiceAccount to exist, and the LimitRange and ResourceQuota should
	// take part in admission, so these three are applied for real.
	objs, err := standard.Objects()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceAccount", "LimitRange", "ResourceQuota":
			if err := c.apply(ctx, t, o, false); err != nil {
				t.Fatalf("applying %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		}
	}

	spec := policy.RunSpec{
		RunID:        "run-" + strings.ToLower(ulid.Make().String()),
		CompanyID:    companyID,
		AgentID:      "agent-dryrun",
		IssueID:      "PAP-1",
		AdapterType:  cfg.AdapterType,
		Namespace:    ns,
		WorkloadName: policy.WorkloadName(ulid.Make()),
		Image:        agentImage,
		Config:       cfg,
	}
	if err := spec.Validate(); err != nil {
		t.Fatalf("RunSpec.Validate: %v", err)
	}
	job := policy.RenderJob(spec)

	t.Run("job", func(t *testing.T) {
		u, err := policy.ToUnstructured(job)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.dryRunCreate(ctx, t, u); err != nil {
			t.Fatalf("dry-run create of Job: %v", err)
		}
		if _, err := c.cs.BatchV1().Jobs(ns).Get(ctx, job.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the dry-run Job exists afterwards (get: %v)", err)
		}
	})

	// Owner UIDs: the objects owned by the workload only need a well-formed UID here.
	jobOwner := policy.OwnerReference("batch/v1", "Job", job.Name, types.UID("00000000-0000-4000-8000-000000000001"))

	t.Run("secret", func(t *testing.T) {
		token, err := policy.NewBootstrapToken(strings.NewReader(strings.Repeat("k", 32)))
		if err != nil {
			t.Fatal(err)
		}
		env := policy.BuildAdapterEnv(adapter, func(k string) (string, bool) { return "test-" + strings.ToLower(k), true })
		for k, v := range policy.EgressGrantEnv(policy.EgressGrant{AllowFqdns: []string{"github.com"}}) {
			env[k] = v
		}
		sec, err := policy.RenderSecret(spec, jobOwner, token, env)
		if err != nil {
			t.Fatal(err)
		}
		u, err := policy.ToUnstructured(sec)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.dryRunCreate(ctx, t, u); err != nil {
			t.Fatalf("dry-run create of Secret: %v", err)
		}
	})

	t.Run("sandbox/v1beta1", func(t *testing.T) {
		sb := policy.RenderSandbox(spec, policy.SandboxAPIVersionV1beta1)
		got, err := c.dryRunCreate(ctx, t, sb)
		if err != nil {
			t.Fatalf("dry-run create of Sandbox: %v", err)
		}
		// Nothing was pruned: the pod template comes back as sent (plus defaults).
		wantCmd, _, _ := unstructured.NestedSlice(sb.Object, "spec", "podTemplate", "spec", "containers")
		gotCmd, _, _ := unstructured.NestedSlice(got.Object, "spec", "podTemplate", "spec", "containers")
		if len(gotCmd) != 1 || fmt.Sprint(gotCmd[0].(map[string]any)["command"]) != fmt.Sprint(wantCmd[0].(map[string]any)["command"]) {
			t.Errorf("Sandbox containers came back as %v", gotCmd)
		}
	})

	// A reusable lease's Sandbox (issue 19): the claim as a volumeClaimTemplate, accepted by the
	// CRD's schema and not pruned; the claim agent-sandbox's controller makes of it admitted by
	// the tenant's LimitRange and quota (the dispatcher's own dry run, workload.admitClaim); and
	// the operatingMode changes suspend and resume make accepted, while the templates stay
	// immutable (the CRD's rule: kubeclip never changes them).
	t.Run("sandbox/v1beta1-reusable", func(t *testing.T) {
		reusable := spec
		reusable.WorkloadName = policy.WorkloadName(ulid.Make())
		pvc, err := op.RenderLeaseClaim(policy.LeaseClaim{
			Namespace: ns, Name: policy.SandboxClaimName(reusable.WorkloadName),
			RunID: spec.RunID, CompanyID: companyID, AgentID: spec.AgentID,
		})
		if err != nil {
			t.Fatal(err)
		}
		reusable.VolumeClaim = pvc
		sb := policy.RenderSandbox(reusable, policy.SandboxAPIVersionV1beta1)
		got, err := c.dryRunCreate(ctx, t, sb)
		if err != nil {
			t.Fatalf("dry-run create of the reusable Sandbox: %v", err)
		}
		want, _, _ := unstructured.NestedSlice(sb.Object, "spec", "volumeClaimTemplates")
		back, _, _ := unstructured.NestedSlice(got.Object, "spec", "volumeClaimTemplates")
		if fmt.Sprint(back) != fmt.Sprint(want) {
			t.Errorf("volumeClaimTemplates came back as %v, want %v", back, want)
		}
		if _, err := c.cs.CoreV1().PersistentVolumeClaims(ns).Create(ctx, pvc, metav1.CreateOptions{DryRun: dryRunAll, FieldValidation: strict}); err != nil {
			t.Errorf("dry-run create of the claim the controller makes: %v", err)
		}

		sandboxes := c.dyn.Resource(policy.SandboxGVR(policy.SandboxAPIVersionV1beta1)).Namespace(ns)
		if _, err := sandboxes.Create(ctx, sb, metav1.CreateOptions{FieldValidation: strict}); err != nil {
			t.Fatalf("creating the reusable Sandbox: %v", err)
		}
		t.Cleanup(func() {
			// The test's context is cancelled when cleanups run.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := sandboxes.Delete(ctx, sb.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("deleting the Sandbox: %v", err)
			}
		})
		patch := func(body string) error {
			_, err := sandboxes.Patch(ctx, sb.GetName(), types.MergePatchType, []byte(body),
				metav1.PatchOptions{FieldManager: k8s.DefaultFieldManager, FieldValidation: strict})
			return err
		}
		for _, mode := range []string{"Suspended", "Running"} {
			if err := patch(`{"spec":{"operatingMode":"` + mode + `"}}`); err != nil {
				t.Errorf("setting operatingMode %s: %v", mode, err)
			}
		}
		if err := patch(`{"spec":{"operatingMode":"Paused"}}`); !apierrors.IsInvalid(err) {
			t.Errorf("operatingMode Paused: %v, want Invalid (the CRD's enum)", err)
		}
		if err := patch(`{"spec":{"volumeClaimTemplates":null}}`); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "volumeClaimTemplates is immutable") {
			t.Errorf("removing the volumeClaimTemplates: %v, want Invalid: volumeClaimTemplates is immutable", err)
		}
	})

	t.Run("scoped-egress", func(t *testing.T) {
		grant, err := policy.ParseEgressGrant([]byte(`{"networkEgress": {"allowFqdns": ["registry.npmjs.org", "*.pythonhosted.org"], "allowCidrs": ["140.82.112.0/20"]}}`))
		if err != nil {
			t.Fatal(err)
		}
		fqdnsOnly := policy.EgressGrant{AllowFqdns: grant.AllowFqdns}
		for _, tc := range []struct {
			name  string
			cfg   policy.Config
			grant policy.EgressGrant
		}{
			{"standard", cfg, grant},
			{"standard-fqdns-only", cfg, fqdnsOnly},
			{"cilium", ciliumCfg, grant},
		} {
			s := spec
			s.Config = tc.cfg
			u, err := policy.RenderScopedEgress(s, tc.grant, jobOwner)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.dryRunCreate(ctx, t, u); err != nil {
				t.Errorf("%s: dry-run create of %s: %v", tc.name, u.GetKind(), err)
			}
		}
	})

	t.Run("pod-security", func(t *testing.T) {
		// A real Pod from the Job's template is admitted by a namespace enforcing
		// "restricted" (and by the tenant's LimitRange and ResourceQuota).
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: job.Name + "-psa", Namespace: ns, Labels: job.Spec.Template.Labels},
			Spec:       *job.Spec.Template.Spec.DeepCopy(),
		}
		created, err := c.cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{FieldValidation: strict})
		if err != nil {
			t.Fatalf("creating a Pod from the Job's template: %v", err)
		}
		if created.UID == "" {
			t.Errorf("created Pod has no UID")
		}
		if err := c.cs.CoreV1().Pods(ns).Delete(ctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr[int64](0)}); err != nil {
			t.Errorf("deleting Pod: %v", err)
		}

		// The same template made non-compliant is rejected, so the check above can fail.
		bad := pod.DeepCopy()
		bad.Name = job.Name + "-psa-bad"
		bad.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr(true)
		bad.Spec.Containers[0].SecurityContext.Capabilities = nil
		_, err = c.cs.CoreV1().Pods(ns).Create(ctx, bad, metav1.CreateOptions{DryRun: dryRunAll})
		var status apierrors.APIStatus
		if !apierrors.IsForbidden(err) || !errors.As(err, &status) || !strings.Contains(err.Error(), "violates PodSecurity") {
			t.Fatalf("a non-compliant Pod was not rejected by Pod Security: %v", err)
		}
	})
}
