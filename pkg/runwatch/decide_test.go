package runwatch

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
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

func jobCondition(typ batchv1.JobConditionType, reason, msg string) func(*batchv1.Job) {
	return func(j *batchv1.Job) {
		j.Status.Conditions = append(j.Status.Conditions, batchv1.JobCondition{Type: typ, Status: corev1.ConditionTrue, Reason: reason, Message: msg})
	}
}

func jobDeleting(j *batchv1.Job) {
	ts := metav1.NewTime(now.Add(-time.Second))
	j.DeletionTimestamp = &ts
}

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

func running() corev1.ContainerState {
	return corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(now.Add(-time.Minute))}}
}

func waiting(reason string) corev1.ContainerState {
	return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}
}

func exited(code int32, reason string) corev1.ContainerState {
	return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: code, Reason: reason, FinishedAt: metav1.NewTime(now.Add(-30 * time.Second)),
	}}
}

func podDeleting(p *corev1.Pod) {
	ts := metav1.NewTime(now.Add(-time.Second))
	grace := int64(0)
	p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &ts, &grace
}

func startedAgo(d time.Duration) func(*corev1.Pod) {
	return func(p *corev1.Pod) { ts := metav1.NewTime(now.Add(-d)); p.Status.StartTime = &ts }
}

func unschedulableFor(d time.Duration) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
			Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonUnschedulable,
			Message: "0/1 nodes are available", LastTransitionTime: metav1.NewTime(now.Add(-d)),
		})
	}
}

func intPtr(i int) *int { return &i }

// decision is what decide returns, in one comparable value.
type decision struct {
	Phase   events.Phase
	Reason  string
	Message string
	Verdict *verdict
}

// newDecideTracker returns a tracker of a Watcher with only what decide reads.
func newDecideTracker(t *testing.T) *tracker {
	t.Helper()
	w := &Watcher{opts: Options{
		Now:                clock,
		Container:          agentContainer,
		UnschedulableGrace: 5 * time.Second,
		StartErrorGrace:    10 * time.Second,
	}, log: testLogger(t)}
	tr := newTracker(w, nil, "paperclip-acme", events.Ref("acme", "run-1"))
	t.Cleanup(func() {
		if tr.recheck != nil {
			tr.recheck.Stop()
		}
	})
	return tr
}

