package workload

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// sandboxWorkload is backend sandbox-cr: agent-sandbox's Sandbox, whose controller makes the
// pod (named after the Sandbox, owned by it) from the exec pod template, and deletes the
// Sandbox at its spec.shutdownTime even when kubeclip is gone. A reusable lease's Sandbox keeps
// its volume through the controller's own suspend (below).
type sandboxWorkload struct{ d Deps }

var _ Workload = sandboxWorkload{}

func (sandboxWorkload) Backend() policy.Backend { return policy.BackendSandboxCR }
func (sandboxWorkload) Kind() string            { return policy.SandboxKind }

func (w sandboxWorkload) Create(ctx context.Context, spec policy.RunSpec, secret *corev1.Secret) (Created, error) {
	version, err := w.version()
	if err != nil {
		return Created{}, err
	}
	if spec.VolumeClaim != nil {
		if err := w.admitClaim(ctx, version, spec.VolumeClaim); err != nil {
			return Created{}, err
		}
	}
	sandbox := policy.RenderSandbox(spec, version)
	run, err := k8s.CreateWorkloadRun(ctx, w.d.Clientset, w.d.Dynamic, policy.SandboxGVR(version), secret, sandbox)
	if err != nil {
		return Created{}, err
	}
	c := created(run, w.d.Clientset, sandbox.GetAPIVersion(), sandbox.GetKind(), spec.WorkloadName)
	c.adopted = true // CreateWorkloadRun adopted it
	return c, nil
}

// Observe: the Sandbox's pod (its controller names it); there is no Job.
func (sandboxWorkload) Observe(_ []*batchv1.Job, pods []*corev1.Pod) (*batchv1.Job, *corev1.Pod) {
	return nil, newest(pods)
}

// Delete deletes the pods first with opts' grace period, then the Sandbox, and waits for the
// pods (k8s.DeleteWorkloadRun).
func (w sandboxWorkload) Delete(ctx context.Context, namespace, name string, opts k8s.RunDeleteOptions) error {
	version, err := w.version()
	if err != nil {
		return err
	}
	pods := metav1.ListOptions{FieldSelector: "metadata.name=" + name}
	return k8s.DeleteWorkloadRun(ctx, w.d.Clientset, w.d.Dynamic, policy.SandboxGVR(version), namespace, name, pods, opts)
}

func (w sandboxWorkload) Discard(ctx context.Context, namespace, name string, uid types.UID) error {
	version, err := w.version()
	if err != nil {
		return err
	}
	err = w.d.Dynamic.Resource(policy.SandboxGVR(version)).Namespace(namespace).Delete(ctx, name, discardOptions(uid))
	return discarded(err, uid, policy.SandboxKind, namespace, name)
}

// List returns no Sandbox where the cluster serves none (the agent-sandbox controller is not
// installed): there cannot be one.
func (w sandboxWorkload) List(ctx context.Context, pageSize int64, each func(*metav1.PartialObjectMetadata) error) error {
	version, served, err := w.served()
	if err != nil || !served {
		return err
	}
	return listPages(ctx, "Sandboxes", w.d.Metadata.Resource(policy.SandboxGVR(version)).List, pageSize, each)
}

// Exists: no Sandbox exists where the cluster serves none.
func (w sandboxWorkload) Exists(ctx context.Context, namespace, name string) (bool, error) {
	version, served, err := w.served()
	if err != nil || !served {
		return false, err
	}
	list, err := w.d.Dynamic.Resource(policy.SandboxGVR(version)).Namespace(namespace).List(ctx, byName(name))
	if err != nil {
		return false, fmt.Errorf("listing Sandboxes %s/%s: %w", namespace, name, err)
	}
	return len(list.Items) > 0, nil
}

// version is the Sandbox API version the cluster serves; a cluster that serves none fails the
// run with backend_unavailable, naming kubeclip's own exec-capable backend.
func (w sandboxWorkload) version() (string, error) {
	version, served, err := w.served()
	if err != nil {
		return "", err
	}
	if !served {
		return "", events.Terminalf(events.CodeBackendUnavailable, "config.backend",
			"backend %q needs the agent-sandbox controller (agents.x-k8s.io), which this cluster does not serve; install it or set backend to %q (kubeclip's own exec-capable pod)",
			policy.BackendSandboxCR, policy.BackendPod)
	}
	return version, nil
}

