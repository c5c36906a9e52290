package verdict

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// decideOptions are the run-watcher's defaults.
var decideOptions = Options{Container: agent, Now: now, UnschedulableGrace: 5 * time.Second, StartErrorGrace: 10 * time.Second}

// runJob builds the run's Job with mods applied.
func runJob(mods ...func(*batchv1.Job)) *batchv1.Job {
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

// runPod builds the run's Job pod (restartPolicy Never) in phase with the agent container in state.
func runPod(phase corev1.PodPhase, state corev1.ContainerState, mods ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pc-x-abcde", Namespace: "paperclip-acme"},
		Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: agent}}},
		Status: corev1.PodStatus{
			Phase:             phase,
			ContainerStatuses: []corev1.ContainerStatus{{Name: agent, State: state}},
		},
	}
	for _, m := range mods {
		m(p)
	}
	return p
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

// decision is what Decide returns, in one comparable value.
type decision struct {
	Phase   events.Phase
	Reason  string
	Message string
	Verdict *End
}

// TestDecide is the verdict on a run's Job and pod, with what the run-watcher saw before.
func TestDecide(t *testing.T) {
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
		seenJob     bool // the run-watcher saw the run's Job earlier
		want        decision
		wantRecheck bool
	}{
		{
			name: "Job active, pod not created yet",
			job:  runJob(active),
			want: decision{Phase: events.PhasePending},
		},
		{
			name: "Job active, pod pending",
			job:  runJob(active),
			pod:  runPod(corev1.PodPending, waiting("ContainerCreating", "")),
			want: decision{Phase: events.PhasePending},
		},
		{
			name: "pod running",
			job:  runJob(active),
			pod:  runPod(corev1.PodRunning, running()),
			want: decision{Phase: events.PhaseRunning},
		},
		{
			name: "container exited 0 before the Job noticed",
			job:  runJob(active),
			pod:  runPod(corev1.PodRunning, exited(0, "Completed", now.Add(-30*time.Second))),
			want: decision{Phase: events.PhaseSucceeded, Reason: events.ReasonCompleted,
				Verdict: &End{Outcome: events.OutcomeSucceeded, Reason: events.ReasonCompleted, ExitCode: intPtr(0)}},
		},
		{
			name: "container exited 3",
			job:  runJob(active),
			pod:  runPod(corev1.PodFailed, exited(3, "Error", now.Add(-30*time.Second))),
			want: decision{Phase: events.PhaseFailed, Reason: "Error", Message: exit3Msg,
				Verdict: &End{Outcome: events.OutcomeFailed, Reason: "Error", Message: exit3Msg, ExitCode: intPtr(3)}},
		},
		{
			name: "container OOMKilled without an exit code",
			job:  runJob(active),
			pod:  runPod(corev1.PodRunning, exited(0, events.ReasonOOMKilled, now.Add(-30*time.Second))),
			want: decision{Phase: events.PhaseFailed, Reason: events.ReasonOOMKilled, Message: oomMsg,
				Verdict: &End{Outcome: events.OutcomeFailed, Reason: events.ReasonOOMKilled, Message: oomMsg, ExitCode: intPtr(137)}},
		},
		{
			name: "Job complete",
			job:  runJob(jobCondition(batchv1.JobComplete, "", "")),
			pod:  runPod(corev1.PodSucceeded, exited(0, "Completed", now.Add(-30*time.Second))),
			want: decision{Phase: events.PhaseSucceeded, Reason: events.ReasonCompleted,
				Verdict: &End{Outcome: events.OutcomeSucceeded, Reason: events.ReasonCompleted, ExitCode: intPtr(0)}},
		},
		{
			name: "Job failed: the pod says why",
			job:  runJob(jobCondition(batchv1.JobFailed, "BackoffLimitExceeded", "Job has reached the specified backoff limit")),
			pod:  runPod(corev1.PodFailed, exited(3, "Error", now.Add(-30*time.Second))),
			want: decision{Phase: events.PhaseFailed, Reason: "Error", Message: exit3Msg,
				Verdict: &End{Outcome: events.OutcomeFailed, Reason: "Error", Message: exit3Msg, ExitCode: intPtr(3)}},
		},
		{
			name: "Job deadline exceeded while its pod is deleted",
			job:  runJob(jobCondition(batchv1.JobFailed, batchv1.JobReasonDeadlineExceeded, "Job was active longer than specified deadline")),
			pod:  runPod(corev1.PodRunning, running(), podDeleting),
			want: decision{Phase: events.PhaseFailed, Reason: batchv1.JobReasonDeadlineExceeded, Message: "Job was active longer than specified deadline",
				Verdict: &End{Outcome: events.OutcomeTimedOut, Reason: batchv1.JobReasonDeadlineExceeded, Message: "Job was active longer than specified deadline"}},
		},
		{
			name: "Job deadline exceeded (interim condition) with the pod gone",
			job:  runJob(jobCondition(batchv1.JobFailureTarget, batchv1.JobReasonDeadlineExceeded, "deadline")),
			want: decision{Phase: events.PhaseFailed, Reason: batchv1.JobReasonDeadlineExceeded, Message: "deadline",
				Verdict: &End{Outcome: events.OutcomeTimedOut, Reason: batchv1.JobReasonDeadlineExceeded, Message: "deadline"}},
		},
		{
			name: "pod being deleted, Job not terminal yet: wait for the Job",
			job:  runJob(active),
			pod:  runPod(corev1.PodRunning, running(), podDeleting),
			want: decision{Phase: events.PhaseFailed, Reason: events.ReasonPodDeleted, Message: "the pod was deleted before the run finished"},
		},
		{
			name:    "Job deleted after it was seen, pod still running",
			pod:     runPod(corev1.PodRunning, running()),
			seenJob: true,
			want: decision{Phase: events.PhaseFailed, Reason: events.ReasonJobDeleted, Message: jobDelMsg,
				Verdict: &End{Outcome: events.OutcomeCancelled, Reason: events.ReasonJobDeleted, Message: releaseMsg}},
		},
		{
			name:    "Job deleted after it was seen, pod gone",
			seenJob: true,
			want: decision{Phase: events.PhaseFailed, Reason: events.ReasonJobDeleted, Message: jobDelMsg,
				Verdict: &End{Outcome: events.OutcomeCancelled, Reason: events.ReasonJobDeleted, Message: releaseMsg}},
		},
		{
			name: "Job being deleted, pod running",
			job:  runJob(active, jobDeleting),
			pod:  runPod(corev1.PodRunning, running()),
			want: decision{Phase: events.PhaseFailed, Reason: events.ReasonJobDeleted, Message: jobDelMsg,
				Verdict: &End{Outcome: events.OutcomeCancelled, Reason: events.ReasonJobDeleted, Message: releaseMsg}},
		},
		{
			name: "Job being deleted, pod being killed: keep its exit code",
			job:  runJob(active, jobDeleting),
			pod:  runPod(corev1.PodRunning, exited(143, "Error", now.Add(-30*time.Second)), podDeleting),
			want: decision{Phase: events.PhaseFailed, Reason: events.ReasonJobDeleted, Message: jobDelMsg,
				Verdict: &End{Outcome: events.OutcomeCancelled, Reason: events.ReasonJobDeleted, Message: releaseMsg, ExitCode: intPtr(143)}},
		},
		{
			name: "Job deleted just after the container failed on its own",
			pod:  runPod(corev1.PodFailed, exited(3, "Error", now.Add(-30*time.Second))),
			want: decision{Phase: events.PhaseFailed, Reason: "Error", Message: exit3Msg,
				Verdict: &End{Outcome: events.OutcomeFailed, Reason: "Error", Message: exit3Msg, ExitCode: intPtr(3)}},
		},
		{
			name: "ErrImageNeverPull fails at once",
			job:  runJob(active),
			pod:  runPod(corev1.PodPending, waiting("ErrImageNeverPull", ""), startedAgo(0)),
			want: decision{Phase: events.PhaseFailed, Reason: "ErrImageNeverPull", Message: `container "agent": ErrImageNeverPull`,
				Verdict: &End{Outcome: events.OutcomeFailed, Reason: "ErrImageNeverPull", Message: `container "agent": ErrImageNeverPull`}},
		},
		{
			name:        "ImagePullBackOff within the start grace",
			job:         runJob(active),
			pod:         runPod(corev1.PodPending, waiting("ImagePullBackOff", ""), startedAgo(3*time.Second)),
			want:        decision{Phase: events.PhasePending, Reason: "ImagePullBackOff", Message: `container "agent": ImagePullBackOff`},
			wantRecheck: true,
		},
		{
			name: "ImagePullBackOff past the start grace",
			job:  runJob(active),
			pod:  runPod(corev1.PodPending, waiting("ImagePullBackOff", ""), startedAgo(10*time.Second)),
			want: decision{Phase: events.PhaseFailed, Reason: "ImagePullBackOff", Message: `container "agent": ImagePullBackOff`,
				Verdict: &End{Outcome: events.OutcomeFailed, Reason: "ImagePullBackOff", Message: `container "agent": ImagePullBackOff`}},
		},
		{
			name:        "unschedulable within its grace",
			job:         runJob(active),
			pod:         runPod(corev1.PodPending, corev1.ContainerState{}, unschedulableFor(time.Second)),
			want:        decision{Phase: events.PhasePending, Reason: events.ReasonUnschedulable, Message: "0/1 nodes are available"},
			wantRecheck: true,
		},
		{
			name: "unschedulable past its grace",
			job:  runJob(active),
			pod:  runPod(corev1.PodPending, corev1.ContainerState{}, unschedulableFor(time.Minute)),
			want: decision{Phase: events.PhaseFailed, Reason: events.ReasonUnschedulable, Message: "0/1 nodes are available",
				Verdict: &End{Outcome: events.OutcomeFailed, Reason: events.ReasonUnschedulable, Message: "0/1 nodes are available"}},
		},
	}
	for _, tc := range tests {
		forms(t, tc.name, tc.job, tc.pod, func(t *testing.T, job *batchv1.Job, pod *corev1.Pod) {
			d := Decide(Input{Job: job, Pod: pod, SeenJob: tc.seenJob}, decideOptions)
			got := decision{Phase: d.Phase, Reason: d.Reason, Message: d.Message, Verdict: d.End}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Decide() (-want +got):\n%s", diff)
			}
			if gotRecheck := d.RecheckAfter > 0; gotRecheck != tc.wantRecheck {
				t.Errorf("recheck after %v, want a recheck: %v", d.RecheckAfter, tc.wantRecheck)
			}
		})
	}
}

