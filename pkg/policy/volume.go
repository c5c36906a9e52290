package policy

import (
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A reusable lease keeps its workspace and its agent's $HOME on a volume of its own between runs
// (issue 19): one ReadWriteOnce PersistentVolumeClaim per lease, since kubeclip runs one run of
// an agent at a time. The operator sets the storage class and the sizes a lease's claim may have;
// the tenant quota counts the claims and the storage they request.

// LeaseVolume is the operator's policy for reusable leases' volume claims.
type LeaseVolume struct {
	// StorageClass is the storageClassName of every lease's claim; empty leaves it to the
	// cluster's default StorageClass.
	StorageClass string
	// MinSize and MaxSize bound the size a lease's plan may ask for; DefaultSize is the size of a
	// claim whose plan asks for none.
	MinSize, DefaultSize, MaxSize resource.Quantity
}

// DefaultLeaseVolume is the lease volume policy when the operator sets none: the cluster's
// default class, 10Gi unless the plan asks for between 1Gi and 50Gi.
func DefaultLeaseVolume() LeaseVolume {
	return LeaseVolume{
		MinSize:     resource.MustParse("1Gi"),
		DefaultSize: resource.MustParse("10Gi"),
		MaxSize:     resource.MustParse("50Gi"),
	}
}

// isZero reports a LeaseVolume the operator left unset.
func (v LeaseVolume) isZero() bool {
	return v.StorageClass == "" && v.MinSize.IsZero() && v.DefaultSize.IsZero() && v.MaxSize.IsZero()
}

// validate checks the operator's own bounds: positive sizes in order, a valid class name.
func (v LeaseVolume) validate() error {
	var errs []error
	if v.MinSize.Sign() <= 0 {
		errs = append(errs, fmt.Errorf("lease volume minimum size %s must be above 0", v.MinSize.String()))
	}
	if v.DefaultSize.Cmp(v.MinSize) < 0 || v.DefaultSize.Cmp(v.MaxSize) > 0 {
		errs = append(errs, fmt.Errorf("lease volume default size %s must be between the minimum %s and the maximum %s",
			v.DefaultSize.String(), v.MinSize.String(), v.MaxSize.String()))
	}
	if msg := checkDNSSubdomain(v.StorageClass); v.StorageClass != "" && msg != "" {
		errs = append(errs, fmt.Errorf("lease volume storage class %q %s", v.StorageClass, msg))
	}
	return errors.Join(errs...)
}

// leaseVolume is the operator's lease volume policy, DefaultLeaseVolume when it set none.
func (o Operator) leaseVolume() LeaseVolume {
	if o.LeaseVolume.isZero() {
		return DefaultLeaseVolume()
	}
	return o.LeaseVolume
}

// LeaseClaim is what a reusable lease's volume claim is made of.
type LeaseClaim struct {
	// Namespace is the tenant namespace of the lease.
	Namespace string
	// Name is the claim's name, which the lease's backend decides (workload.Workload.ClaimName:
	// LeaseClaimName for kubeclip's pod, SandboxClaimName for agent-sandbox's Sandbox).
	Name string
	// The ids the lease's objects are labelled with (RunLabels); AgentID may be empty.
	RunID, CompanyID, AgentID string
	// Size is the size the lease's plan asks for, as the company wrote it; empty takes the
	// operator's default.
	Size string
}

// LeaseClaimSizeField names the size of a lease's volume in a refusal: the plan's field a
// company changes to ask for a size the operator allows.
const LeaseClaimSizeField = "volumeSize"

// LeaseClaimName is the name of the volume claim of the pod backend's lease whose workload is
// leaseName (kubeclip creates it).
func LeaseClaimName(leaseName string) string {
	return leaseName + "-data"
}

// SandboxClaimName is the name of the volume claim of the sandbox-cr lease whose Sandbox is
// sandbox: agent-sandbox's controller makes it from the Sandbox's volumeClaimTemplate
// LeaseVolumeName and names it "<template>-<sandbox>" (kubernetes-sigs/agent-sandbox v0.5.6,
// controllers/sandbox_controller.go, reconcilePVCs and reconcilePod).
func SandboxClaimName(sandbox string) string {
	return LeaseVolumeName + "-" + sandbox
}

// RenderLeaseClaim renders a reusable lease's PersistentVolumeClaim: ReadWriteOnce (one run of
// the agent at a time uses it), the operator's storage class, and the size the plan asks for
// within the operator's bounds (the default when it asks for none). A company may ask for less
// than the default, down to the minimum, never more than the maximum: a size outside the bounds
// is refused in a *ValidationError naming LeaseClaimSizeField, never silently clamped.
func (o Operator) RenderLeaseClaim(c LeaseClaim) (*corev1.PersistentVolumeClaim, error) {
	var errs fieldErrors
	if msg := checkDNSLabel(c.Namespace); msg != "" {
		errs.add("namespace", msg)
	}
	if msg := checkDNSLabel(c.Name); msg != "" {
		errs.add("name", fmt.Sprintf("%s cannot name a volume claim: %s", quoteShort(c.Name), msg))
	}
	checkID(&errs, "runId", c.RunID)
	checkID(&errs, "companyId", c.CompanyID)
	if c.AgentID != "" {
		checkID(&errs, "agentId", c.AgentID)
	}
	size, err := o.leaseVolume().size(c.Size)
	if err != nil {
		errs.add(LeaseClaimSizeField, err.Error())
	}
	if err := errs.err(); err != nil {
		return nil, err
	}
	labels := managedByLabels()
	labels[LabelRunID] = c.RunID
	labels[LabelCompanyID] = c.CompanyID
	if c.AgentID != "" {
		labels[LabelAgentID] = c.AgentID
	}
	pvc := &corev1.PersistentVolumeClaim{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"},
		ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: c.Namespace, Labels: labels},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceStorage: size},
			},
		},
	}
	if class := o.leaseVolume().StorageClass; class != "" {
		pvc.Spec.StorageClassName = &class
	}
	return pvc, nil
}

