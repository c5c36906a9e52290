// Package verdict decides, from a run's Job and pod as the informers last saw them, where the
// run is (the phase and reason of its status events) and, once it is over, how it ended (the
// body of its one result event).
//
// It is pure: no I/O, no clock of its own (Options.Now), no state between calls. What the
// run-watcher learnt earlier (it saw the Job, the lease is exec-capable, a quota refused the pod,
// the lease's release began and what its agent's recorded exec did) comes in as Input; a verdict
// that changes with time alone says when to ask again (Decision.RecheckAfter).
package verdict

import (
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// Options are the run-watcher's settings a verdict depends on.
type Options struct {
	// Container is the agent's container: its state and exit code decide the run.
	Container string
	// Now is the time to judge by; zero means time.Now().
	Now time.Time
	// UnschedulableGrace is how long a pod may stay unschedulable before the run fails. Zero
	// fails at once: a run's quota, affinity or resource request does not change while it waits.
	// The scheduler can however report Unschedulable transiently (a node still joining, a
	// preemption in progress, capacity freed a moment later), so a worker may give it a few
	// seconds. Measured from the PodScheduled condition's lastTransitionTime.
	UnschedulableGrace time.Duration
	// StartErrorGrace is how long after the kubelet started the pod (status.startTime) a
	// container may wait with a reason that can be transient (ErrImagePull, ImagePullBackOff,
	// CreateContainerConfigError, CreateContainerError, RunContainerError) before the run
	// fails. Zero fails at once. The run-watcher's default and its reason are
	// runwatch.DefaultStartErrorGrace.
	StartErrorGrace time.Duration
}

// Input is what the run-watcher knows about one run.
type Input struct {
	// Job is the run's Job: nil before the informer delivered it, once it is deleted, and for a
	// run without one (a Sandbox's pod).
	Job *batchv1.Job
	// Pod is the run's newest pod; nil before it exists.
	Pod *corev1.Pod
	// SeenJob reports that the run's Job was seen earlier, so a missing Job was deleted.
	SeenJob bool
	// SeenPod reports that the pod of a run without a Job (an exec-capable lease's) was seen
	// earlier, so a missing pod was deleted: a pod deleted with no grace period vanishes from
	// the informer without ever showing its deletionTimestamp.
	SeenPod bool
	// ExecCapable reports a lease that accepts exec once its pod is ready, which its status
	// says (Running, reason Ready).
	ExecCapable bool
	// QuotaRefusal, when set, is the tenant's ResourceQuota refusing the Job's pod (from the Job
	// controller's FailedCreate event), in words for the tenant.
	QuotaRefusal string
	// Release is an exec-capable lease's release or destroy once its lease record says one
	// began; nil while the lease is live. A run with a Job ignores it: its Job decides.
	Release *Release
}

// Decision is where the run is, and how it ended once it is over.
type Decision struct {
	Phase   events.Phase
	Reason  string
	Message string
	// End is set once the run is over.
	End *End
	// RecheckAfter, when non-zero, says the decision changes with time alone (a grace running
	// out): decide again after this long even if nothing changes.
	RecheckAfter time.Duration
}

// End is how a run ended: what its result event says.
type End struct {
	Outcome  events.Outcome
	Reason   string
	Message  string
	ExitCode *int
	// Agent is the agent's account from its recorded exec (an exec-capable lease's release). A
	// Job's account is parsed from its container log instead; an exec-capable lease without a
	// recorded exec has none.
	Agent *events.AgentResult
}

// AgentExitCode is the exit code the agent's transcript is judged with: the container's, or,
// when the agent never exited on its own (deleted, timed out, never started), 0 for a run that
// succeeded and 1 for one that did not.
func (e End) AgentExitCode() int {
	switch {
	case e.ExitCode != nil:
		return *e.ExitCode
	case e.Outcome == events.OutcomeSucceeded:
		return 0
	}
	return 1
}

// Phase is the phase of the last status of a run that ended this way: Succeeded for a run that
// succeeded or was released, Failed for the rest.
func (e End) Phase() events.Phase {
	if e.Outcome == events.OutcomeSucceeded || e.Outcome == events.OutcomeReleased {
		return events.PhaseSucceeded
	}
	return events.PhaseFailed
}

// podDeletedMessage is what a run whose pod was deleted under it says (deletedVerdict).
const podDeletedMessage = "the pod was deleted before the run finished"

// jobDeletedMessage is what a run cancelled by its Job's deletion says, as classifyJob words it.
const jobDeletedMessage = "the Job was deleted before the run finished"

// Decide decides the run's phase and, once it is over, its end.
func Decide(in Input, opts Options) Decision {
	pv := classifyPod(in.Pod, opts.Container, opts)
	var exit *int
	if pv.ExitCode != nil {
		c := int(*pv.ExitCode)
		exit = &c
	}
	var d Decision
	if in.Release != nil && in.Job == nil && !in.SeenJob {
		d = releaseDecides(*in.Release, in.Pod, opts.Container, pv, exit)
	} else {
		d = decide(in, pv, exit)
	}
	d.RecheckAfter = pv.RecheckAfter
	return d
}

func decide(in Input, pv podVerdict, exit *int) Decision {
	job, pod := in.Job, in.Pod
	ongoing := Decision{Phase: pv.Phase, Reason: pv.Reason, Message: pv.Message}
	podDecides := func() Decision {
		if !pv.Terminal {
			if in.ExecCapable && pv.Phase == events.PhaseRunning && pv.Reason == "" && podReady(pod) {
				return Decision{Phase: events.PhaseRunning, Reason: events.ReasonReady} // the lease accepts exec from now on
			}
			return ongoing
		}
		return ended(pv.Phase, End{Outcome: pv.Outcome, Reason: pv.Reason, Message: pv.Message, ExitCode: exit})
	}
	cancelled := func() Decision {
		return ended(events.PhaseFailed, End{Outcome: events.OutcomeCancelled, Reason: events.ReasonJobDeleted, Message: jobDeletedMessage, ExitCode: exit})
	}

	switch {
	case job != nil:
		// A Job's own verdict comes first and is authoritative: a deadline deletes the pod,
		// which alone would look cancelled, and a Job being deleted after it ended still
		// ended the way its conditions say.
		if jv := classifyJob(job); jv.Terminal {
			reason, message := jv.Reason, jv.Message
			if pv.Terminal && jv.Outcome == events.OutcomeFailed && pv.Reason != "" && pv.Reason != events.ReasonPodDeleted {
				reason, message = pv.Reason, pv.Message // the pod knows why (OOMKilled, exit code)
			}
			return ended(jv.Phase, End{Outcome: jv.Outcome, Reason: reason, Message: message, ExitCode: exit})
		}
		if job.DeletionTimestamp != nil {
			return cancelled() // released or destroyed before it ended
		}
		if pod != nil && pod.DeletionTimestamp != nil {
			// Someone deleted the pod of a live Job (its deadline, an eviction): the Job's
			// next condition says how the run ended.
			return ongoing
		}
		if in.QuotaRefusal != "" && pod == nil {
			// The tenant's ResourceQuota refuses the Job's pod: the Job controller would retry
			// until the deadline while the run holds its agent. Fail now, naming the quota.
			return ended(events.PhaseFailed, End{Outcome: events.OutcomeFailed, Reason: events.ReasonQuotaExceeded, Message: in.QuotaRefusal})
		}
		return podDecides()
	case in.SeenJob:
		// The Job is gone before it ended: released or destroyed, unless its pod had ended on
		// its own just before.
		if pv.Terminal && pod != nil && pod.DeletionTimestamp == nil {
			return podDecides()
		}
		return cancelled()
	case pod != nil && ownedByJob(pod):
		// The pod's event came before the informer saw its Job: wait for the Job.
		return ongoing
	case pod == nil && in.SeenPod:
		// An exec-capable lease's pod vanished without a release: as deletedVerdict says of
		// a pod seen being deleted.
		return ended(events.PhaseFailed, End{Outcome: events.OutcomeFailed, Reason: events.ReasonPodDeleted, Message: podDeletedMessage})
	default:
		// A run without a Job (a Sandbox's pod): the pod decides.
		return podDecides()
	}
}

// ended is the decision of a run that is over: its last status says what its end says.
func ended(phase events.Phase, e End) Decision {
	return Decision{Phase: phase, Reason: e.Reason, Message: e.Message, End: &e}
}

// Lost is how a run whose workload vanished while no run-watcher followed it ended: cancelled
// when its lease was released or destroyed (that is what deleted it), else failed, its workload
// lost. An exec-capable lease's release is its normal end instead (Released).
func Lost(released bool) End {
	if released {
		return End{Outcome: events.OutcomeCancelled, Reason: events.ReasonJobDeleted,
			Message: "the run's workload was deleted by a release while no watcher followed it"}
	}
	return End{Outcome: events.OutcomeFailed, Reason: events.ReasonWorkloadLost,
		Message: "the run's workload disappeared while no watcher followed it"}
}

// podReady reports the pod's Ready condition.
func podReady(pod *corev1.Pod) bool {
	if pod == nil || pod.Status.PodIP == "" {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// ownedByJob reports whether a Job controls pod.
func ownedByJob(pod *corev1.Pod) bool {
	ref := metav1.GetControllerOf(pod)
	return ref != nil && ref.Kind == "Job"
}
