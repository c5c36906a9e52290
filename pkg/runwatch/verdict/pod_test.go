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
		opts Options
		want podVerdict
	}{
		{name: "nil pod", pod: nil, want: podVerdict{Phase: events.PhasePending}},
		{
			name: "pending, no container status yet",
			pod:  podWith(corev1.PodPending, corev1.ContainerState{}, func(p *corev1.Pod) { p.Status.ContainerStatuses = nil }),
			want: podVerdict{Phase: events.PhasePending},
		},
		{
			name: "pending, container creating",
			pod:  podWith(corev1.PodPending, waiting("ContainerCreating", "")),
			want: podVerdict{Phase: events.PhasePending},
		},
		{name: "running", pod: podWith(corev1.PodRunning, running()), want: podVerdict{Phase: events.PhaseRunning}},
		{
			name: "succeeded",
			pod:  podWith(corev1.PodSucceeded, exited(0, "Completed", earlier)),
			want: podVerdict{Phase: events.PhaseSucceeded, Terminal: true, Outcome: events.OutcomeSucceeded, Reason: "Completed", ExitCode: ptr[int32](0)},
		},
		{
			name: "exit 0 seen before the pod phase catches up",
			pod:  podWith(corev1.PodRunning, exited(0, "Completed", earlier)),
			want: podVerdict{Phase: events.PhaseSucceeded, Terminal: true, Outcome: events.OutcomeSucceeded, Reason: "Completed", ExitCode: ptr[int32](0)},
		},
		{
			name: "failed with exit code",
			pod:  podWith(corev1.PodFailed, exited(3, "Error", earlier)),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "Error",
				Message: `container "agent" exited with code 3`, ExitCode: ptr[int32](3)},
		},
		{
			name: "non-zero exit seen before the pod phase catches up",
			pod:  podWith(corev1.PodRunning, exited(1, "", earlier)),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "Error",
				Message: `container "agent" exited with code 1`, ExitCode: ptr[int32](1)},
		},
		{
			name: "termination message is kept",
			pod: podWith(corev1.PodFailed, exited(2, "Error", earlier), func(p *corev1.Pod) {
				p.Status.ContainerStatuses[0].State.Terminated.Message = "bad flag"
			}),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "Error",
				Message: `container "agent" exited with code 2: bad flag`, ExitCode: ptr[int32](2)},
		},
		{
			name: "terminated container that will be restarted is not terminal",
			pod:  podWith(corev1.PodRunning, exited(1, "Error", earlier), withRestartPolicy(corev1.RestartPolicyOnFailure)),
			want: podVerdict{Phase: events.PhaseRunning},
		},
		{
			name: "OOMKilled",
			pod:  podWith(corev1.PodFailed, exited(137, "OOMKilled", earlier)),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "OOMKilled",
				Message: `container "agent" was killed for exceeding its memory limit`, ExitCode: ptr[int32](137)},
		},
		{
			name: "OOMKilled without an exit code reports 137",
			pod:  podWith(corev1.PodRunning, exited(0, "OOMKilled", earlier)),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "OOMKilled",
				Message: `container "agent" was killed for exceeding its memory limit`, ExitCode: ptr[int32](137)},
		},
		{
			name: "pod deadline exceeded",
			pod:  podWith(corev1.PodFailed, exited(137, "Error", earlier), withPodReason("DeadlineExceeded", "Pod was active on the node longer than the specified deadline")),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeTimedOut, Reason: "DeadlineExceeded",
				Message: "Pod was active on the node longer than the specified deadline", ExitCode: ptr[int32](137)},
		},
		{
			name: "pod deadline exceeded wins over a later deletion",
			pod: podWith(corev1.PodFailed, exited(137, "Error", now), withPodReason("DeadlineExceeded", "deadline"),
				deletedAt(now, 5)),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeTimedOut, Reason: "DeadlineExceeded",
				Message: "deadline", ExitCode: ptr[int32](137)},
		},
		{
			name: "evicted",
			pod:  podWith(corev1.PodFailed, corev1.ContainerState{}, withPodReason("Evicted", "The node was low on resource: memory.")),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "Evicted", Message: "The node was low on resource: memory."},
		},
		{
			name: "failed without a container verdict",
			pod:  podWith(corev1.PodFailed, corev1.ContainerState{}),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "PodFailed"},
		},
		{
			name: "failed pod whose agent exited 0 (a sidecar failed)",
			pod:  podWith(corev1.PodFailed, exited(0, "Completed", earlier), withPodReason("", "")),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "PodFailed", ExitCode: ptr[int32](0)},
		},
	}
	for _, reason := range []string{"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
		"CreateContainerConfigError", "CreateContainerError", "RunContainerError"} {
		tests = append(tests, struct {
			name string
			pod  *corev1.Pod
			opts Options
			want podVerdict
		}{
			name: "waiting " + reason,
			pod:  podWith(corev1.PodPending, waiting(reason, "details of "+reason)),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: reason,
				Message: `container "agent": details of ` + reason},
		})
	}
	tests = append(tests, []struct {
		name string
		pod  *corev1.Pod
		opts Options
		want podVerdict
	}{
		{
			name: "waiting reason without message",
			pod:  podWith(corev1.PodPending, waiting("ErrImageNeverPull", "")),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "ErrImageNeverPull",
				Message: `container "agent": ErrImageNeverPull`},
		},
		{
			name: "transient-looking start error within its grace",
			pod: podWith(corev1.PodPending, waiting("CreateContainerConfigError", "failed to sync secret cache: timed out waiting for the condition"),
				withStartTime(now.Add(-4*time.Second))),
			opts: Options{Now: now, StartErrorGrace: 10 * time.Second},
			want: podVerdict{Phase: events.PhasePending, Reason: "CreateContainerConfigError",
				Message: `container "agent": failed to sync secret cache: timed out waiting for the condition`, RecheckAfter: 56 * time.Second},
		},
		{
			name: "the kubelet's cache sync past the start error grace",
			pod: podWith(corev1.PodPending, waiting("CreateContainerConfigError", "failed to sync secret cache: timed out waiting for the condition"),
				withStartTime(now.Add(-40*time.Second))),
			opts: Options{Now: now, StartErrorGrace: 10 * time.Second},
			want: podVerdict{Phase: events.PhasePending, Reason: "CreateContainerConfigError",
				Message: `container "agent": failed to sync secret cache: timed out waiting for the condition`, RecheckAfter: 20 * time.Second},
		},
		{
			name: "the kubelet's cache sync past its own grace",
			pod: podWith(corev1.PodPending, waiting("CreateContainerConfigError", "failed to sync configmap cache: timed out waiting for the condition"),
				withStartTime(now.Add(-time.Minute))),
			opts: Options{Now: now, StartErrorGrace: 10 * time.Second},
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "CreateContainerConfigError",
				Message: `container "agent": failed to sync configmap cache: timed out waiting for the condition`},
		},
		{
			name: "start error past its grace",
			pod:  podWith(corev1.PodPending, waiting("CreateContainerConfigError", `secret "x" not found`), withStartTime(now.Add(-10*time.Second))),
			opts: Options{Now: now, StartErrorGrace: 10 * time.Second},
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "CreateContainerConfigError",
				Message: `container "agent": secret "x" not found`},
		},
		{
			name: "start error without a start time waits the whole grace",
			pod:  podWith(corev1.PodPending, waiting("ImagePullBackOff", "")),
			opts: Options{Now: now, StartErrorGrace: 10 * time.Second},
			want: podVerdict{Phase: events.PhasePending, Reason: "ImagePullBackOff", Message: `container "agent": ImagePullBackOff`, RecheckAfter: 10 * time.Second},
		},
		{
			name: "certain start error ignores the grace",
			pod:  podWith(corev1.PodPending, waiting("ErrImageNeverPull", "not present"), withStartTime(now)),
			opts: Options{Now: now, StartErrorGrace: 10 * time.Second},
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "ErrImageNeverPull", Message: `container "agent": not present`},
		},
		{
			name: "a certain error in one container beats a graced one in another",
			pod: podWith(corev1.PodPending, waiting("InvalidImageName", "bad"), withStartTime(now),
				withInit(waiting("RunContainerError", "runtime hiccup"))),
			opts: Options{Now: now, StartErrorGrace: 10 * time.Second},
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "InvalidImageName", Message: `container "agent": bad`},
		},
		{
			name: "init container stuck on a fatal reason",
			pod:  podWith(corev1.PodPending, waiting("PodInitializing", ""), withInit(waiting("ErrImagePull", "no such image"))),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "ErrImagePull",
				Message: `container "setup": no such image`},
		},
		{
			name: "init container failed",
			pod:  podWith(corev1.PodPending, waiting("PodInitializing", ""), withInit(exited(1, "Error", earlier))),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "InitContainerFailed",
				Message: `init container "setup" exited with code 1 (Error)`},
		},
		{
			name: "init container done, agent starting",
			pod:  podWith(corev1.PodPending, waiting("ContainerCreating", ""), withInit(exited(0, "Completed", earlier))),
			want: podVerdict{Phase: events.PhasePending},
		},
		{
			name: "unschedulable, no grace",
			pod:  podWith(corev1.PodPending, corev1.ContainerState{}, withCondition(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable", "0/1 nodes are available: 1 Insufficient memory.", now)),
			opts: Options{Now: now},
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "Unschedulable", Message: "0/1 nodes are available: 1 Insufficient memory."},
		},
		{
			name: "unschedulable within grace",
			pod:  podWith(corev1.PodPending, corev1.ContainerState{}, withCondition(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable", "busy", now.Add(-3*time.Second))),
			opts: Options{Now: now, UnschedulableGrace: 10 * time.Second},
			want: podVerdict{Phase: events.PhasePending, Reason: "Unschedulable", Message: "busy", RecheckAfter: 7 * time.Second},
		},
		{
			name: "unschedulable past grace",
			pod:  podWith(corev1.PodPending, corev1.ContainerState{}, withCondition(corev1.PodScheduled, corev1.ConditionFalse, "Unschedulable", "busy", now.Add(-10*time.Second))),
			opts: Options{Now: now, UnschedulableGrace: 10 * time.Second},
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "Unschedulable", Message: "busy"},
		},
		{
			name: "scheduling gated is only pending",
			pod:  podWith(corev1.PodPending, corev1.ContainerState{}, withCondition(corev1.PodScheduled, corev1.ConditionFalse, "SchedulingGated", "gated", now.Add(-time.Hour))),
			opts: Options{Now: now},
			want: podVerdict{Phase: events.PhasePending},
		},
		{
			name: "scheduled",
			pod:  podWith(corev1.PodPending, waiting("ContainerCreating", ""), withCondition(corev1.PodScheduled, corev1.ConditionTrue, "", "", now)),
			opts: Options{Now: now},
			want: podVerdict{Phase: events.PhasePending},
		},
		{
			name: "running pod deleted",
			pod:  podWith(corev1.PodRunning, running(), deletedAt(now, 5)),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "PodDeleted",
				Message: "the pod was deleted before the run finished"},
		},
		{
			name: "pending pod deleted",
			pod:  podWith(corev1.PodPending, waiting("ContainerCreating", ""), deletedAt(now, 5)),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "PodDeleted",
				Message: "the pod was deleted before the run finished"},
		},
		{
			name: "SIGTERM exit after deletion is the deletion's",
			pod:  podWith(corev1.PodFailed, exited(143, "Error", now.Add(time.Second)), deletedAt(now, 5)),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "PodDeleted",
				Message: "the pod was deleted before the run finished", ExitCode: ptr[int32](143)},
		},
		{
			name: "failure before the deletion was requested keeps its verdict",
			pod:  podWith(corev1.PodFailed, exited(3, "Error", now.Add(-time.Minute)), deletedAt(now, 5)),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "Error",
				Message: `container "agent" exited with code 3`, ExitCode: ptr[int32](3)},
		},
		{
			name: "exit 0 while being deleted is a success",
			pod:  podWith(corev1.PodRunning, exited(0, "Completed", now.Add(time.Second)), deletedAt(now, 5)),
			want: podVerdict{Phase: events.PhaseSucceeded, Terminal: true, Outcome: events.OutcomeSucceeded, Reason: "Completed", ExitCode: ptr[int32](0)},
		},
		{
			name: "succeeded pod deleted later",
			pod:  podWith(corev1.PodSucceeded, exited(0, "Completed", earlier), deletedAt(now, 5)),
			want: podVerdict{Phase: events.PhaseSucceeded, Terminal: true, Outcome: events.OutcomeSucceeded, Reason: "Completed", ExitCode: ptr[int32](0)},
		},
		{
			name: "preempted",
			pod: podWith(corev1.PodRunning, running(), deletedAt(now, 30),
				withCondition(corev1.DisruptionTarget, corev1.ConditionTrue, "PreemptionByScheduler", "preempted by a higher priority pod", now)),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "PreemptionByScheduler",
				Message: "preempted by a higher priority pod"},
		},
		{
			name: "evicted through the eviction API",
			pod: podWith(corev1.PodFailed, exited(143, "Error", now.Add(time.Second)), deletedAt(now, 30),
				withCondition(corev1.DisruptionTarget, corev1.ConditionTrue, "EvictionByEvictionAPI", "Eviction API: evicting", now)),
			want: podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "EvictionByEvictionAPI",
				Message: "Eviction API: evicting", ExitCode: ptr[int32](143)},
		},
		{
			name: "unknown phase is pending",
			pod:  podWith(corev1.PodUnknown, corev1.ContainerState{}),
			want: podVerdict{Phase: events.PhasePending},
		},
		{
			name: "other container's state does not count as the agent's",
			pod: podWith(corev1.PodRunning, running(), func(p *corev1.Pod) {
				p.Status.ContainerStatuses = append(p.Status.ContainerStatuses, corev1.ContainerStatus{Name: "sidecar", State: exited(1, "Error", earlier)})
			}),
			want: podVerdict{Phase: events.PhaseRunning},
		},
	}...)

	for _, tc := range tests {
		forms(t, tc.name, nil, tc.pod, func(t *testing.T, _ *batchv1.Job, pod *corev1.Pod) {
			got := classifyPod(pod, agent, tc.opts)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("classifyPod (-want +got):\n%s", diff)
			}
		})
	}
}
