package verdict

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// oomExitCode is what a container killed by the OOM killer exits with (128 + SIGKILL) when the
// runtime does not report one.
const oomExitCode = 137

// fatalWaitingReasons are container waiting reasons that fail a run without waiting for its
// deadline, which would report them minutes late as timeouts. The value says whether the reason
// is certain at once (true: the image is not on the node and will never be pulled, or its name
// is malformed) or only once it has lasted Options.StartErrorGrace (false): an image
// pull can fail on a registry hiccup, and the kubelet reports CreateContainerConfigError with
// "failed to sync secret cache" while it cannot read the pod's Secret yet (see cacheSyncGrace).
// A missing Secret or key, a refused container and a missing image persist.
var fatalWaitingReasons = map[string]bool{
	events.ReasonErrImageNeverPull:          true,
	"InvalidImageName":                      true,
	"ErrImagePull":                          false,
	events.ReasonImagePullBackOff:           false,
	events.ReasonCreateContainerConfigError: false,
	"CreateContainerError":                  false,
	"RunContainerError":                     false,
}

// cacheSyncGrace is the least a container may wait with the kubelet's own cache-sync timeout
// ("failed to sync secret cache: timed out waiting for the condition", or configmap): the
// kubelet has not managed to read the pod's Secret yet, because the node authorizer does not
// know the pod is bound to it or the API server answers slowly. A Secret that does not exist
// reads `secret "…" not found` instead. It clears on a later sync of the pod, which on a node
// busy starting many pods comes tens of seconds later (seen 46 s from pod created to container
// started, under load): StartErrorGrace, meant for errors that persist, would fail such a run.
const cacheSyncGrace = time.Minute

// podVerdict is what a run's pod says about the run.
type podVerdict struct {
	Phase    events.Phase
	Terminal bool
	// Outcome is set when Terminal.
	Outcome events.Outcome
	// Reason is a CamelCase word (Kubernetes' where it has one); Message is for humans.
	Reason, Message string
	// ExitCode is the named container's exit code once it has terminated.
	ExitCode *int32
	// RecheckAfter, when non-zero, says the verdict changes with time alone (an unschedulable pod
	// whose grace runs out): classify again after this long even if the pod does not change.
	RecheckAfter time.Duration
}

func (o Options) now() time.Time {
	if o.Now.IsZero() {
		return time.Now()
	}
	return o.Now
}

// classifyPod decides what pod says about the run whose agent runs in container. It reports a
// terminal failure as soon as one is certain rather than when the pod's phase catches up: a
// fatal waiting reason (see fatalWaitingReasons; the transient-looking ones after
// StartErrorGrace), an unschedulable pod past UnschedulableGrace, a terminated container of a
// pod that never restarts, an eviction. A non-terminal verdict with RecheckAfter set is waiting
// out one of those graces.
//
// A pod being deleted has failed (PodDeleted) unless it had finished before the deletion was
// requested or its container exited 0; a DisruptionTarget condition (preemption, eviction API,
// taint manager) gives the failure the condition's reason.
//
// When the run is a Job, a terminal classifyJob verdict is authoritative (a Job deadline deletes
// its pod, which alone looks cancelled); keep the pod's ExitCode.
func classifyPod(pod *corev1.Pod, container string, opts Options) podVerdict {
	if pod == nil {
		return podVerdict{Phase: events.PhasePending}
	}
	st := findContainerStatus(pod, container)
	term := terminatedState(st)
	var exit *int32
	if term != nil {
		exit = ptr(term.ExitCode)
	}

	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		return podVerdict{Phase: events.PhaseSucceeded, Terminal: true, Outcome: events.OutcomeSucceeded, Reason: events.ReasonCompleted, ExitCode: exit}
	case corev1.PodFailed:
		// The kubelet's own verdicts come before any deletion; otherwise a deletion may be
		// what failed the pod.
		if r := pod.Status.Reason; r != events.ReasonDeadlineExceeded && r != events.ReasonEvicted {
			if v, ok := deletedVerdict(pod, term); ok {
				return v
			}
		}
		return failedpodVerdict(pod, container, term)
	}

	if term != nil && pod.Spec.RestartPolicy == corev1.RestartPolicyNever {
		if v, ok := deletedVerdict(pod, term); ok {
			return v
		}
		return terminatedVerdict(container, term)
	}
	if v, ok := deletedVerdict(pod, term); ok {
		return v
	}
	if v, ok := fatalWaitingVerdict(pod, opts); ok {
		return v
	}
	if v, ok := failedInitVerdict(pod); ok {
		return v
	}
	if v, ok := unschedulableVerdict(pod, opts); ok {
		return v
	}
	if pod.Status.Phase == corev1.PodRunning {
		return podVerdict{Phase: events.PhaseRunning}
	}
	return podVerdict{Phase: events.PhasePending}
}