// size is the claim size for what a plan asked: the default for nothing, else the asked size
// when it is a quantity within [MinSize, MaxSize].
func (v LeaseVolume) size(asked string) (resource.Quantity, error) {
	if asked == "" {
		return v.DefaultSize.DeepCopy(), nil
	}
	q, err := resource.ParseQuantity(asked)
	if err != nil {
		return resource.Quantity{}, fmt.Errorf("%s is not a size such as 5Gi or 20Gi", quoteShort(asked))
	}
	if q.Cmp(v.MinSize) < 0 || q.Cmp(v.MaxSize) > 0 {
		return resource.Quantity{}, fmt.Errorf("%s is outside the sizes this kubeclip installation allows (%s to %s)",
			q.String(), v.MinSize.String(), v.MaxSize.String())
	}
	return q, nil
}

// storageQuota is what every tenant's ResourceQuota counts of volume claims whatever the
// operator's --tenant-quota names (DefaultTenantQuota's values for what it leaves out): a
// reusable lease's claim outlives its pod, so without these a company could hold claims, and
// the storage behind them, without bound.
var storageQuota = []corev1.ResourceName{corev1.ResourcePersistentVolumeClaims, corev1.ResourceRequestsStorage}

// withStorageQuota adds the storage entries q lacks, from DefaultTenantQuota.
func withStorageQuota(q corev1.ResourceList) corev1.ResourceList {
	def := DefaultTenantQuota()
	for _, name := range storageQuota {
		if _, ok := q[name]; !ok {
			q[name] = def[name]
		}
	}
	return q
}

// validateStorageQuota checks that a claim of the default size fits the tenant quota: with
// less, no reusable lease could start.
func (o Operator) validateStorageQuota() error {
	q := o.tenantQuota()
	var errs []error
	if n := q[corev1.ResourcePersistentVolumeClaims]; n.Cmp(resource.MustParse("1")) < 0 {
		errs = append(errs, fmt.Errorf("tenant quota persistentvolumeclaims %s allows no lease volume", n.String()))
	}
	if s, def := q[corev1.ResourceRequestsStorage], o.leaseVolume().DefaultSize; s.Cmp(def) < 0 {
		errs = append(errs, fmt.Errorf("tenant quota requests.storage %s is below one lease volume's default size %s: no reusable lease could start", s.String(), def.String()))
	}
	return errors.Join(errs...)
}

// claimLimits is the tenant LimitRange's item for volume claims: Kubernetes itself refuses a
// claim outside the operator's sizes, whoever creates it.
func (o Operator) claimLimits() corev1.LimitRangeItem {
	v := o.leaseVolume()
	return corev1.LimitRangeItem{
		Type: corev1.LimitTypePersistentVolumeClaim,
		Min:  corev1.ResourceList{corev1.ResourceStorage: v.MinSize.DeepCopy()},
		Max:  corev1.ResourceList{corev1.ResourceStorage: v.MaxSize.DeepCopy()},
	}
}
