package runwatch

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

const agentContainer = "agent"

// job builds the run's Job with mods applied.
func job(mods ...func(*batchv1.Job)) *batchv1.Job {
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "pc-x", Namespace: "paperclip-acme"}}
	for _, m := range mods {
		m(j)
	}
	return j
}

func active(j *batchv1.Job) { j.Status.Active = 1 }

// pod builds the run's Job pod (restartPolicy Never) in phase with the agent container in state.
func pod(phase corev1.PodPhase, state corev1.ContainerState, mods ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pc-x-abcde", Namespace: "paperclip-acme"},
		Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: agentContainer}}},
		Status: corev1.PodStatus{
			Phase:             phase,
			ContainerStatuses: []corev1.ContainerStatus{{Name: agentContainer, State: state}},
		},
	}
	for _, m := range mods {
		m(p)
	}
	return p
}

func waiting(reason string) corev1.ContainerState {
	return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}
}

func startedAgo(d time.Duration) func(*corev1.Pod) {
	return func(p *corev1.Pod) { ts := metav1.NewTime(now.Add(-d)); p.Status.StartTime = &ts }
}

// newDecideTracker returns a tracker with only what decide reads; its pokes go to woken.
func newDecideTracker(t *testing.T) (tr *tracker, woken <-chan struct{}) {
	t.Helper()
	d := &deps{opts: Options{
		Now:                clock,
		Container:          agentContainer,
		UnschedulableGrace: 5 * time.Second,
		StartErrorGrace:    10 * time.Second,
	}, log: testLogger(t), cluster: &clusterCache{}}
	wake := make(chan struct{}, 1)
	tr = newTracker(d, "paperclip-acme", events.Ref("acme", "run-1"), func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	})
	tr.workload, _ = workload.For(policy.BackendJob, workload.Deps{})
	t.Cleanup(func() {
		if tr.recheck != nil {
			tr.recheck.Stop()
		}
	})
	return tr, wake
}

// TestTrackerDecideRecheckPokes checks that a verdict waiting out a grace wakes the tracker
// when the grace ends, with no informer event.
func TestTrackerDecideRecheckPokes(t *testing.T) {
	tr, woken := newDecideTracker(t)
	tr.d.opts.StartErrorGrace = 50 * time.Millisecond
	startedNow := pod(corev1.PodPending, waiting("ErrImagePull"), startedAgo(0))
	if d := tr.decide(job(active), startedNow, nil); d.End != nil {
		t.Fatalf("decide() verdict %+v within the grace, want none", d.End)
	}
	select {
	case <-woken:
	case <-time.After(10 * time.Second):
		t.Fatal("the tracker was not poked when the start grace ran out")
	}
}
