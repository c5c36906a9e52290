package verdict

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// Release is an exec-capable lease's release or destroy, once its lease record says one began,
// with what the run stream says about the agent's recorded exec.
//
// An exec-capable lease (backends pod and sandbox-cr) runs no command of its own: its client
// runs commands through the exec service and ends it with a release, which is its normal end.
// So a release decides how the run ended; only the agent's recorded exec tells how the agent's
// work went.
type Release struct {
	// Destroy: the lease was destroyed rather than released.
	Destroy bool
	// CancelActiveWork: the release asked to cancel running commands rather than wait for them.
	CancelActiveWork bool
	// AgentExec is the run's last recorded exec; nil when none was recorded.
	AgentExec *AgentExec
}

// AgentExec is a recorded exec (the Paperclip plugin records the agent's command) as its `exec`
// events in the run stream tell it.
type AgentExec struct {
	ExecID string
	// Exit is how the exec ended: its final event's; nil when it has none (it was still
	// running when its pod went).
	Exit *events.ExecExit
	// Agent is the agent's account parsed from the exec's stdout, on its final event.
	Agent *events.AgentResult
}

// Released is how an exec-capable lease's run ended when its release or destroy ended its
// workload: released, with the agent exec's exit code and account, unless the release cut the
// agent's exec short, which is a cancellation. A cut exec either has no final event (its pod
// went while it ran: cancelActiveWork gives sandboxd a second, a plain release the release's
// grace) or, with cancelActiveWork, was killed by a signal (the Paperclip plugin kills the
// commands a cancelling release catches).
func Released(r Release) End {
	x := r.AgentExec
	what := "released"
	if r.Destroy {
		what = "destroyed"
	}
	if x != nil && (x.Exit == nil || (r.CancelActiveWork && x.Exit.Signal != nil && !x.Exit.TimedOut)) {
		e := End{Outcome: events.OutcomeCancelled, Reason: events.ReasonCommandCancelled,
			Message: fmt.Sprintf("the lease was %s while its agent's command (exec %s) ran", what, x.ExecID), Agent: x.Agent}
		if x.Exit != nil {
			e.ExitCode = x.Exit.ExitCode
		}
		return e
	}
	e := End{Outcome: events.OutcomeReleased, Reason: events.ReasonReleased, Message: "the lease was " + what}
	if x != nil {
		e.ExitCode, e.Agent = x.Exit.ExitCode, x.Agent
	}
	return e
}

// releaseDecides decides an exec-capable lease's run once its release began: the release waits
// for the workload's end (the pod gone, or sandboxd's container terminated), and then decides,
// unless the pod had failed on its own (an OOM kill, an eviction, its activity deadline).
func releaseDecides(r Release, pod *corev1.Pod, container string, pv podVerdict, exit *int) Decision {
	if pv.Terminal && pv.Outcome != events.OutcomeSucceeded && pv.Reason != events.ReasonPodDeleted {
		return ended(pv.Phase, End{Outcome: pv.Outcome, Reason: pv.Reason, Message: pv.Message, ExitCode: exit})
	}
	if pod != nil && !workloadEnded(pod, container) {
		msg := "the lease is being released: its pod ends once its commands finish"
		if r.CancelActiveWork {
			msg = "the lease is being released: its running commands are cancelled"
		}
		return Decision{Phase: events.PhaseRunning, Reason: events.ReasonReleasing, Message: msg}
	}
	e := Released(r)
	return ended(e.Phase(), e)
}

// workloadEnded reports whether an exec-capable lease's pod has ended: sandboxd's container
// terminated, or the pod's phase is final.
func workloadEnded(pod *corev1.Pod, container string) bool {
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return true
	}
	return terminatedState(findContainerStatus(pod, container)) != nil
}