// served is the agent-sandbox API version this cluster serves: v1beta1, or v1alpha1 where only
// that is served (agent-sandbox before v0.5; 1.0 removed v1alpha1). Discovery, not the
// request itself: a NotFound from a create would not say whether the namespace or the
// resource type is missing.
func (w sandboxWorkload) served() (version string, ok bool, err error) {
	for _, version := range []string{policy.SandboxAPIVersionV1beta1, policy.SandboxAPIVersionV1alpha1} {
		_, err := w.d.Clientset.Discovery().ServerResourcesForGroupVersion(version)
		switch {
		case err == nil:
			return version, true, nil
		case !apierrors.IsNotFound(err):
			return "", false, fmt.Errorf("discovering %s: %w", version, err)
		}
	}
	return "", false, nil
}

// A reusable sandbox-cr lease is kept through agent-sandbox's own suspend (v1beta1, agent-sandbox
// v0.5 and later; kubernetes-sigs/agent-sandbox controllers/sandbox_controller.go):
//
//   - its claim is the Sandbox's volumeClaimTemplate (policy.RenderSandbox), which the
//     controller creates before the pod (reconcilePVCs) as policy.SandboxClaimName, owned by the
//     Sandbox, and keeps whatever the operating mode; deleting the Sandbox deletes it;
//   - spec.operatingMode Suspended: the controller deletes the Sandbox's pod (reconcilePod;
//     kubeclip deletes it first, see Suspend), makes no other, and reports the Suspended
//     condition True (PodTerminated) once it is gone;
//   - Running again: the controller makes the pod again from the template, on the same claim.
//
// kubeclip waits on the pod itself, not on the Sandbox's conditions: the pod is what the
// exec-worker reaches, and waiting on it is the same for both backends.

// Warmable: a Sandbox's controller makes its pod from the Sandbox; a warm pod is kubeclip's own.
func (sandboxWorkload) Warmable() bool { return false }

// Reuse: the Sandbox keeps a reusable lease where the cluster serves v1beta1 (operatingMode);
// v1alpha1 (agent-sandbox before v0.5) has none, and a cluster serving no Sandbox API cannot run
// the backend at all.
func (w sandboxWorkload) Reuse() error {
	version, err := w.version()
	if err != nil {
		return err
	}
	return reusable(version)
}

// reusable refuses a reusable lease on a Sandbox API version without operatingMode.
func reusable(version string) error {
	if version == policy.SandboxAPIVersionV1beta1 {
		return nil
	}
	return events.Terminalf(events.CodeBackendUnavailable, "config.backend",
		"backend %q keeps a reusable lease (reuseLease) through agent-sandbox's spec.operatingMode, which this cluster's agent-sandbox (%s) lacks; upgrade agent-sandbox to v0.5 or later, or use backend %q",
		policy.BackendSandboxCR, version, policy.BackendPod)
}

// ClaimName is the claim agent-sandbox's controller makes of the Sandbox's volumeClaimTemplate.
func (sandboxWorkload) ClaimName(name string) string { return policy.SandboxClaimName(name) }

