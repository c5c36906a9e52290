package runwatch

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// renderedRun is a run's Job and pod as the API server returns them: rendered by pkg/policy,
// with managed fields and a running pod's status as a kubelet reports it.
func renderedRun(t *testing.T, backend policy.Backend) (*batchv1.Job, *corev1.Pod) {
	t.Helper()
	spec := policy.RunSpec{
		RunID: "run-1", CompanyID: testCompany, AgentID: "agent-1", AdapterType: "claude_local",
		Namespace: testNamespace, WorkloadName: "pc-run-1", Image: "ghcr.io/paperclipai/agent-runtime-claude:v1",
		Config: policy.DefaultConfig(), SandboxdImage: "kubeclip.local/sandboxd:dev",
	}
	job := policy.RenderJob(spec)
	pod := policy.RenderPod(spec)
	if backend == policy.BackendJob {
		pod = &corev1.Pod{ObjectMeta: *job.Spec.Template.ObjectMeta.DeepCopy(), Spec: *job.Spec.Template.Spec.DeepCopy()}
		pod.Name = job.Name + "-x7k2p"
		pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: "job-uid", Controller: ptrTo(true)}}
	}
	started := metav1.NewTime(now.Add(-time.Minute))
	for _, m := range []*metav1.ObjectMeta{&job.ObjectMeta, &pod.ObjectMeta} {
		m.UID, m.ResourceVersion, m.CreationTimestamp = types.UID("uid-"+m.Name), "4711", started
		m.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubeclip", Operation: metav1.ManagedFieldsOperationApply}}
	}
	job.Status = batchv1.JobStatus{Active: 1, Ready: ptrTo(int32(1)), StartTime: &started}
	pod.Spec.NodeName = "node-1"
	pod.Status = corev1.PodStatus{
		Phase: corev1.PodRunning, PodIP: "10.244.0.7", HostIP: "192.0.2.2", StartTime: &started, QOSClass: corev1.PodQOSBurstable,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: started},
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: started},
		},
	}
	for _, c := range pod.Spec.Containers {
		pod.Status.ContainerStatuses = append(pod.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image + "@sha256:0123", ContainerID: "containerd://0123",
			Ready: true, Started: ptrTo(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: started}},
		})
	}
	return job, pod
}

// TestCacheTrimsWhatTheWatcherDoesNotRead: the informers store Jobs and pods trimmed (no spec
// but the pod's restart policy, no images or managed fields, only the labels naming the run),
// and everything the run-watcher
// reads from them is as on the whole objects: the run they belong to, which pod is newest,
// whether the agent's container started, and the verdict.
func TestCacheTrimsWhatTheWatcherDoesNotRead(t *testing.T) {
	for _, backend := range []policy.Backend{policy.BackendJob, policy.BackendPod} {
		t.Run(string(backend), func(t *testing.T) {
			job, pod := renderedRun(t, backend)
			cj, err := trimCached(job.DeepCopy())
			if err != nil {
				t.Fatal(err)
			}
			cp, err := trimCached(pod.DeepCopy())
			if err != nil {
				t.Fatal(err)
			}
			cachedJob, cachedPod := cj.(*batchv1.Job), cp.(*corev1.Pod)
			if len(cachedPod.Spec.Containers) > 0 || len(cachedPod.Spec.Volumes) > 0 || len(cachedJob.Spec.Template.Spec.Containers) > 0 ||
				len(cachedPod.ManagedFields) > 0 || cachedPod.Status.ContainerStatuses[0].Image != "" {
				t.Errorf("cached objects keep what nobody reads: pod %+v, job spec %+v", cachedPod, cachedJob.Spec)
			}
			if len(cachedPod.Labels) != 2 || len(cachedJob.Labels) != 2 {
				t.Errorf("cached labels: pod %v, Job %v; want the run's two", cachedPod.Labels, cachedJob.Labels)
			}
			t.Logf("pod %d bytes whole, %d trimmed; Job %d, %d", pod.Size(), cachedPod.Size(), job.Size(), cachedJob.Size())

			wl, err := workload.For(backend, workload.Deps{})
			if err != nil {
				t.Fatal(err)
			}
			type view struct {
				Ref             events.RunRef
				Newest, Started bool
				Phase, Reason   string
				End             bool
			}
			see := func(job *batchv1.Job, pod *corev1.Pod) view {
				tr, _ := newDecideTracker(t)
				tr.workload = wl
				j, p := wl.Observe([]*batchv1.Job{job}, []*corev1.Pod{pod})
				ref, _ := runOf(pod)
				d := tr.decide(j, p, nil)
				return view{Ref: ref, Newest: p == pod, Started: containerStarted(pod, agentContainer), Phase: string(d.Phase), Reason: d.Reason, End: d.End != nil}
			}
			whole, trimmed := see(job, pod), see(cachedJob, cachedPod)
			if diff := cmp.Diff(whole, trimmed); diff != "" {
				t.Errorf("the run-watcher sees the trimmed objects differently (-whole +trimmed):\n%s", diff)
			}
			if !whole.Started || whole.Ref.RunID != "run-1" || !whole.Newest {
				t.Errorf("the whole objects read as %+v: the test does not look at a started run", whole)
			}
		})
	}
}
