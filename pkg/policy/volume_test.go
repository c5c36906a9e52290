package policy_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

func testLeaseClaim() policy.LeaseClaim {
	return policy.LeaseClaim{
		Namespace: "paperclip-" + testCompanyID,
		Name:      policy.LeaseClaimName("pc-01jq3v6x8k2m4n5p6q7r8s9t0v"),
		RunID:     "run-1",
		CompanyID: testCompanyID,
		AgentID:   "agent-1",
	}
}

// Issue 19: a reusable lease's claim is ReadWriteOnce, named after the lease, labelled like the
// lease's other objects, of the operator's class and default size.
func TestLeaseClaimGolden(t *testing.T) {
	op := policy.DefaultOperator()
	pvc, err := op.RenderLeaseClaim(testLeaseClaim())
	if err != nil {
		t.Fatal(err)
	}
	checkGoldenUnstructured(t, "lease/pvc-default-class.yaml", pvc)

	op.LeaseVolume = policy.DefaultLeaseVolume()
	op.LeaseVolume.StorageClass = "fast-ssd"
	c := testLeaseClaim()
	c.AgentID = ""
	c.Size = "2Gi"
	pvc, err = op.RenderLeaseClaim(c)
	if err != nil {
		t.Fatal(err)
	}
	checkGoldenUnstructured(t, "lease/pvc-operator-class.yaml", pvc)
}

// A company may ask for any size within the operator's bounds, less than the default as well;
// never more than the maximum nor less than the minimum, and what it asks is refused, not
// clamped, with the field named.
func TestLeaseClaimSizeWithinOperatorBounds(t *testing.T) {
	op := policy.DefaultOperator()
	op.LeaseVolume = policy.LeaseVolume{
		MinSize: resource.MustParse("1Gi"), DefaultSize: resource.MustParse("8Gi"), MaxSize: resource.MustParse("20Gi"),
	}
	for _, tc := range []struct {
		asked    string
		wantSize string
		wantErr  string
	}{
		{asked: "", wantSize: "8Gi"},
		{asked: "1Gi", wantSize: "1Gi"},
		{asked: "2Gi", wantSize: "2Gi"},
		{asked: "20Gi", wantSize: "20Gi"},
		{asked: "1500Mi", wantSize: "1500Mi"},
		{asked: "21Gi", wantErr: "21Gi is outside the sizes this kubeclip installation allows (1Gi to 20Gi)"},
		{asked: "1Ti", wantErr: "outside the sizes"},
		{asked: "512Mi", wantErr: "outside the sizes"},
		{asked: "0", wantErr: "outside the sizes"},
		{asked: "-1Gi", wantErr: "outside the sizes"},
		{asked: "lots", wantErr: `"lots" is not a size`},
	} {
		t.Run(tc.asked, func(t *testing.T) {
			c := testLeaseClaim()
			c.Size = tc.asked
			pvc, err := op.RenderLeaseClaim(c)
			if tc.wantErr != "" {
				var ve *policy.ValidationError
				if !errors.As(err, &ve) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want a ValidationError containing %q", err, tc.wantErr)
				}
				if diff := cmp.Diff([]string{policy.LeaseClaimSizeField}, ve.Fields()); diff != "" {
					t.Errorf("fields (-want +got):\n%s", diff)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
			if got.Cmp(resource.MustParse(tc.wantSize)) != 0 {
				t.Errorf("size %s, want %s", got.String(), tc.wantSize)
			}
		})
	}
}

// The ids become label values and Name the claim's name: what cannot be either is
// refused before anything is created, each naming its field.
func TestLeaseClaimRefusesBadNames(t *testing.T) {
	c := policy.LeaseClaim{
		Namespace: "Not_A_Namespace",
		Name:      strings.Repeat("x", 64),
		RunID:     "",
		CompanyID: "bad company",
		AgentID:   "bad/agent",
		Size:      "999Ti",
	}
	_, err := policy.DefaultOperator().RenderLeaseClaim(c)
	var ve *policy.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error %v, want a ValidationError", err)
	}
	want := []string{"namespace", "name", "runId", "companyId", "agentId", policy.LeaseClaimSizeField}
	if diff := cmp.Diff(want, ve.Fields()); diff != "" {
		t.Errorf("fields (-want +got):\n%s", diff)
	}
}

// Kubernetes itself holds every claim in a tenant to the operator's sizes (the LimitRange), so a
// claim that did not come through RenderLeaseClaim is bounded too.
func TestTenantLimitRangeBoundsClaims(t *testing.T) {
	op := policy.DefaultOperator()
	op.LeaseVolume = policy.LeaseVolume{
		MinSize: resource.MustParse("2Gi"), DefaultSize: resource.MustParse("4Gi"), MaxSize: resource.MustParse("8Gi"),
	}
	ten, err := policy.RenderTenant(policy.DefaultConfig(), testCompanyID, op, mustAdapter(t, policy.DefaultConfig(), "claude_local"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, item := range ten.LimitRange.Spec.Limits {
		if item.Type == corev1.LimitTypePersistentVolumeClaim {
			got = append(got, "min="+item.Min.Storage().String(), "max="+item.Max.Storage().String())
		}
	}
	if diff := cmp.Diff([]string{"min=2Gi", "max=8Gi"}, got); diff != "" {
		t.Errorf("the LimitRange's claim bounds (-want +got):\n%s", diff)
	}
}

// The operator's lease volume bounds and storage quota are checked when the worker starts: sizes
// out of order, a class that is no name, or a quota no lease volume fits stop it.
func TestOperatorLeaseVolumeIsValidated(t *testing.T) {
	valid := policy.DefaultOperator()
	if err := valid.Validate(); err != nil {
		t.Fatalf("the default operator is refused: %v", err)
	}
	for _, tc := range []struct {
		name    string
		change  func(*policy.Operator)
		wantErr string
	}{
		{"minimum zero", func(o *policy.Operator) { o.LeaseVolume.MinSize = resource.MustParse("0") }, "minimum size 0 must be above 0"},
		{"default above maximum", func(o *policy.Operator) { o.LeaseVolume.DefaultSize = resource.MustParse("100Gi") }, "default size 100Gi must be between"},
		{"default below minimum", func(o *policy.Operator) { o.LeaseVolume.MinSize = resource.MustParse("20Gi") }, "default size 10Gi must be between"},
		{"storage class", func(o *policy.Operator) { o.LeaseVolume.StorageClass = "Fast_SSD" }, `storage class "Fast_SSD"`},
		{"no claims", func(o *policy.Operator) {
			o.TenantQuota = corev1.ResourceList{corev1.ResourcePersistentVolumeClaims: resource.MustParse("0")}
		}, "persistentvolumeclaims 0 allows no lease volume"},
		{"storage below one volume", func(o *policy.Operator) {
			o.TenantQuota = corev1.ResourceList{corev1.ResourceRequestsStorage: resource.MustParse("5Gi")}
		}, "requests.storage 5Gi is below one lease volume's default size 10Gi"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			op := policy.DefaultOperator()
			op.LeaseVolume = policy.DefaultLeaseVolume()
			tc.change(&op)
			if err := op.Validate(); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Validate() = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}
