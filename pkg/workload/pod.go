package workload

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// podWorkload is backend pod: kubeclip's own exec-capable lease, a bare Pod named after the
// workload whose main process is sandboxd. Nothing owns it: the lease record does.
type podWorkload struct{ d Deps }

var _ Workload = podWorkload{}

func (podWorkload) Backend() policy.Backend { return policy.BackendPod }
func (podWorkload) Kind() string            { return "Pod" }

// ClaimName is kubeclip's own name for the pod backend's claim, which Create creates.
func (podWorkload) ClaimName(name string) string { return policy.LeaseClaimName(name) }

func (w podWorkload) Create(ctx context.Context, spec policy.RunSpec, secret *corev1.Secret) (Created, error) {
	pod := policy.RenderPod(spec)
	if spec.VolumeClaim != nil {
		if err := CreateClaim(ctx, w.d.Clientset, spec.VolumeClaim); err != nil {
			return Created{}, err
		}
		return w.createOnClaim(ctx, spec, secret, pod)
	}
	run, err := k8s.StartPodRun(ctx, w.d.Clientset, secret, pod)
	if err != nil {
		return Created{}, err
	}
	return created(run, w.d.Clientset, "v1", "Pod", spec.WorkloadName), nil
}

// Observe: the pod is the workload; there is no Job.
func (podWorkload) Observe(_ []*batchv1.Job, pods []*corev1.Pod) (*batchv1.Job, *corev1.Pod) {
	return nil, newest(pods)
}

func (w podWorkload) Delete(ctx context.Context, namespace, name string, opts k8s.RunDeleteOptions) error {
	return k8s.DeletePodRun(ctx, w.d.Clientset, namespace, name, opts)
}

func (w podWorkload) Discard(ctx context.Context, namespace, name string, uid types.UID) error {
	err := w.d.Clientset.CoreV1().Pods(namespace).Delete(ctx, name, discardOptions(uid))
	return discarded(err, uid, "Pod", namespace, name)
}

// List hands on the bare pods only: a Job's or a Sandbox's pod is its owner's, listed with it.
func (w podWorkload) List(ctx context.Context, pageSize int64, each func(*metav1.PartialObjectMetadata) error) error {
	pods := w.d.Metadata.Resource(corev1.SchemeGroupVersion.WithResource("pods"))
	return listPages(ctx, "Pods", pods.List, pageSize, func(obj *metav1.PartialObjectMetadata) error {
		if metav1.GetControllerOf(obj) != nil {
			return nil
		}
		return each(obj)
	})
}

func (w podWorkload) Exists(ctx context.Context, namespace, name string) (bool, error) {
	list, err := w.d.Clientset.CoreV1().Pods(namespace).List(ctx, byName(name))
	if err != nil {
		return false, fmt.Errorf("listing Pods %s/%s: %w", namespace, name, err)
	}
	return len(list.Items) > 0, nil
}
