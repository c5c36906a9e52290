package storage_test

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// TestReusableSandboxOverQuotaCreatesNothing: a reusable sandbox-cr lease's claim is made by
// agent-sandbox's controller, not by kubeclip, so the tenant quota would refuse it only after
// the Sandbox exists, leaving its pod Pending. The workload asks first (a dry run of the claim):
// over the quota, Create fails with quota_exceeded naming requests.storage, as the pod
// backend's own claim does, and neither Sandbox, Secret nor claim is created; within it, the
// Sandbox is created and the claim is still the controller's to make.
func TestReusableSandboxOverQuotaCreatesNothing(t *testing.T) {
	cs := clustertest.Clientset(t)
	dyn, err := dynamic.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	op := policy.DefaultOperator()
	op.TenantQuota = corev1.ResourceList{
		corev1.ResourcePersistentVolumeClaims: resource.MustParse("2"),
		corev1.ResourceRequestsStorage:        resource.MustParse("3Gi"),
	}
	op.LeaseVolume = policy.LeaseVolume{
		MinSize: resource.MustParse("1Gi"), DefaultSize: resource.MustParse("1Gi"), MaxSize: resource.MustParse("4Gi"),
	}
	if err := op.Validate(); err != nil {
		t.Fatal(err)
	}
	ns, company := applyTenant(t, cs, op)
	w, err := workload.For(policy.BackendSandboxCR, workload.Deps{Clientset: cs, Dynamic: dyn})
	if err != nil {
		t.Fatal(err)
	}
	sandboxes := dyn.Resource(policy.SandboxGVR(policy.SandboxAPIVersionV1beta1)).Namespace(ns)

	create := func(size string) (string, error) {
		t.Helper()
		spec := policy.RunSpec{
			RunID: "run-" + shortID(), CompanyID: company, AdapterType: "claude_local", Namespace: ns,
			WorkloadName: "pc-" + shortID(), Image: "kubeclip.local/sandbox:dev", Config: policy.DefaultConfig(),
			SandboxdImage: "kubeclip.local/sandboxd:dev",
		}
		if spec.VolumeClaim, err = op.RenderLeaseClaim(policy.LeaseClaim{
			Namespace: ns, Name: w.ClaimName(spec.WorkloadName), RunID: spec.RunID, CompanyID: company, Size: size,
		}); err != nil {
			t.Fatal(err)
		}
		secret, err := policy.RenderSecret(spec, policy.OwnerReference("v1", "Pod", spec.WorkloadName, "set-on-create"), "token", nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = w.Create(t.Context(), spec, secret)
		return spec.WorkloadName, err
	}

	name, err := create("4Gi")
	te, ok := events.AsTerminal(k8s.Meaning(k8s.OpCreate, err))
	if !ok || te.Code != events.CodeQuotaExceeded || te.Field != string(corev1.ResourceRequestsStorage) {
		t.Fatalf("a reusable Sandbox whose 4Gi claim the 3Gi quota refuses: Meaning(%v) = %+v, want terminal %s naming %s",
			err, te, events.CodeQuotaExceeded, corev1.ResourceRequestsStorage)
	}
	t.Logf("refused: %s", te.Public())
	if _, err := sandboxes.Get(t.Context(), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused lease's Sandbox: %v, want NotFound", err)
	}
	if _, err := cs.CoreV1().Secrets(ns).Get(t.Context(), policy.SecretName(name), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the refused lease's Secret: %v, want NotFound", err)
	}
	if list, err := cs.CoreV1().PersistentVolumeClaims(ns).List(t.Context(), metav1.ListOptions{}); err != nil || len(list.Items) != 0 {
		t.Errorf("claims after the refusal: %v (%v), want none (the dry run made nothing)", list, err)
	}

	name, err = create("2Gi")
	if err != nil {
		t.Fatalf("a reusable Sandbox whose 2Gi claim the quota admits: %v", err)
	}
	if _, err := sandboxes.Get(t.Context(), name, metav1.GetOptions{}); err != nil {
		t.Errorf("the admitted lease's Sandbox: %v", err)
	}
}
