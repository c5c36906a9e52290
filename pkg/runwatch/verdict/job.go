package verdict

import (
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// jobVerdict is what a run's Job says about the run.
type jobVerdict struct {
	Phase    events.Phase
	Terminal bool
	Outcome  events.Outcome
	Reason   string
	Message  string
}

// classifyJob decides what a run's Job says about the run. The Job controller's interim
// conditions (FailureTarget, SuccessCriteriaMet) already decide the outcome, so they count as
// terminal; a Failed or FailureTarget condition with reason DeadlineExceeded is a timeout. A Job
// being deleted before it finished is cancelled.
func classifyJob(job *batchv1.Job) jobVerdict {
	if job == nil {
		return jobVerdict{Phase: events.PhasePending}
	}
	// Final conditions first, then the interim ones.
	for _, pair := range [][2]batchv1.JobConditionType{
		{batchv1.JobFailed, batchv1.JobComplete},
		{batchv1.JobFailureTarget, batchv1.JobSuccessCriteriaMet},
	} {
		for _, c := range job.Status.Conditions {
			if c.Status != corev1.ConditionTrue || (c.Type != pair[0] && c.Type != pair[1]) {
				continue
			}
			if c.Type == batchv1.JobComplete || c.Type == batchv1.JobSuccessCriteriaMet {
				return jobVerdict{Phase: events.PhaseSucceeded, Terminal: true, Outcome: events.OutcomeSucceeded, Reason: orDefault(c.Reason, events.ReasonCompleted), Message: c.Message}
			}
			v := jobVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: orDefault(c.Reason, string(c.Type)), Message: c.Message}
			if c.Reason == batchv1.JobReasonDeadlineExceeded {
				v.Outcome = events.OutcomeTimedOut
			}
			return v
		}
	}
	if job.DeletionTimestamp != nil {
		return jobVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeCancelled, Reason: events.ReasonJobDeleted,
			Message: "the Job was deleted before the run finished"}
	}
	for _, c := range job.Status.Conditions {
		if c.Type == batchv1.JobSuspended && c.Status == corev1.ConditionTrue {
			return jobVerdict{Phase: events.PhasePending, Reason: events.ReasonSuspended, Message: c.Message}
		}
	}
	running := job.Status.Active > 0
	if job.Status.Ready != nil {
		running = *job.Status.Ready > 0
	}
	if running {
		return jobVerdict{Phase: events.PhaseRunning}
	}
	return jobVerdict{Phase: events.PhasePending}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
