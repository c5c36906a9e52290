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

// jobWorkload is backend job: a batch/v1 Job whose controller makes the agent's pod, runs it
// once and ends the run with its conditions.
type jobWorkload struct{ d Deps }

var _ Workload = jobWorkload{}

func (jobWorkload) Backend() policy.Backend { return policy.BackendJob }
func (jobWorkload) Kind() string            { return "Job" }

func (w jobWorkload) Create(ctx context.Context, spec policy.RunSpec, secret *corev1.Secret) (Created, error) {
	if spec.VolumeClaim != nil {
		return Created{}, w.Reuse()
	}
	run, err := k8s.StartJobRun(ctx, w.d.Clientset, secret, policy.RenderJob(spec))
	if err != nil {
		return Created{}, err
	}
	return created(run, w.d.Clientset, "batch/v1", "Job", spec.WorkloadName), nil
}

// Observe: the run's Job (there is one; the informer may not have delivered it yet) and its
// newest pod (no retries, so one, but a deleted pod may linger beside its successor).
func (jobWorkload) Observe(jobs []*batchv1.Job, pods []*corev1.Pod) (*batchv1.Job, *corev1.Pod) {
	if len(jobs) == 0 {
		return nil, newest(pods)
	}
	return jobs[len(jobs)-1], newest(pods)
}

// Delete deletes in the foreground and waits for the Job itself (k8s.DeleteRun): the Job
// controller creates no pod for a Job so marked, so no pod outlives `released`.
func (w jobWorkload) Delete(ctx context.Context, namespace, name string, opts k8s.RunDeleteOptions) error {
	return k8s.DeleteRun(ctx, w.d.Clientset, namespace, name, opts)
}

func (w jobWorkload) Discard(ctx context.Context, namespace, name string, uid types.UID) error {
	err := w.d.Clientset.BatchV1().Jobs(namespace).Delete(ctx, name, discardOptions(uid))
	return discarded(err, uid, "Job", namespace, name)
}

func (w jobWorkload) List(ctx context.Context, pageSize int64, each func(*metav1.PartialObjectMetadata) error) error {
	return listPages(ctx, "Jobs", w.d.Metadata.Resource(batchv1.SchemeGroupVersion.WithResource("jobs")).List, pageSize, each)
}

func (w jobWorkload) Exists(ctx context.Context, namespace, name string) (bool, error) {
	list, err := w.d.Clientset.BatchV1().Jobs(namespace).List(ctx, byName(name))
	if err != nil {
		return false, fmt.Errorf("listing Jobs %s/%s: %w", namespace, name, err)
	}
	return len(list.Items) > 0, nil
}

// Warmable: a warm pod is a bare pod; a Job makes its own.
func (jobWorkload) Warmable() bool { return false }

// Reuse: a reusable lease needs backend pod (reuse.go).
func (w jobWorkload) Reuse() error { return notReusable(w.Backend()) }

// ClaimName: a Job keeps no reusable lease, so no claim.
func (jobWorkload) ClaimName(string) string { return "" }

// Suspend refuses: the backend keeps no reusable lease.
func (w jobWorkload) Suspend(context.Context, string, string, k8s.RunDeleteOptions) error {
	return w.Reuse()
}

// Resume refuses: the backend keeps no reusable lease.
func (w jobWorkload) Resume(context.Context, string, string, string) (Resumed, error) {
	return Resumed{}, w.Reuse()
}
