package k8s

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const agent = "agent"

var now = time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)

// podWith builds a Job-style pod (restartPolicy Never) in phase, with the agent container in
// state, then applies mods.
func podWith(phase corev1.PodPhase, state corev1.ContainerState, mods ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pc-x", Namespace: "t-x"},
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

func running() corev1.ContainerState {
	return corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(now.Add(-time.Minute))}}
}

func waiting(reason, msg string) corev1.ContainerState {
	return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}
}

func exited(code int32, reason string, finished time.Time) corev1.ContainerState {
	return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, FinishedAt: metav1.NewTime(finished)}}
}

func withPodReason(reason, msg string) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Status.Reason, p.Status.Message = reason, msg }
}

func withCondition(t corev1.PodConditionType, s corev1.ConditionStatus, reason, msg string, since time.Time) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Status.Conditions = append(p.Status.Conditions, corev1.PodCondition{
			Type: t, Status: s, Reason: reason, Message: msg, LastTransitionTime: metav1.NewTime(since),
		})
	}
}

// deletedAt marks the pod deleted at requested with a grace period of grace seconds.
func deletedAt(requested time.Time, grace int64) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		ts := metav1.NewTime(requested.Add(time.Duration(grace) * time.Second))
		p.DeletionTimestamp, p.DeletionGracePeriodSeconds = &ts, &grace
	}
}

func withInit(state corev1.ContainerState) func(*corev1.Pod) {
	return func(p *corev1.Pod) {
		p.Status.InitContainerStatuses = append(p.Status.InitContainerStatuses, corev1.ContainerStatus{Name: "setup", State: state})
	}
}

func withStartTime(ts time.Time) func(*corev1.Pod) {
	return func(p *corev1.Pod) { t := metav1.NewTime(ts); p.Status.StartTime = &t }
}

func withRestartPolicy(rp corev1.RestartPolicy) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.RestartPolicy = rp }
}

