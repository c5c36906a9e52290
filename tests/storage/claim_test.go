package storage_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// TestLeaseClaimOutlivesItsPods is the reuse primitive of issue 19: a lease's claim, rendered by
// policy.RenderLeaseClaim into a tenant namespace, stays Pending until a pod uses it
// (WaitForFirstConsumer), then binds to a volume the provisioner made; what the first pod wrote
// is read by a second pod after the first is deleted; deleting the claim deletes the volume and
// the provisioner's helper pod removes its directory from the node.
func TestLeaseClaimOutlivesItsPods(t *testing.T) {
	cs := clustertest.Clientset(t)
	op := policy.DefaultOperator()
	ns, company := applyTenant(t, cs, op)
	claim := createLeaseClaim(t, cs, op, ns, company, "")

	pvc, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pvc.Status.Phase != corev1.ClaimPending || pvc.Spec.VolumeName != "" {
		t.Fatalf("claim before any pod: phase %s, volume %q; want Pending with no volume (WaitForFirstConsumer)", pvc.Status.Phase, pvc.Spec.VolumeName)
	}
	// The operator named no class: the cluster's default, the provisioner's, is filled in.
	if got := pvc.Spec.StorageClassName; got == nil || *got != storageClass {
		t.Errorf("claim's storage class %v, want the cluster default %s", got, storageClass)
	}

	// The first pod: the claim binds, and what the pod writes lands in the volume's directory.
	mark := "written-by-first-" + shortID()
	took := startPod(t, cs, ns, claimPod("first", claim, "echo "+mark+" > "+mountPath+"/mark"))
	t.Logf("pod create -> Ready with a fresh claim: %v", took.Round(time.Millisecond))
	pv := boundVolume(t, cs, ns, claim)
	if pv.Spec.StorageClassName != storageClass || pv.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		t.Errorf("volume %s: class %q, reclaim %s; want %s, Delete", pv.Name, pv.Spec.StorageClassName, pv.Spec.PersistentVolumeReclaimPolicy, storageClass)
	}
	if m := pv.Spec.AccessModes; len(m) != 1 || m[0] != corev1.ReadWriteOnce {
		t.Errorf("volume %s access modes %v, want ReadWriteOnce", pv.Name, m)
	}
	dir := nodeDir(t, pv)
	eventually(t, 30*time.Second, "the first pod's file in "+dir, func() error {
		data, err := os.ReadFile(filepath.Join(dir, "mark"))
		if err != nil {
			return err
		}
		if got := strings.TrimSpace(string(data)); got != mark {
			return fmt.Errorf("mark %q, want %q", got, mark)
		}
		return nil
	})

	// The second pod, once the first is gone, reads it from the same claim.
	deletePod(t, cs, ns, "first")
	took = startPod(t, cs, ns, claimPod("second", claim, "cat "+mountPath+"/mark"))
	t.Logf("pod create -> Ready with an existing bound claim: %v", took.Round(time.Millisecond))
	eventually(t, 30*time.Second, "the second pod's output", func() error {
		out, err := cs.CoreV1().Pods(ns).GetLogs("second", &corev1.PodLogOptions{}).DoRaw(t.Context())
		if err != nil {
			return err
		}
		if got := strings.TrimSpace(string(out)); got != mark {
			return fmt.Errorf("the second pod read %q, want %q", got, mark)
		}
		return nil
	})
	if again := boundVolume(t, cs, ns, claim); again.Name != pv.Name {
		t.Errorf("the claim moved from volume %s to %s", pv.Name, again.Name)
	}

	// Deleting the claim deletes the volume and its directory.
	deletePod(t, cs, ns, "second")
	if err := cs.CoreV1().PersistentVolumeClaims(ns).Delete(t.Context(), claim, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "volume "+pv.Name+" deleted", func() error {
		_, err := cs.CoreV1().PersistentVolumes().Get(t.Context(), pv.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading it: %w", err)
		}
		return errors.New("still there")
	})
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the volume is deleted but its directory %s is still on the node (%v)", dir, err)
	}
}

