package storage_test

import (
	"fmt"
	"testing"
	"time"

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
// Sandbox is created and the claim is still the controller's to make; and once the controller
// made it, a redelivered dispatch is not refused for the room the lease's own claim takes.
func TestReusableSandboxOverQuotaCreatesNothing(t *testing.T) {
	cs := clustertest.Clientset(t)
	clustertest.RequireSandboxController(t)
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

	create := func(size string) (policy.RunSpec, error) {
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
		_, err = w.Create(t.Context(), spec, secretFor(t, spec))
		return spec, err
	}

	refused, err := create("4Gi")
	name := refused.WorkloadName
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

	spec, err := create("2Gi")
	if err != nil {
		t.Fatalf("a reusable Sandbox whose 2Gi claim the quota admits: %v", err)
	}
	sb, err := sandboxes.Get(t.Context(), spec.WorkloadName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the admitted lease's Sandbox: %v", err)
	}

	// agent-sandbox's controller (the one hack/cluster/cluster.sh runs) makes the claim, owned
	// by the Sandbox, which fills the quota's storage; a redelivered dispatch of the same lease
	// finds its Sandbox and claim and is not refused for the room its own claim takes.
	eventually(t, 30*time.Second, "the controller's claim", func() error {
		pvc, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), spec.VolumeClaim.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !metav1.IsControlledBy(pvc, sb) {
			return fmt.Errorf("claim %s is controlled by %v, not by the Sandbox", pvc.Name, metav1.GetControllerOf(pvc))
		}
		return nil
	})
	eventually(t, 30*time.Second, "the quota counting the claim", func() error {
		q, err := cs.CoreV1().ResourceQuotas(ns).Get(t.Context(), policy.TenantResourceQuota, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if used := q.Status.Used[corev1.ResourceRequestsStorage]; used.Cmp(resource.MustParse("2Gi")) != 0 {
			return fmt.Errorf("requests.storage used %s", used.String())
		}
		return nil
	})
	again, err := w.Create(t.Context(), spec, secretFor(t, spec))
	if err != nil || !again.Existed {
		t.Errorf("the redelivered dispatch of the admitted lease: existed %v, %v; want its Sandbox found", again.Existed, err)
	}
}

func secretFor(t *testing.T, spec policy.RunSpec) *corev1.Secret {
	t.Helper()
	secret, err := policy.RenderSecret(spec, policy.OwnerReference("v1", "Pod", spec.WorkloadName, "set-on-create"), "token", nil)
	if err != nil {
		t.Fatal(err)
	}
	return secret
}
