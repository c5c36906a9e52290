package storage_test

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// TestStorageQuotaRefusalNamesTheResource is issue 19's "a company over its storage quota gets
// quota_exceeded naming the field": in a tenant whose quota allows one claim and 3Gi, a 4Gi
// claim (within the operator's sizes) is refused for requests.storage, and once a 1Gi claim
// holds the one allowed, a second is refused for persistentvolumeclaims. Kubernetes' refusal,
// mapped by k8s.Meaning, is terminal quota_exceeded with the resource as its field, and a
// refused claim is not created. A 5Gi claim, beyond the operator's 4Gi maximum, is refused by
// the tenant's LimitRange before the quota counts it.
func TestStorageQuotaRefusalNamesTheResource(t *testing.T) {
	cs := clustertest.Clientset(t)
	op := policy.DefaultOperator()
	op.TenantQuota = corev1.ResourceList{
		corev1.ResourcePersistentVolumeClaims: resource.MustParse("1"),
		corev1.ResourceRequestsStorage:        resource.MustParse("3Gi"),
	}
	op.LeaseVolume = policy.LeaseVolume{
		MinSize: resource.MustParse("1Gi"), DefaultSize: resource.MustParse("1Gi"), MaxSize: resource.MustParse("4Gi"),
	}
	if err := op.Validate(); err != nil {
		t.Fatal(err)
	}
	ns, company := applyTenant(t, cs, op)

	refused := func(size, wantField string) {
		t.Helper()
		pvc, err := op.RenderLeaseClaim(policy.LeaseClaim{
			Namespace: ns, Name: policy.LeaseClaimName("pc-" + shortID()), RunID: "run-" + shortID(), CompanyID: company, Size: size,
		})
		if err != nil {
			t.Fatal(err)
		}
		_, err = cs.CoreV1().PersistentVolumeClaims(ns).Create(t.Context(), pvc, metav1.CreateOptions{})
		te, ok := events.AsTerminal(k8s.Meaning(k8s.OpCreate, err))
		if !ok || te.Code != events.CodeQuotaExceeded || te.Field != wantField {
			t.Fatalf("a %s claim: Meaning(%v) = %+v, want terminal %s naming %s", size, err, te, events.CodeQuotaExceeded, wantField)
		}
		t.Logf("a %s claim: %s", size, te.Public())
		if _, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), pvc.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the refused claim %s exists (%v)", pvc.Name, err)
		}
	}
	// A claim that did not come through RenderLeaseClaim is held to the operator's sizes by the
	// tenant's LimitRange.
	tooBig := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "too-big"},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("5Gi")}},
		},
	}
	_, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(t.Context(), tooBig, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "maximum storage usage per PersistentVolumeClaim is 4Gi") {
		t.Errorf("a 5Gi claim beside RenderLeaseClaim: %v, want the LimitRange's refusal (maximum 4Gi)", err)
	}

	refused("4Gi", string(corev1.ResourceRequestsStorage))
	createLeaseClaim(t, cs, op, ns, company, "1Gi")
	refused("1Gi", string(corev1.ResourcePersistentVolumeClaims))
}

// TestRedeliveredClaimAtTheClaimLimit: a redelivered dispatch of a reusable lease creates its
// claim again (workload.CreateClaim). At the company's claim limit, its own claim counting,
// that must find the claim, not be refused quota_exceeded by quota admission (which runs before
// the name check); another run's claim under the name is still a conflict.
func TestRedeliveredClaimAtTheClaimLimit(t *testing.T) {
	cs := clustertest.Clientset(t)
	op := policy.DefaultOperator()
	op.TenantQuota = corev1.ResourceList{corev1.ResourcePersistentVolumeClaims: resource.MustParse("1")}
	if err := op.Validate(); err != nil {
		t.Fatal(err)
	}
	ns, company := applyTenant(t, cs, op)
	claim := policy.LeaseClaim{Namespace: ns, Name: policy.LeaseClaimName("pc-" + shortID()), RunID: "run-" + shortID(), CompanyID: company}
	pvc, err := op.RenderLeaseClaim(claim)
	if err != nil {
		t.Fatal(err)
	}
	createRetryingConflicts(t, "claim "+pvc.Name, func() error { return workload.CreateClaim(t.Context(), cs, pvc) })
	again, err := op.RenderLeaseClaim(claim)
	if err != nil {
		t.Fatal(err)
	}
	if err := workload.CreateClaim(t.Context(), cs, again); err != nil {
		t.Fatalf("the redelivered dispatch's claim at the claim limit: %v, want the existing claim found", err)
	}
	claim.RunID = "run-" + shortID()
	other, err := op.RenderLeaseClaim(claim)
	if err != nil {
		t.Fatal(err)
	}
	if err := workload.CreateClaim(t.Context(), cs, other); !errors.Is(err, k8s.ErrRunConflict) {
		t.Fatalf("another run's claim under the name: %v, want k8s.ErrRunConflict", err)
	}
}