// failedpodVerdict classifies a pod in phase Failed.
func failedpodVerdict(pod *corev1.Pod, container string, term *corev1.ContainerStateTerminated) podVerdict {
	v := podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: pod.Status.Reason, Message: pod.Status.Message}
	if term != nil {
		v.ExitCode = ptr(term.ExitCode)
	}
	switch {
	case pod.Status.Reason == events.ReasonDeadlineExceeded:
		v.Outcome = events.OutcomeTimedOut
		return v
	case pod.Status.Reason == events.ReasonEvicted:
		return v
	case term != nil && (term.ExitCode != 0 || term.Reason == events.ReasonOOMKilled):
		return terminatedVerdict(container, term)
	}
	if v.Reason == "" {
		v.Reason = events.ReasonPodFailed
	}
	return v
}

// terminatedVerdict classifies a terminated container of a pod that will not restart it.
func terminatedVerdict(container string, term *corev1.ContainerStateTerminated) podVerdict {
	switch {
	case term.Reason == events.ReasonOOMKilled:
		code := term.ExitCode
		if code == 0 {
			code = oomExitCode
		}
		return podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: events.ReasonOOMKilled,
			Message: fmt.Sprintf("container %q was killed for exceeding its memory limit", container), ExitCode: ptr(code)}
	case term.ExitCode == 0:
		return podVerdict{Phase: events.PhaseSucceeded, Terminal: true, Outcome: events.OutcomeSucceeded, Reason: events.ReasonCompleted, ExitCode: ptr(term.ExitCode)}
	}
	reason := term.Reason
	if reason == "" {
		reason = events.ReasonError
	}
	msg := fmt.Sprintf("container %q exited with code %d", container, term.ExitCode)
	if term.Message != "" {
		msg += ": " + term.Message
	}
	return podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: reason, Message: msg, ExitCode: ptr(term.ExitCode)}
}

// deletedVerdict classifies a pod with a deletionTimestamp. ok is false when the deletion does
// not decide the run: the pod is not being deleted, its container exited 0, or it terminated
// before the deletion was requested.
func deletedVerdict(pod *corev1.Pod, term *corev1.ContainerStateTerminated) (podVerdict, bool) {
	if pod.DeletionTimestamp == nil {
		return podVerdict{}, false
	}
	if term != nil {
		if term.ExitCode == 0 && term.Reason != events.ReasonOOMKilled {
			return podVerdict{}, false
		}
		requested := pod.DeletionTimestamp.Time
		if pod.DeletionGracePeriodSeconds != nil {
			requested = requested.Add(-time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second)
		}
		if !term.FinishedAt.IsZero() && term.FinishedAt.Time.Before(requested) {
			return podVerdict{}, false
		}
	}
	v := podVerdict{Phase: events.PhaseFailed, Terminal: true}
	if term != nil {
		v.ExitCode = ptr(term.ExitCode)
	}
	if c := podCondition(pod, corev1.DisruptionTarget); c != nil && c.Status == corev1.ConditionTrue {
		v.Outcome, v.Reason, v.Message = events.OutcomeFailed, c.Reason, c.Message
		if v.Reason == "" {
			v.Reason = string(corev1.DisruptionTarget)
		}
		return v, true
	}
	// Not a cancellation: a release deletes an exec-capable lease's pod, and then the release
	// decides (releaseDecides); a Job's pod deleted under a live Job waits for the Job's verdict.
	// What is left is a pod deleted under a live lease, which failed it.
	v.Outcome, v.Reason, v.Message = events.OutcomeFailed, events.ReasonPodDeleted, podDeletedMessage
	return v, true
}

