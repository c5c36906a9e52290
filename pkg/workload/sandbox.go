package workload

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// sandboxWorkload is backend sandbox-cr: agent-sandbox's Sandbox, whose controller makes the
// pod (named after the Sandbox, owned by it) from the exec pod template, and deletes the
// Sandbox at its spec.shutdownTime even when kubeclip is gone.
type sandboxWorkload struct{ d Deps }

var _ Workload = sandboxWorkload{}

func (sandboxWorkload) Backend() policy.Backend { return policy.BackendSandboxCR }
func (sandboxWorkload) Kind() string            { return policy.SandboxKind }

func (w sandboxWorkload) Create(ctx context.Context, spec policy.RunSpec, secret *corev1.Secret) (Created, error) {
	if spec.VolumeClaim != "" {
		return Created{}, w.Reuse()
	}
	version, err := w.version()
	if err != nil {
		return Created{}, err
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
func (w sandboxWorkload) List(ctx context.Context) ([]metav1.Object, error) {
	version, served, err := w.served()
	if err != nil || !served {
		return nil, err
	}
	list, err := w.d.Dynamic.Resource(policy.SandboxGVR(version)).Namespace(metav1.NamespaceAll).List(ctx, managed)
	if err != nil {
		return nil, fmt.Errorf("listing Sandboxes: %w", err)
	}
	objs := make([]metav1.Object, len(list.Items))
	for i := range list.Items {
		objs[i] = &list.Items[i]
	}
	return objs, nil
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

// Reuse: a reusable lease needs backend pod (reuse.go).
func (w sandboxWorkload) Reuse() error { return notReusable(w.Backend()) }

// Suspend refuses: the backend keeps no reusable lease.
func (w sandboxWorkload) Suspend(context.Context, string, string, k8s.RunDeleteOptions) error {
	return w.Reuse()
}

// Resume refuses: the backend keeps no reusable lease.
func (w sandboxWorkload) Resume(context.Context, string, string, string) (bool, error) {
	return false, w.Reuse()
}