// admitClaim asks the API server, in a dry run, whether it would admit the claim the
// controller is about to make: the Sandbox's controller creates the claim, so the tenant quota's
// or LimitRange's refusal would otherwise leave the Sandbox's pod Pending until its deadline,
// where the pod backend fails the acquire with quota_exceeded (k8s.Meaning) and nothing created.
// A claim already there (a redelivered dispatch, once the controller made it) is not asked
// about: the quota, which admission checks before the name, would count it twice. The dry run
// is not a reservation: a claim of the same company made meanwhile can still take the room.
func (w sandboxWorkload) admitClaim(ctx context.Context, version string, pvc *corev1.PersistentVolumeClaim) error {
	if err := reusable(version); err != nil {
		return err
	}
	claims := w.d.Clientset.CoreV1().PersistentVolumeClaims(pvc.Namespace)
	switch _, err := claims.Get(ctx, pvc.Name, metav1.GetOptions{}); {
	case err == nil:
		return nil
	case !apierrors.IsNotFound(err):
		return fmt.Errorf("reading PersistentVolumeClaim %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	_, err := claims.Create(ctx, pvc, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: k8s.DefaultFieldManager})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("admitting PersistentVolumeClaim %s/%s (dry run): %w", pvc.Namespace, pvc.Name, err)
	}
	return nil
}

// Suspend deletes the Sandbox's pod with opts' grace, sets the Sandbox's operatingMode to
// Suspended, so its controller makes no other, and waits until the pod is gone. The pod goes
// first: the controller deletes a suspended Sandbox's pod with the pod's own grace (2 minutes),
// and a kubelet does not shorten a termination it has begun (measured on the local cluster: a
// pod deleted with 120 s, then with 1 s, went after 119.9 s), so a release cancelling active
// work would wait out its commands. A pod being deleted still exists, so the controller makes
// no other before the Suspended reaches it; one it made in between is deleted by the wait. The
// claim and the Secret stay with the Sandbox. A Sandbox that is gone has nothing to suspend.
func (w sandboxWorkload) Suspend(ctx context.Context, namespace, name string, opts k8s.RunDeleteOptions) error {
	gvr, err := w.reusableGVR()
	if err != nil {
		return err
	}
	if err := k8s.StartPodRunDeletion(ctx, w.d.Clientset, namespace, name, opts); err != nil {
		return err
	}
	if err := w.setMode(ctx, gvr, namespace, name, modeSuspended); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return k8s.DeletePodRun(ctx, w.d.Clientset, namespace, name, opts)
}

// Resume sets the Sandbox's operatingMode back to Running, so its controller makes the pod
// again on the same claim, and waits until the pod is ready (sandboxd serves). A pod that ended
// (its activeDeadlineSeconds, a crash) or is being deleted is waited for until gone first: the
// controller keeps an ended pod and makes a new one only once it is gone. It reports whether it
// woke a suspended Sandbox or replaced its pod. The claim argument is the pod backend's: the
// Sandbox knows its own.
func (w sandboxWorkload) Resume(ctx context.Context, namespace, name, _ string) (Resumed, error) {
	gvr, err := w.reusableGVR()
	if err != nil {
		return Resumed{}, err
	}
	sb, err := w.d.Dynamic.Resource(gvr).Namespace(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		// Its claim went with it (the Sandbox owns it): nothing to resume, acquire afresh.
		return Resumed{}, events.Terminalf(events.CodeLeaseNotFound, "providerLeaseId", "lease %s has no Sandbox any more; acquire a new one", name)
	}
	if err != nil {
		return Resumed{}, fmt.Errorf("reading Sandbox %s/%s: %w", namespace, name, err)
	}
	made := false
	if mode, _, _ := unstructured.NestedString(sb.Object, "spec", "operatingMode"); mode == modeSuspended {
		if err := w.setMode(ctx, gvr, namespace, name, modeRunning); err != nil {
			return Resumed{}, err
		}
		made = true
	}
	pod, err := w.d.Clientset.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return Resumed{}, fmt.Errorf("reading pod %s/%s: %w", namespace, name, err)
	case pod.DeletionTimestamp != nil || podEnded(pod):
		if err := k8s.DeletePodRun(ctx, w.d.Clientset, namespace, name, k8s.RunDeleteOptions{PodGracePeriod: time.Second}); err != nil {
			return Resumed{}, err
		}
		made = true
	}
	ip, err := waitReady(ctx, w.d.Clientset, namespace, name)
	return Resumed{Made: made, PodIP: ip}, err
}

// agent-sandbox's spec.operatingMode values (api/v1beta1 SandboxOperatingMode).
const (
	modeRunning   = "Running"
	modeSuspended = "Suspended"
)

// setMode sets the Sandbox's spec.operatingMode; a Sandbox that is gone is returned as NotFound.
func (w sandboxWorkload) setMode(ctx context.Context, gvr schema.GroupVersionResource, namespace, name, mode string) error {
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{"operatingMode": mode}})
	if err != nil {
		return fmt.Errorf("encoding operatingMode patch: %w", err)
	}
	_, err = w.d.Dynamic.Resource(gvr).Namespace(namespace).Patch(ctx, name, types.MergePatchType, patch,
		metav1.PatchOptions{FieldManager: k8s.DefaultFieldManager})
	if err != nil {
		return fmt.Errorf("setting operatingMode %s on Sandbox %s/%s: %w", mode, namespace, name, err)
	}
	return nil
}

// reusableGVR is the Sandbox resource of a reusable lease: v1beta1, or the refusal.
func (w sandboxWorkload) reusableGVR() (schema.GroupVersionResource, error) {
	version, err := w.version()
	if err != nil {
		return schema.GroupVersionResource{}, err
	}
	return policy.SandboxGVR(version), reusable(version)
}