// fatalWaitingVerdict finds a container (init or regular) stuck for a reason that will not clear
// (see fatalWaitingReasons).
func fatalWaitingVerdict(pod *corev1.Pod, opts Options) (podVerdict, bool) {
	var pending *podVerdict // a transient-looking reason still within its grace
	for _, statuses := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.ContainerStatuses} {
		for _, s := range statuses {
			w := s.State.Waiting
			if w == nil {
				continue
			}
			certain, fatal := fatalWaitingReasons[w.Reason]
			if !fatal {
				continue
			}
			msg := fmt.Sprintf("container %q: %s", s.Name, w.Reason)
			if w.Message != "" {
				msg = fmt.Sprintf("container %q: %s", s.Name, w.Message)
			}
			if !certain && opts.StartErrorGrace > 0 {
				now := opts.now()
				since := now
				if pod.Status.StartTime != nil {
					since = pod.Status.StartTime.Time
				}
				grace := opts.StartErrorGrace
				if w.Reason == events.ReasonCreateContainerConfigError && strings.HasPrefix(w.Message, "failed to sync ") {
					grace = max(grace, cacheSyncGrace)
				}
				if waited := now.Sub(since); waited < grace {
					if pending == nil {
						pending = &podVerdict{Phase: events.PhasePending, Reason: w.Reason, Message: msg, RecheckAfter: grace - waited}
					}
					continue
				}
			}
			return podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: w.Reason, Message: msg}, true
		}
	}
	if pending != nil {
		return *pending, true
	}
	return podVerdict{}, false
}

// failedInitVerdict finds an init container that failed in a pod that never restarts it.
func failedInitVerdict(pod *corev1.Pod) (podVerdict, bool) {
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
		return podVerdict{}, false
	}
	for _, s := range pod.Status.InitContainerStatuses {
		t := s.State.Terminated
		if t == nil || t.ExitCode == 0 {
			continue
		}
		return podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: events.ReasonInitContainerFailed,
			Message: fmt.Sprintf("init container %q exited with code %d (%s)", s.Name, t.ExitCode, t.Reason)}, true
	}
	return podVerdict{}, false
}

// unschedulableVerdict applies Options.UnschedulableGrace to PodScheduled=False/Unschedulable.
func unschedulableVerdict(pod *corev1.Pod, opts Options) (podVerdict, bool) {
	c := podCondition(pod, corev1.PodScheduled)
	if c == nil || c.Status != corev1.ConditionFalse || c.Reason != corev1.PodReasonUnschedulable {
		return podVerdict{}, false
	}
	now := opts.now()
	since := c.LastTransitionTime.Time
	if since.IsZero() {
		since = now
	}
	if waited := now.Sub(since); waited < opts.UnschedulableGrace {
		return podVerdict{Phase: events.PhasePending, Reason: events.ReasonUnschedulable, Message: c.Message,
			RecheckAfter: opts.UnschedulableGrace - waited}, true
	}
	return podVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: events.ReasonUnschedulable, Message: c.Message}, true
}

// findContainerStatus returns the status of the named container (regular, then init), or nil.
func findContainerStatus(pod *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, statuses := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses} {
		for i := range statuses {
			if statuses[i].Name == name {
				return &statuses[i]
			}
		}
	}
	return nil
}

func terminatedState(st *corev1.ContainerStatus) *corev1.ContainerStateTerminated {
	if st == nil {
		return nil
	}
	return st.State.Terminated
}

func podCondition(pod *corev1.Pod, t corev1.PodConditionType) *corev1.PodCondition {
	for i := range pod.Status.Conditions {
		if pod.Status.Conditions[i].Type == t {
			return &pod.Status.Conditions[i]
		}
	}
	return nil
}

func ptr[T any](v T) *T { return &v }