func TestClassifyPod(t *testing.T) {
	earlier := now.Add(-10 * time.Second)
	tests := []struct {
		name string
		pod  *corev1.Pod
		opts ClassifyOptions
		want PodVerdict
	}{
		{name: "nil pod", pod: nil, want: PodVerdict{Phase: PhasePending}},
		{
			name: "pending, no container status yet",
			pod:  podWith(corev1.PodPending, corev1.ContainerState{}, func(p *corev1.Pod) { p.Status.ContainerStatuses = nil }),
			want: PodVerdict{Phase: PhasePending},
		},
		{
			name: "pending, container creating",
			pod:  podWith(corev1.PodPending, waiting("ContainerCreating", "")),
			want: PodVerdict{Phase: PhasePending},
		},
		{name: "running", pod: podWith(corev1.PodRunning, running()), want: PodVerdict{Phase: PhaseRunning}},
		{
			name: "succeeded",
			pod:  podWith(corev1.PodSucceeded, exited(0, "Completed", earlier)),
			want: PodVerdict{Phase: PhaseSucceeded, Terminal: true, Outcome: OutcomeSucceeded, Reason: "Completed", ExitCode: ptr[int32](0)},
		},
		{
			name: "exit 0 seen before the pod phase catches up",
			pod:  podWith(corev1.PodRunning, exited(0, "Completed", earlier)),
			want: PodVerdict{Phase: PhaseSucceeded, Terminal: true, Outcome: OutcomeSucceeded, Reason: "Completed", ExitCode: ptr[int32](0)},
		},
		{
			name: "failed with exit code",
			pod:  podWith(corev1.PodFailed, exited(3, "Error", earlier)),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "Error",
				Message: `container "agent" exited with code 3`, ExitCode: ptr[int32](3)},
		},
		{
			name: "non-zero exit seen before the pod phase catches up",
			pod:  podWith(corev1.PodRunning, exited(1, "", earlier)),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "Error",
				Message: `container "agent" exited with code 1`, ExitCode: ptr[int32](1)},
		},
		{
			name: "termination message is kept",
			pod: podWith(corev1.PodFailed, exited(2, "Error", earlier), func(p *corev1.Pod) {
				p.Status.ContainerStatuses[0].State.Terminated.Message = "bad flag"
			}),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "Error",
				Message: `container "agent" exited with code 2: bad flag`, ExitCode: ptr[int32](2)},
		},
		{
			name: "terminated container that will be restarted is not terminal",
			pod:  podWith(corev1.PodRunning, exited(1, "Error", earlier), withRestartPolicy(corev1.RestartPolicyOnFailure)),
			want: PodVerdict{Phase: PhaseRunning},
		},
		{
			name: "OOMKilled",
			pod:  podWith(corev1.PodFailed, exited(137, "OOMKilled", earlier)),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "OOMKilled",
				Message: `container "agent" was killed for exceeding its memory limit`, ExitCode: ptr[int32](137)},
		},
		{
			name: "OOMKilled without an exit code reports 137",
			pod:  podWith(corev1.PodRunning, exited(0, "OOMKilled", earlier)),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "OOMKilled",
				Message: `container "agent" was killed for exceeding its memory limit`, ExitCode: ptr[int32](137)},
		},
		{
			name: "pod deadline exceeded",
			pod:  podWith(corev1.PodFailed, exited(137, "Error", earlier), withPodReason("DeadlineExceeded", "Pod was active on the node longer than the specified deadline")),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeTimedOut, Reason: "DeadlineExceeded",
				Message: "Pod was active on the node longer than the specified deadline", ExitCode: ptr[int32](137)},
		},
		{
			name: "pod deadline exceeded wins over a later deletion",
			pod: podWith(corev1.PodFailed, exited(137, "Error", now), withPodReason("DeadlineExceeded", "deadline"),
				deletedAt(now, 5)),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeTimedOut, Reason: "DeadlineExceeded",
				Message: "deadline", ExitCode: ptr[int32](137)},
		},
		{
			name: "evicted",
			pod:  podWith(corev1.PodFailed, corev1.ContainerState{}, withPodReason("Evicted", "The node was low on resource: memory.")),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "Evicted", Message: "The node was low on resource: memory."},
		},
		{
			name: "failed without a container verdict",
			pod:  podWith(corev1.PodFailed, corev1.ContainerState{}),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "PodFailed"},
		},
		{
			name: "failed pod whose agent exited 0 (a sidecar failed)",
			pod:  podWith(corev1.PodFailed, exited(0, "Completed", earlier), withPodReason("", "")),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "PodFailed", ExitCode: ptr[int32](0)},
		},
	}
	for _, reason := range []string{"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
		"CreateContainerConfigError", "CreateContainerError", "RunContainerError"} {
		tests = append(tests, struct {
			name string
			pod  *corev1.Pod
			opts ClassifyOptions
			want PodVerdict
		}{
			name: "waiting " + reason,
			pod:  podWith(corev1.PodPending, waiting(reason, "details of "+reason)),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: reason,
				Message: `container "agent": details of ` + reason},
		})
	}
	tests = append(tests, []struct {
		name string
		pod  *corev1.Pod
		opts ClassifyOptions
		want PodVerdict
	}{
		{
			name: "waiting reason without message",
			pod:  podWith(corev1.PodPending, waiting("ErrImageNeverPull", "")),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "ErrImageNeverPull",
				Message: `container "agent": ErrImageNeverPull`},
		},
		{
			name: "transient-looking start error within its grace",
			pod: podWith(corev1.PodPending, waiting("CreateContainerConfigError", "failed to sync secret cache: timed out waiting for the condition"),
				withStartTime(now.Add(-4*time.Second))),
			opts: ClassifyOptions{Now: now, StartErrorGrace: 10 * time.Second},
			want: PodVerdict{Phase: PhasePending, Reason: "CreateContainerConfigError",
				Message: `container "agent": failed to sync secret cache: timed out waiting for the condition`, RecheckAfter: 6 * time.Second},
		},
		{
			name: "start error past its grace",
			pod:  podWith(corev1.PodPending, waiting("CreateContainerConfigError", `secret "x" not found`), withStartTime(now.Add(-10*time.Second))),
			opts: ClassifyOptions{Now: now, StartErrorGrace: 10 * time.Second},
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "CreateContainerConfigError",
				Message: `container "agent": secret "x" not found`},
		},
		{
			name: "start error without a start time waits the whole grace",
			pod:  podWith(corev1.PodPending, waiting("ImagePullBackOff", "")),
			opts: ClassifyOptions{Now: now, StartErrorGrace: 10 * time.Second},
			want: PodVerdict{Phase: PhasePending, Reason: "ImagePullBackOff", Message: `container "agent": ImagePullBackOff`, RecheckAfter: 10 * time.Second},
		},
		{
			name: "certain start error ignores the grace",
			pod:  podWith(corev1.PodPending, waiting("ErrImageNeverPull", "not present"), withStartTime(now)),
			opts: ClassifyOptions{Now: now, StartErrorGrace: 10 * time.Second},
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "ErrImageNeverPull", Message: `container "agent": not present`},
		},
		{
			name: "a certain error in one container beats a graced one in another",
			pod: podWith(corev1.PodPending, waiting("InvalidImageName", "bad"), withStartTime(now),
				withInit(waiting("RunContainerError", "runtime hiccup"))),
			opts: ClassifyOptions{Now: now, StartErrorGrace: 10 * time.Second},
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "InvalidImageName", Message: `container "agent": bad`},
		},
		{
			name: "init container stuck on a fatal reason",
			pod:  podWith(corev1.PodPending, waiting("PodInitializing", ""), withInit(waiting("ErrImagePull", "no such image"))),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "ErrImagePull",
				Message: `container "setup": no such image`},
		},
		{
			name: "init container failed",
			pod:  podWith(corev1.PodPending, waiting("PodInitializing", ""), withInit(exited(1, "Error", earlier))),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "InitContainerFailed",
				Message: `init container "setup" exited with code 1 (Error)`},
		},
		{
			name: "init container done, agent starting",
			pod:  podWith(corev1.PodPending, waiting("ContainerCreating", ""), withInit(exited(0, "Completed", earlier))),
			want: PodVerdict{Phase: PhasePending},
		},
		{
			name: "unschedulable, no grace",
			pod:  podWith(corev1.PodPending, corev1.ContainerState{}, withCondition(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable", "0/1 nodes are available: 1 Insufficient memory.", now)),
			opts: ClassifyOptions{Now: now},
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "Unschedulable", Message: "0/1 nodes are available: 1 Insufficient memory."},
		},
		{
			name: "unschedulable within grace",
			pod:  podWith(corev1.PodPending, corev1.ContainerState{}, withCondition(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable", "busy", now.Add(-3*time.Second))),
			opts: ClassifyOptions{Now: now, UnschedulableGrace: 10 * time.Second},
			want: PodVerdict{Phase: PhasePending, Reason: "Unschedulable", Message: "busy", RecheckAfter: 7 * time.Second},
		},
		{
			name: "unschedulable past grace",
			pod:  podWith(corev1.PodPending, corev1.ContainerState{}, withCondition(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable", "busy", now.Add(-10*time.Second))),
			opts: ClassifyOptions{Now: now, UnschedulableGrace: 10 * time.Second},
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "Unschedulable", Message: "busy"},
		},
		{
			name: "scheduling gated is only pending",
			pod:  podWith(corev1.PodPending, corev1.ContainerState{}, withCondition(corev1.PodScheduled, corev1.ConditionFalse, "SchedulingGated", "gated", now.Add(-time.Hour))),
			opts: ClassifyOptions{Now: now},
			want: PodVerdict{Phase: PhasePending},
		},
		{
			name: "scheduled",
			pod:  podWith(corev1.PodPending, waiting("ContainerCreating", ""), withCondition(corev1.PodScheduled, corev1.ConditionTrue, "", "", now)),
			opts: ClassifyOptions{Now: now},
			want: PodVerdict{Phase: PhasePending},
		},
		{
			name: "running pod deleted",
			pod:  podWith(corev1.PodRunning, running(), deletedAt(now, 5)),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeCancelled, Reason: "PodDeleted",
				Message: "the pod was deleted before the run finished"},
		},
		{
			name: "pending pod deleted",
			pod:  podWith(corev1.PodPending, waiting("ContainerCreating", ""), deletedAt(now, 5)),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeCancelled, Reason: "PodDeleted",
				Message: "the pod was deleted before the run finished"},
		},
		{
			name: "SIGTERM exit after deletion is a cancellation",
			pod:  podWith(corev1.PodFailed, exited(143, "Error", now.Add(time.Second)), deletedAt(now, 5)),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeCancelled, Reason: "PodDeleted",
				Message: "the pod was deleted before the run finished", ExitCode: ptr[int32](143)},
		},
		{
			name: "failure before the deletion was requested keeps its verdict",
			pod:  podWith(corev1.PodFailed, exited(3, "Error", now.Add(-time.Minute)), deletedAt(now, 5)),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "Error",
				Message: `container "agent" exited with code 3`, ExitCode: ptr[int32](3)},
		},
		{
			name: "exit 0 while being deleted is a success",
			pod:  podWith(corev1.PodRunning, exited(0, "Completed", now.Add(time.Second)), deletedAt(now, 5)),
			want: PodVerdict{Phase: PhaseSucceeded, Terminal: true, Outcome: OutcomeSucceeded, Reason: "Completed", ExitCode: ptr[int32](0)},
		},
		{
			name: "succeeded pod deleted later",
			pod:  podWith(corev1.PodSucceeded, exited(0, "Completed", earlier), deletedAt(now, 5)),
			want: PodVerdict{Phase: PhaseSucceeded, Terminal: true, Outcome: OutcomeSucceeded, Reason: "Completed", ExitCode: ptr[int32](0)},
		},
		{
			name: "preempted",
			pod: podWith(corev1.PodRunning, running(), deletedAt(now, 30),
				withCondition(corev1.DisruptionTarget, corev1.ConditionTrue, "PreemptionByScheduler", "preempted by a higher priority pod", now)),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "PreemptionByScheduler",
				Message: "preempted by a higher priority pod"},
		},
		{
			name: "evicted through the eviction API",
			pod: podWith(corev1.PodFailed, exited(143, "Error", now.Add(time.Second)), deletedAt(now, 30),
				withCondition(corev1.DisruptionTarget, corev1.ConditionTrue, "EvictionByEvictionAPI", "Eviction API: evicting", now)),
			want: PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "EvictionByEvictionAPI",
				Message: "Eviction API: evicting", ExitCode: ptr[int32](143)},
		},
		{
			name: "unknown phase is pending",
			pod:  podWith(corev1.PodUnknown, corev1.ContainerState{}),
			want: PodVerdict{Phase: PhasePending},
		},
		{
			name: "other container's state does not count as the agent's",
			pod: podWith(corev1.PodRunning, running(), func(p *corev1.Pod) {
				p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: "sidecar", State: exited(1, "Error", earlier)})
			}),
			want: PodVerdict{Phase: PhaseRunning},
		},
	}...)

	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ClassifyPod(tc.pod, agent, tc.opts)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ClassifyPod (-want +got):\n%s", diff)
			}
		})
	}
}