// execPod builds an exec-capable lease's pod (sandboxd in the agent container, no Job).
func execPod(phase corev1.PodPhase, state corev1.ContainerState, mods ...func(*corev1.Pod)) *corev1.Pod {
	p := runPod(phase, state, func(p *corev1.Pod) {
		p.Name = "pc-x"
		p.Status.PodIP = "10.0.0.7"
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	})
	for _, m := range mods {
		m(p)
	}
	return p
}

// TestDecideRelease is the verdict on an exec-capable lease's run: a release (or destroy) ends
// it as released, with the agent exec's exit code and account, once its pod is gone; a release
// that cut the agent's exec short cancelled it; a pod deleted under a live lease failed it.
func TestDecideRelease(t *testing.T) {
	const (
		deletedMsg   = "the pod was deleted before the run finished"
		releasingMsg = "the lease is being released: its pod ends once its commands finish"
	)
	cost := 0.25
	account := &events.AgentResult{SessionID: "5bcc4856", Model: "claude-stub", Usage: &events.AgentUsage{InputTokens: 10, OutputTokens: 20}, CostUSD: &cost, Summary: "done"}
	finished := &AgentExec{ExecID: "01X", Exit: &events.ExecExit{ExitCode: intPtr(0)}, Agent: account}
	killed := &AgentExec{ExecID: "01X", Exit: &events.ExecExit{Signal: ptr("SIGKILL")}, Agent: &events.AgentResult{IsError: true}}
	unfinished := &AgentExec{ExecID: "01X"}
	released := func(x *AgentExec) *Release { return &Release{AgentExec: x} }

	tests := []struct {
		name    string
		job     *batchv1.Job
		pod     *corev1.Pod
		seenPod bool
		release *Release
		want    decision
	}{
		{
			name: "live lease, pod ready",
			pod:  execPod(corev1.PodRunning, running()),
			want: decision{Phase: events.PhaseRunning, Reason: events.ReasonReady},
		},
		{
			name: "live lease, pod deleted: a failure, not a cancellation",
			pod:  execPod(corev1.PodRunning, running(), podDeleting),
			want: decision{Phase: events.PhaseFailed, Reason: events.ReasonPodDeleted, Message: deletedMsg,
				Verdict: &End{Outcome: events.OutcomeFailed, Reason: events.ReasonPodDeleted, Message: deletedMsg}},
		},
		{
			name:    "live lease, pod vanished (deleted with no grace period)",
			seenPod: true,
			want: decision{Phase: events.PhaseFailed, Reason: events.ReasonPodDeleted, Message: deletedMsg,
				Verdict: &End{Outcome: events.OutcomeFailed, Reason: events.ReasonPodDeleted, Message: deletedMsg}},
		},
		{
			name:    "released, pod still running its commands",
			pod:     execPod(corev1.PodRunning, running(), podDeleting),
			release: released(finished),
			want:    decision{Phase: events.PhaseRunning, Reason: events.ReasonReleasing, Message: releasingMsg},
		},
		{
			name:    "released with cancelActiveWork, pod still running",
			pod:     execPod(corev1.PodRunning, running(), podDeleting),
			release: &Release{CancelActiveWork: true, AgentExec: unfinished},
			want: decision{Phase: events.PhaseRunning, Reason: events.ReasonReleasing,
				Message: "the lease is being released: its running commands are cancelled"},
		},
		{
			name:    "released after the agent's exec, pod gone",
			release: released(finished),
			want: decision{Phase: events.PhaseSucceeded, Reason: events.ReasonReleased, Message: "the lease was released",
				Verdict: &End{Outcome: events.OutcomeReleased, Reason: events.ReasonReleased, Message: "the lease was released", ExitCode: intPtr(0), Agent: account}},
		},
		{
			name:    "released after the agent's exec, sandboxd drained and exited",
			pod:     execPod(corev1.PodSucceeded, exited(0, "Completed", now), podDeleting),
			release: released(finished),
			want: decision{Phase: events.PhaseSucceeded, Reason: events.ReasonReleased, Message: "the lease was released",
				Verdict: &End{Outcome: events.OutcomeReleased, Reason: events.ReasonReleased, Message: "the lease was released", ExitCode: intPtr(0), Agent: account}},
		},
		{
			name:    "released with nothing recorded",
			pod:     execPod(corev1.PodFailed, exited(143, "Error", now), podDeleting),
			release: released(nil),
			want: decision{Phase: events.PhaseSucceeded, Reason: events.ReasonReleased, Message: "the lease was released",
				Verdict: &End{Outcome: events.OutcomeReleased, Reason: events.ReasonReleased, Message: "the lease was released"}},
		},
		{
			name:    "destroyed after the agent's exec",
			release: &Release{Destroy: true, AgentExec: finished},
			want: decision{Phase: events.PhaseSucceeded, Reason: events.ReasonReleased, Message: "the lease was destroyed",
				Verdict: &End{Outcome: events.OutcomeReleased, Reason: events.ReasonReleased, Message: "the lease was destroyed", ExitCode: intPtr(0), Agent: account}},
		},
		{
			name:    "released while the agent's exec ran: its pod went under it",
			release: &Release{Destroy: true, AgentExec: unfinished},
			want: decision{Phase: events.PhaseFailed, Reason: events.ReasonCommandCancelled, Message: "the lease was destroyed while its agent's command (exec 01X) ran",
				Verdict: &End{Outcome: events.OutcomeCancelled, Reason: events.ReasonCommandCancelled, Message: "the lease was destroyed while its agent's command (exec 01X) ran"}},
		},
		{
			name:    "released with cancelActiveWork, the agent's exec killed",
			release: &Release{CancelActiveWork: true, AgentExec: killed},
			want: decision{Phase: events.PhaseFailed, Reason: events.ReasonCommandCancelled, Message: "the lease was released while its agent's command (exec 01X) ran",
				Verdict: &End{Outcome: events.OutcomeCancelled, Reason: events.ReasonCommandCancelled, Message: "the lease was released while its agent's command (exec 01X) ran", Agent: killed.Agent}},
		},
		{
			name:    "released without cancelActiveWork after its client killed the agent: released",
			release: released(killed),
			want: decision{Phase: events.PhaseSucceeded, Reason: events.ReasonReleased, Message: "the lease was released",
				Verdict: &End{Outcome: events.OutcomeReleased, Reason: events.ReasonReleased, Message: "the lease was released", Agent: killed.Agent}},
		},
		{
			name:    "pod OOMKilled before the release reached it keeps its failure",
			pod:     execPod(corev1.PodFailed, exited(137, events.ReasonOOMKilled, now.Add(-time.Minute))),
			release: released(unfinished),
			want: decision{Phase: events.PhaseFailed, Reason: events.ReasonOOMKilled, Message: `container "agent" was killed for exceeding its memory limit`,
				Verdict: &End{Outcome: events.OutcomeFailed, Reason: events.ReasonOOMKilled, Message: `container "agent" was killed for exceeding its memory limit`, ExitCode: intPtr(137)}},
		},
		{
			name:    "activity deadline before the release keeps its timeout",
			pod:     execPod(corev1.PodFailed, exited(137, "Error", now.Add(-time.Minute)), withPodReason(events.ReasonDeadlineExceeded, "Pod was active on the node longer than the specified deadline")),
			release: released(finished),
			want: decision{Phase: events.PhaseFailed, Reason: events.ReasonDeadlineExceeded, Message: "Pod was active on the node longer than the specified deadline",
				Verdict: &End{Outcome: events.OutcomeTimedOut, Reason: events.ReasonDeadlineExceeded, Message: "Pod was active on the node longer than the specified deadline", ExitCode: intPtr(137)}},
		},
		{
			name:    "a Job's run ignores a release: its Job decides",
			job:     runJob(active, jobDeleting),
			release: released(finished),
			want:    decision{Phase: events.PhaseFailed, Reason: events.ReasonJobDeleted, Message: "the Job was deleted before the run finished", Verdict: &End{Outcome: events.OutcomeCancelled, Reason: events.ReasonJobDeleted, Message: "the Job was deleted before the run finished"}},
		},
	}
	for _, tc := range tests {
		forms(t, tc.name, tc.job, tc.pod, func(t *testing.T, job *batchv1.Job, pod *corev1.Pod) {
			d := Decide(Input{Job: job, Pod: pod, SeenPod: tc.seenPod, ExecCapable: job == nil, Release: tc.release}, decideOptions)
			got := decision{Phase: d.Phase, Reason: d.Reason, Message: d.Message, Verdict: d.End}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Decide() (-want +got):\n%s", diff)
			}
		})
	}
}
