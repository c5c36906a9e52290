package verdict

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
)

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
		want jobVerdict
	}{
		{name: "nil", job: nil, want: jobVerdict{Phase: events.PhasePending}},
		{name: "new", job: job(), want: jobVerdict{Phase: events.PhasePending}},
		{name: "pod not ready yet", job: job(ready(1, 0)), want: jobVerdict{Phase: events.PhasePending}},
		{name: "pod ready", job: job(ready(1, 1)), want: jobVerdict{Phase: events.PhaseRunning}},
		{name: "active without the ready count", job: job(func(j *batchv1.Job) { j.Status.Active = 1 }), want: jobVerdict{Phase: events.PhaseRunning}},
		{
			name: "complete",
			job:  job(conds(cond(batchv1.JobSuccessCriteriaMet, corev1.ConditionTrue, "CompletionsReached", ""), cond(batchv1.JobComplete, corev1.ConditionTrue, "CompletionsReached", "Reached expected number of succeeded pods"))),
			want: jobVerdict{Phase: events.PhaseSucceeded, Terminal: true, Outcome: events.OutcomeSucceeded, Reason: "CompletionsReached", Message: "Reached expected number of succeeded pods"},
		},
		{
			name: "complete without reason",
			job:  job(conds(cond(batchv1.JobComplete, corev1.ConditionTrue, "", ""))),
			want: jobVerdict{Phase: events.PhaseSucceeded, Terminal: true, Outcome: events.OutcomeSucceeded, Reason: "Completed"},
		},
		{
			name: "success criteria met, pods still terminating",
			job:  job(conds(cond(batchv1.JobSuccessCriteriaMet, corev1.ConditionTrue, "CompletionsReached", ""))),
			want: jobVerdict{Phase: events.PhaseSucceeded, Terminal: true, Outcome: events.OutcomeSucceeded, Reason: "CompletionsReached"},
		},
		{
			name: "backoff limit exceeded",
			job:  job(conds(cond(batchv1.JobFailureTarget, corev1.ConditionTrue, "BackoffLimitExceeded", "x"), cond(batchv1.JobFailed, corev1.ConditionTrue, "BackoffLimitExceeded", "Job has reached the specified backoff limit"))),
			want: jobVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "BackoffLimitExceeded", Message: "Job has reached the specified backoff limit"},
		},
		{
			name: "deadline exceeded",
			job:  job(conds(cond(batchv1.JobFailed, corev1.ConditionTrue, "DeadlineExceeded", "Job was active longer than specified deadline"))),
			want: jobVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeTimedOut, Reason: "DeadlineExceeded", Message: "Job was active longer than specified deadline"},
		},
		{
			name: "deadline exceeded, pods still terminating",
			job:  job(ready(1, 1), conds(cond(batchv1.JobFailureTarget, corev1.ConditionTrue, "DeadlineExceeded", "deadline"))),
			want: jobVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeTimedOut, Reason: "DeadlineExceeded", Message: "deadline"},
		},
		{
			name: "pod failure policy",
			job:  job(conds(cond(batchv1.JobFailed, corev1.ConditionTrue, "PodFailurePolicy", "Container agent exited with 42"))),
			want: jobVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "PodFailurePolicy", Message: "Container agent exited with 42"},
		},
		{
			name: "failed without reason",
			job:  job(conds(cond(batchv1.JobFailed, corev1.ConditionTrue, "", ""))),
			want: jobVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeFailed, Reason: "Failed"},
		},
		{
			name: "false conditions do not count",
			job:  job(ready(1, 1), conds(cond(batchv1.JobFailed, corev1.ConditionFalse, "DeadlineExceeded", ""), cond(batchv1.JobComplete, corev1.ConditionFalse, "", ""))),
			want: jobVerdict{Phase: events.PhaseRunning},
		},
		{
			name: "deleted while running",
			job:  job(ready(1, 1), deleted),
			want: jobVerdict{Phase: events.PhaseFailed, Terminal: true, Outcome: events.OutcomeCancelled, Reason: "JobDeleted", Message: "the Job was deleted before the run finished"},
		},
		{
			name: "deleted after completing",
			job:  job(deleted, conds(cond(batchv1.JobComplete, corev1.ConditionTrue, "CompletionsReached", ""))),
			want: jobVerdict{Phase: events.PhaseSucceeded, Terminal: true, Outcome: events.OutcomeSucceeded, Reason: "CompletionsReached"},
		},
		{
			name: "suspended",
			job:  job(conds(cond(batchv1.JobSuspended, corev1.ConditionTrue, "JobSuspended", "Job suspended"))),
			want: jobVerdict{Phase: events.PhasePending, Reason: "Suspended", Message: "Job suspended"},
		},
	}
	for _, tc := range tests {
		forms(t, tc.name, tc.job, nil, func(t *testing.T, job *batchv1.Job, _ *corev1.Pod) {
			if diff := cmp.Diff(tc.want, classifyJob(job)); diff != "" {
				t.Errorf("classifyJob (-want +got):\n%s", diff)
			}
		})
	}
}