func TestClassifyJob(t *testing.T) {
	cond := func(ct batchv1.JobConditionType, s corev1.ConditionStatus, reason, msg string) batchv1.JobCondition {
		return batchv1.JobCondition{Type: ct, Status: s, Reason: reason, Message: msg}
	}
	job := func(mods ...func(*batchv1.Job)) *batchv1.Job {
		j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "pc-x", Namespace: "t-x"}}
		for _, m := range mods {
			m(j)
		}
		return j
	}
	conds := func(cs ...batchv1.JobCondition) func(*batchv1.Job) {
		return func(j *batchv1.Job) { j.Status.Conditions = cs }
	}
	ready := func(active, r int32) func(*batchv1.Job) {
		return func(j *batchv1.Job) { j.Status.Active, j.Status.Ready = active, &r }
	}
	deleted := func(j *batchv1.Job) { ts := metav1.NewTime(now); j.DeletionTimestamp = &ts }

	tests := []struct {
		name string
		job  *batchv1.Job
		want JobVerdict
	}{
		{name: "nil", job: nil, want: JobVerdict{Phase: PhasePending}},
		{name: "new", job: job(), want: JobVerdict{Phase: PhasePending}},
		{name: "pod not ready yet", job: job(ready(1, 0)), want: JobVerdict{Phase: PhasePending}},
		{name: "pod ready", job: job(ready(1, 1)), want: JobVerdict{Phase: PhaseRunning}},
		{name: "active without the ready count", job: job(func(j *batchv1.Job) { j.Status.Active = 1 }), want: JobVerdict{Phase: PhaseRunning}},
		{
			name: "complete",
			job:  job(conds(cond(batchv1.JobSuccessCriteriaMet, corev1.ConditionTrue, "CompletionsReached", ""), cond(batchv1.JobComplete, corev1.ConditionTrue, "CompletionsReached", "Reached expected number of succeeded pods"))),
			want: JobVerdict{Phase: PhaseSucceeded, Terminal: true, Outcome: OutcomeSucceeded, Reason: "CompletionsReached", Message: "Reached expected number of succeeded pods"},
		},
		{
			name: "complete without reason",
			job:  job(conds(cond(batchv1.JobComplete, corev1.ConditionTrue, "", ""))),
			want: JobVerdict{Phase: PhaseSucceeded, Terminal: true, Outcome: OutcomeSucceeded, Reason: "Completed"},
		},
		{
			name: "success criteria met, pods still terminating",
			job:  job(conds(cond(batchv1.JobSuccessCriteriaMet, corev1.ConditionTrue, "CompletionsReached", ""))),
			want: JobVerdict{Phase: PhaseSucceeded, Terminal: true, Outcome: OutcomeSucceeded, Reason: "CompletionsReached"},
		},
		{
			name: "backoff limit exceeded",
			job:  job(conds(cond(batchv1.JobFailureTarget, corev1.ConditionTrue, "BackoffLimitExceeded", "x"), cond(batchv1.JobFailed, corev1.ConditionTrue, "BackoffLimitExceeded", "Job has reached the specified backoff limit"))),
			want: JobVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "BackoffLimitExceeded", Message: "Job has reached the specified backoff limit"},
		},
		{
			name: "deadline exceeded",
			job:  job(conds(cond(batchv1.JobFailed, corev1.ConditionTrue, "DeadlineExceeded", "Job was active longer than specified deadline"))),
			want: JobVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeTimedOut, Reason: "DeadlineExceeded", Message: "Job was active longer than specified deadline"},
		},
		{
			name: "deadline exceeded, pods still terminating",
			job:  job(ready(1, 1), conds(cond(batchv1.JobFailureTarget, corev1.ConditionTrue, "DeadlineExceeded", "deadline"))),
			want: JobVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeTimedOut, Reason: "DeadlineExceeded", Message: "deadline"},
		},
		{
			name: "pod failure policy",
			job:  job(conds(cond(batchv1.JobFailed, corev1.ConditionTrue, "PodFailurePolicy", "Container agent exited with 42"))),
			want: JobVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "PodFailurePolicy", Message: "Container agent exited with 42"},
		},
		{
			name: "failed without reason",
			job:  job(conds(cond(batchv1.JobFailed, corev1.ConditionTrue, "", ""))),
			want: JobVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: "Failed"},
		},
		{
			name: "false conditions do not count",
			job:  job(ready(1, 1), conds(cond(batchv1.JobFailed, corev1.ConditionFalse, "DeadlineExceeded", ""), cond(batchv1.JobComplete, corev1.ConditionFalse, "", ""))),
			want: JobVerdict{Phase: PhaseRunning},
		},
		{
			name: "deleted while running",
			job:  job(ready(1, 1), deleted),
			want: JobVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeCancelled, Reason: "JobDeleted", Message: "the Job was deleted before the run finished"},
		},
		{
			name: "deleted after completing",
			job:  job(deleted, conds(cond(batchv1.JobComplete, corev1.ConditionTrue, "CompletionsReached", ""))),
			want: JobVerdict{Phase: PhaseSucceeded, Terminal: true, Outcome: OutcomeSucceeded, Reason: "CompletionsReached"},
		},
		{
			name: "suspended",
			job:  job(conds(cond(batchv1.JobSuspended, corev1.ConditionTrue, "JobSuspended", "Job suspended"))),
			want: JobVerdict{Phase: PhasePending, Reason: "Suspended", Message: "Job suspended"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ClassifyJob(tc.job)); diff != "" {
				t.Errorf("ClassifyJob (-want +got):\n%s", diff)
			}
		})
	}
}

func TestContainerDone(t *testing.T) {
	tests := []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"running", podWith(corev1.PodRunning, running()), false},
		{"waiting", podWith(corev1.PodPending, waiting("ContainerCreating", "")), false},
		{"terminated, never restarted", podWith(corev1.PodRunning, exited(0, "Completed", now)), true},
		{"terminated, will restart", podWith(corev1.PodRunning, exited(1, "Error", now), withRestartPolicy(corev1.RestartPolicyOnFailure)), false},
		{"pod succeeded", podWith(corev1.PodSucceeded, exited(0, "Completed", now)), true},
		{"pod failed before the container started", podWith(corev1.PodFailed, waiting("ErrImageNeverPull", "")), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := containerDone(tc.pod, agent); got != tc.want {
				t.Errorf("containerDone = %v, want %v", got, tc.want)
			}
		})
	}
}