func TestTrackerDecide(t *testing.T) {
	const (
		exit3Msg   = `container "agent" exited with code 3`
		oomMsg     = `container "agent" was killed for exceeding its memory limit`
		releaseMsg = "the Job was deleted before the run finished"
		jobDelMsg  = releaseMsg
	)
	tests := []struct {
		name        string
		job         *batchv1.Job
		pod         *corev1.Pod
		seenJob     bool // the tracker saw the run's Job earlier
		want        decision
		wantRecheck bool
	}{
		{
			name: "Job active, pod not created yet",
			job:  job(active),
			want: decision{Phase: events.PhasePending},
		},
		{
			name: "Job active, pod pending",
			job:  job(active),
			pod:  pod(corev1.PodPending, waiting("ContainerCreating")),
			want: decision{Phase: events.PhasePending},
		},
		{
			name: "pod running",
			job:  job(active),
			pod:  pod(corev1.PodRunning, running()),
			want: decision{Phase: events.PhaseRunning},
		},
		{
			name: "container exited 0 before the Job noticed",
			job:  job(active),
			pod:  pod(corev1.PodRunning, exited(0, "Completed")),
			want: decision{Phase: events.PhaseSucceeded, Reason: k8s.ReasonCompleted,
				Verdict: &verdict{outcome: events.OutcomeSucceeded, reason: k8s.ReasonCompleted, exitCode: intPtr(0)}},
		},
		{
			name: "container exited 3",
			job:  job(active),
			pod:  pod(corev1.PodFailed, exited(3, "Error")),
			want: decision{Phase: events.PhaseFailed, Reason: "Error", Message: exit3Msg,
				Verdict: &verdict{outcome: events.OutcomeFailed, reason: "Error", message: exit3Msg, exitCode: intPtr(3)}},
		},
		{
			name: "container OOMKilled without an exit code",
			job:  job(active),
			pod:  pod(corev1.PodRunning, exited(0, k8s.ReasonOOMKilled)),
			want: decision{Phase: events.PhaseFailed, Reason: k8s.ReasonOOMKilled, Message: oomMsg,
				Verdict: &verdict{outcome: events.OutcomeFailed, reason: k8s.ReasonOOMKilled, message: oomMsg, exitCode: intPtr(137)}},
		},
		{
			name: "Job complete",
			job:  job(jobCondition(batchv1.JobComplete, "", "")),
			pod:  pod(corev1.PodSucceeded, exited(0, "Completed")),
			want: decision{Phase: events.PhaseSucceeded, Reason: k8s.ReasonCompleted,
				Verdict: &verdict{outcome: events.OutcomeSucceeded, reason: k8s.ReasonCompleted, exitCode: intPtr(0)}},
		},
		{
			name: "Job failed: the pod says why",
			job:  job(jobCondition(batchv1.JobFailed, "BackoffLimitExceeded", "Job has reached the specified backoff limit")),
			pod:  pod(corev1.PodFailed, exited(3, "Error")),
			want: decision{Phase: events.PhaseFailed, Reason: "Error", Message: exit3Msg,
				Verdict: &verdict{outcome: events.OutcomeFailed, reason: "Error", message: exit3Msg, exitCode: intPtr(3)}},
		},
		{
			name: "Job deadline exceeded while its pod is deleted",
			job:  job(jobCondition(batchv1.JobFailed, batchv1.JobReasonDeadlineExceeded, "Job was active longer than specified deadline")),
			pod:  pod(corev1.PodRunning, running(), podDeleting),
			want: decision{Phase: events.PhaseFailed, Reason: batchv1.JobReasonDeadlineExceeded, Message: "Job was active longer than specified deadline",
				Verdict: &verdict{outcome: events.OutcomeTimedOut, reason: batchv1.JobReasonDeadlineExceeded, message: "Job was active longer than specified deadline"}},
		},
		{
			name: "Job deadline exceeded (interim condition) with the pod gone",
			job:  job(jobCondition(batchv1.JobFailureTarget, batchv1.JobReasonDeadlineExceeded, "deadline")),
			want: decision{Phase: events.PhaseFailed, Reason: batchv1.JobReasonDeadlineExceeded, Message: "deadline",
				Verdict: &verdict{outcome: events.OutcomeTimedOut, reason: batchv1.JobReasonDeadlineExceeded, message: "deadline"}},
		},
		{
			name: "pod being deleted, Job not terminal yet: wait for the Job",
			job:  job(active),
			pod:  pod(corev1.PodRunning, running(), podDeleting),
			want: decision{Phase: events.PhaseFailed, Reason: k8s.ReasonPodDeleted, Message: "the pod was deleted before the run finished"},
		},
		{
			name:    "Job deleted after it was seen, pod still running",
			pod:     pod(corev1.PodRunning, running()),
			seenJob: true,
			want: decision{Phase: events.PhaseFailed, Reason: k8s.ReasonJobDeleted, Message: jobDelMsg,
				Verdict: &verdict{outcome: events.OutcomeCancelled, reason: k8s.ReasonJobDeleted, message: releaseMsg}},
		},
		{
			name:    "Job deleted after it was seen, pod gone",
			seenJob: true,
			want: decision{Phase: events.PhaseFailed, Reason: k8s.ReasonJobDeleted, Message: jobDelMsg,
				Verdict: &verdict{outcome: events.OutcomeCancelled, reason: k8s.ReasonJobDeleted, message: releaseMsg}},
		},
		{
			name: "Job being deleted, pod running",
			job:  job(active, jobDeleting),
			pod:  pod(corev1.PodRunning, running()),
			want: decision{Phase: events.PhaseFailed, Reason: k8s.ReasonJobDeleted, Message: jobDelMsg,
				Verdict: &verdict{outcome: events.OutcomeCancelled, reason: k8s.ReasonJobDeleted, message: releaseMsg}},
		},
		{
			name: "Job being deleted, pod being killed: keep its exit code",
			job:  job(active, jobDeleting),
			pod:  pod(corev1.PodRunning, exited(143, "Error"), podDeleting),
			want: decision{Phase: events.PhaseFailed, Reason: k8s.ReasonJobDeleted, Message: jobDelMsg,
				Verdict: &verdict{outcome: events.OutcomeCancelled, reason: k8s.ReasonJobDeleted, message: releaseMsg, exitCode: intPtr(143)}},
		},
		{
			name: "Job deleted just after the container failed on its own",
			pod:  pod(corev1.PodFailed, exited(3, "Error")),
			want: decision{Phase: events.PhaseFailed, Reason: "Error", Message: exit3Msg,
				Verdict: &verdict{outcome: events.OutcomeFailed, reason: "Error", message: exit3Msg, exitCode: intPtr(3)}},
		},
		{
			name: "ErrImageNeverPull fails at once",
			job:  job(active),
			pod:  pod(corev1.PodPending, waiting("ErrImageNeverPull"), startedAgo(0)),
			want: decision{Phase: events.PhaseFailed, Reason: "ErrImageNeverPull", Message: `container "agent": ErrImageNeverPull`,
				Verdict: &verdict{outcome: events.OutcomeFailed, reason: "ErrImageNeverPull", message: `container "agent": ErrImageNeverPull`}},
		},
		{
			name:        "ImagePullBackOff within the start grace",
			job:         job(active),
			pod:         pod(corev1.PodPending, waiting("ImagePullBackOff"), startedAgo(3*time.Second)),
			want:        decision{Phase: events.PhasePending, Reason: "ImagePullBackOff", Message: `container "agent": ImagePullBackOff`},
			wantRecheck: true,
		},
		{
			name: "ImagePullBackOff past the start grace",
			job:  job(active),
			pod:  pod(corev1.PodPending, waiting("ImagePullBackOff"), startedAgo(10*time.Second)),
			want: decision{Phase: events.PhaseFailed, Reason: "ImagePullBackOff", Message: `container "agent": ImagePullBackOff`,
				Verdict: &verdict{outcome: events.OutcomeFailed, reason: "ImagePullBackOff", message: `container "agent": ImagePullBackOff`}},
		},
		{
			name:        "unschedulable within its grace",
			job:         job(active),
			pod:         pod(corev1.PodPending, corev1.ContainerState{}, unschedulableFor(time.Second)),
			want:        decision{Phase: events.PhasePending, Reason: k8s.ReasonUnschedulable, Message: "0/1 nodes are available"},
			wantRecheck: true,
		},
		{
			name: "unschedulable past its grace",
			job:  job(active),
			pod:  pod(corev1.PodPending, corev1.ContainerState{}, unschedulableFor(time.Minute)),
			want: decision{Phase: events.PhaseFailed, Reason: k8s.ReasonUnschedulable, Message: "0/1 nodes are available",
				Verdict: &verdict{outcome: events.OutcomeFailed, reason: k8s.ReasonUnschedulable, message: "0/1 nodes are available"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := newDecideTracker(t)
			tr.seenJob = tc.seenJob
			phase, reason, message, v := tr.decide(tc.job, tc.pod)
			got := decision{Phase: phase, Reason: reason, Message: message, Verdict: v}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(verdict{})); diff != "" {
				t.Errorf("decide() (-want +got):\n%s", diff)
			}
			if gotRecheck := tr.recheck != nil; gotRecheck != tc.wantRecheck {
				t.Errorf("recheck timer set = %v, want %v", gotRecheck, tc.wantRecheck)
			}
		})
	}
}

// TestTrackerDecideRecheckPokes checks that a verdict waiting out a grace wakes the tracker
// when the grace ends, with no informer event.
func TestTrackerDecideRecheckPokes(t *testing.T) {
	tr := newDecideTracker(t)
	tr.w.opts.StartErrorGrace = 50 * time.Millisecond
	startedNow := pod(corev1.PodPending, waiting("ErrImagePull"), startedAgo(0))
	if _, _, _, v := tr.decide(job(active), startedNow); v != nil {
		t.Fatalf("decide() verdict %+v within the grace, want none", v)
	}
	select {
	case <-tr.wakeCh:
	case <-time.After(10 * time.Second):
		t.Fatal("the tracker was not poked when the start grace ran out")
	}
}