// createRetryingConflicts runs create until it succeeds, again while it fails with Conflict: the
// quota admission plugin answers Conflict when the quota controller updated the quota's status
// meanwhile (k8s.Meaning: retry), as the consume loop would retry the message.
func createRetryingConflicts(t testing.TB, what string, create func() error) {
	t.Helper()
	eventually(t, 30*time.Second, "creating "+what, func() error {
		err := create()
		if err != nil && !apierrors.IsConflict(err) {
			t.Fatalf("creating %s: %v", what, err)
		}
		return err
	})
}

// createLeaseClaim renders a lease's claim of the given size (empty: the default) and creates it.
func createLeaseClaim(t testing.TB, cs kubernetes.Interface, op policy.Operator, ns, company, size string) string {
	t.Helper()
	pvc, err := op.RenderLeaseClaim(policy.LeaseClaim{
		Namespace: ns, Name: policy.LeaseClaimName("pc-" + shortID()), RunID: "run-" + shortID(), CompanyID: company, Size: size,
	})
	if err != nil {
		t.Fatal(err)
	}
	createRetryingConflicts(t, "claim "+pvc.Name, func() error {
		_, err := cs.CoreV1().PersistentVolumeClaims(ns).Create(t.Context(), pvc, metav1.CreateOptions{})
		return err
	})
	return pvc.Name
}

// boundVolume returns the volume the claim is bound to, failing t if it is not Bound.
func boundVolume(t testing.TB, cs kubernetes.Interface, ns, claim string) *corev1.PersistentVolume {
	t.Helper()
	pvc, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), claim, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pvc.Status.Phase != corev1.ClaimBound || pvc.Spec.VolumeName == "" {
		t.Fatalf("claim %s: phase %s, volume %q; want Bound", claim, pvc.Status.Phase, pvc.Spec.VolumeName)
	}
	pv, err := cs.CoreV1().PersistentVolumes().Get(t.Context(), pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pv
}

// nodeDir is the volume's directory on the node: the local cluster's node is this machine.
func nodeDir(t testing.TB, pv *corev1.PersistentVolume) string {
	t.Helper()
	if pv.Spec.HostPath == nil {
		t.Fatalf("volume %s is not a hostPath volume of the local provisioner: %+v", pv.Name, pv.Spec.PersistentVolumeSource)
	}
	dir := pv.Spec.HostPath.Path
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		t.Fatalf("volume %s's directory %s is not on this node (%v): run the test on the local cluster's node", pv.Name, dir, err)
	}
	return dir
}

// TestProvisionerIsTheClusterDefault: hack/cluster/cluster.sh installs kubeclip-local as the only
// default StorageClass, binding on first use and deleting volumes with their claims, so a claim
// naming no class (the NATS StatefulSet's in tests/deploy, a lease's when the operator names
// none) binds through the provisioner.
func TestProvisionerIsTheClusterDefault(t *testing.T) {
	cs := clustertest.Clientset(t)
	classes, err := cs.StorageV1().StorageClasses().List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var defaults []string
	var sc *storagev1.StorageClass
	for i, c := range classes.Items {
		if c.Annotations["storageclass.kubernetes.io/is-default-class"] == "true" {
			defaults = append(defaults, c.Name)
		}
		if c.Name == storageClass {
			sc = &classes.Items[i]
		}
	}
	if sc == nil {
		t.Fatalf("no StorageClass %s: install the provisioner with `bash hack/cluster/cluster.sh storage` (or cluster.sh up)", storageClass)
	}
	if len(defaults) != 1 || defaults[0] != storageClass {
		t.Errorf("default StorageClasses %v, want only %s", defaults, storageClass)
	}
	if sc.Provisioner != "rancher.io/local-path" || sc.VolumeBindingMode == nil || *sc.VolumeBindingMode != storagev1.VolumeBindingWaitForFirstConsumer ||
		sc.ReclaimPolicy == nil || *sc.ReclaimPolicy != corev1.PersistentVolumeReclaimDelete {
		t.Errorf("StorageClass %s: provisioner %s, binding %v, reclaim %v; want rancher.io/local-path, WaitForFirstConsumer, Delete",
			sc.Name, sc.Provisioner, sc.VolumeBindingMode, sc.ReclaimPolicy)
	}
}
