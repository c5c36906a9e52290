package k8s

import (
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// Phase is where a run's workload is, as Paperclip shows it.
type Phase string

// Phases.
const (
	PhasePending   Phase = "Pending"
	PhaseRunning   Phase = "Running"
	PhaseSucceeded Phase = "Succeeded"
	PhaseFailed    Phase = "Failed"
)

// Outcome is how a terminal run ended.
type Outcome string

// Outcomes.
const (
	OutcomeSucceeded Outcome = "succeeded"
	OutcomeFailed    Outcome = "failed"
	OutcomeTimedOut  Outcome = "timed_out"
	OutcomeCancelled Outcome = "cancelled"
)

// Reasons this package sets itself (others are copied from Kubernetes as they are).
const (
	ReasonCompleted           = "Completed"
	ReasonError               = "Error"
	ReasonOOMKilled           = "OOMKilled"
	ReasonDeadlineExceeded    = "DeadlineExceeded"
	ReasonEvicted             = "Evicted"
	ReasonUnschedulable       = corev1.PodReasonUnschedulable
	ReasonPodFailed           = "PodFailed"
	ReasonPodDeleted          = "PodDeleted"
	ReasonJobDeleted          = "JobDeleted"
	ReasonInitContainerFailed = "InitContainerFailed"
	ReasonSuspended           = "Suspended"
)

// oomExitCode is what a container killed by the OOM killer exits with (128 + SIGKILL) when the
// runtime does not report one.
const oomExitCode = 137

// fatalWaitingReasons are container waiting reasons that fail a run without waiting for its
// deadline, which would report them minutes late as timeouts. The value says whether the reason
// is certain at once (true: the image is not on the node and will never be pulled, or its name
// is malformed) or only once it has lasted ClassifyOptions.StartErrorGrace (false): an image
// pull can fail on a registry hiccup, and the kubelet reports CreateContainerConfigError with
// "failed to sync secret cache" when it starts a pod before the node authorizer lets it read the
// pod's Secret, which clears on its next sync. A missing Secret or key, a refused container and a
// missing image persist, and the run's Secret is created before its Job so that its absence
// never looks like one of these.
var fatalWaitingReasons = map[string]bool{
	"ErrImageNeverPull":          true,
	"InvalidImageName":           true,
	"ErrImagePull":               false,
	"ImagePullBackOff":           false,
	"CreateContainerConfigError": false,
	"CreateContainerError":       false,
	"RunContainerError":          false,
}

// PodVerdict is what a run's pod says about the run.
type PodVerdict struct {
	Phase    Phase
	Terminal bool
	// Outcome is set when Terminal.
	Outcome Outcome
	// Reason is a CamelCase word (Kubernetes' where it has one); Message is for humans.
	Reason, Message string
	// ExitCode is the named container's exit code once it has terminated.
	ExitCode *int32
	// RecheckAfter, when non-zero, says the verdict changes with time alone (an unschedulable pod
	// whose grace runs out): classify again after this long even if the pod does not change.
	RecheckAfter time.Duration
}

// JobVerdict is what a run's Job says about the run.
type JobVerdict struct {
	Phase    Phase
	Terminal bool
	Outcome  Outcome
	Reason   string
	Message  string
}

// ClassifyOptions are the inputs of ClassifyPod beyond the pod.
type ClassifyOptions struct {
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
	// fails. Zero fails at once. The local cluster showed a transient "failed to sync secret
	// cache" CreateContainerConfigError clearing within a second or two; a worker should give it
	// a few seconds (e.g. 10s), which still beats any deadline.
	StartErrorGrace time.Duration
}

func (o ClassifyOptions) now() time.Time {
	if o.Now.IsZero() {
		return time.Now()
	}
	return o.Now
}

// ClassifyPod decides what pod says about the run whose agent runs in container. It reports a
// terminal failure as soon as one is certain rather than when the pod's phase catches up: a
// fatal waiting reason (see fatalWaitingReasons; the transient-looking ones after
// StartErrorGrace), an unschedulable pod past UnschedulableGrace, a terminated container of a
// pod that never restarts, an eviction. A non-terminal verdict with RecheckAfter set is waiting
// out one of those graces.
//
// A pod being deleted is cancelled unless it had finished before the deletion was requested or
// its container exited 0; a DisruptionTarget condition (preemption, eviction API, taint manager)
// turns that into a failure with the condition's reason.
//
// When the run is a Job, a terminal ClassifyJob verdict is authoritative (a Job deadline deletes
// its pod, which alone looks cancelled); keep the pod's ExitCode.
func ClassifyPod(pod *corev1.Pod, container string, opts ClassifyOptions) PodVerdict {
	if pod == nil {
		return PodVerdict{Phase: PhasePending}
	}
	st := findContainerStatus(pod, container)
	term := terminatedState(st)
	var exit *int32
	if term != nil {
		exit = ptr(term.ExitCode)
	}

	switch pod.Status.Phase {
	case corev1.PodSucceeded:
		return PodVerdict{Phase: PhaseSucceeded, Terminal: true, Outcome: OutcomeSucceeded, Reason: ReasonCompleted, ExitCode: exit}
	case corev1.PodFailed:
		// The kubelet's own verdicts come before any deletion; otherwise a deletion may be
		// what failed the pod.
		if r := pod.Status.Reason; r != ReasonDeadlineExceeded && r != ReasonEvicted {
			if v, ok := deletedVerdict(pod, term); ok {
				return v
			}
		}
		return failedPodVerdict(pod, container, term)
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
		return PodVerdict{Phase: PhaseRunning}
	}
	return PodVerdict{Phase: PhasePending}
}

// failedPodVerdict classifies a pod in phase Failed.
func failedPodVerdict(pod *corev1.Pod, container string, term *corev1.ContainerStateTerminated) PodVerdict {
	v := PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: pod.Status.Reason, Message: pod.Status.Message}
	if term != nil {
		v.ExitCode = ptr(term.ExitCode)
	}
	switch {
	case pod.Status.Reason == ReasonDeadlineExceeded:
		v.Outcome = OutcomeTimedOut
		return v
	case pod.Status.Reason == ReasonEvicted:
		return v
	case term != nil && (term.ExitCode != 0 || term.Reason == ReasonOOMKilled):
		return terminatedVerdict(container, term)
	}
	if v.Reason == "" {
		v.Reason = ReasonPodFailed
	}
	return v
}

// terminatedVerdict classifies a terminated container of a pod that will not restart it.
func terminatedVerdict(container string, term *corev1.ContainerStateTerminated) PodVerdict {
	switch {
	case term.Reason == ReasonOOMKilled:
		code := term.ExitCode
		if code == 0 {
			code = oomExitCode
		}
		return PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: ReasonOOMKilled,
			Message: fmt.Sprintf("container %q was killed for exceeding its memory limit", container), ExitCode: ptr(code)}
	case term.ExitCode == 0:
		return PodVerdict{Phase: PhaseSucceeded, Terminal: true, Outcome: OutcomeSucceeded, Reason: ReasonCompleted, ExitCode: ptr(term.ExitCode)}
	}
	reason := term.Reason
	if reason == "" {
		reason = ReasonError
	}
	msg := fmt.Sprintf("container %q exited with code %d", container, term.ExitCode)
	if term.Message != "" {
		msg += ": " + term.Message
	}
	return PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: reason, Message: msg, ExitCode: ptr(term.ExitCode)}
}

// deletedVerdict classifies a pod with a deletionTimestamp. ok is false when the deletion does
// not decide the run: the pod is not being deleted, its container exited 0, or it terminated
// before the deletion was requested.
func deletedVerdict(pod *corev1.Pod, term *corev1.ContainerStateTerminated) (PodVerdict, bool) {
	if pod.DeletionTimestamp == nil {
		return PodVerdict{}, false
	}
	if term != nil {
		if term.ExitCode == 0 && term.Reason != ReasonOOMKilled {
			return PodVerdict{}, false
		}
		requested := pod.DeletionTimestamp.Time
		if pod.DeletionGracePeriodSeconds != nil {
			requested = requested.Add(-time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second)
		}
		if !term.FinishedAt.IsZero() && term.FinishedAt.Time.Before(requested) {
			return PodVerdict{}, false
		}
	}
	v := PodVerdict{Phase: PhaseFailed, Terminal: true}
	if term != nil {
		v.ExitCode = ptr(term.ExitCode)
	}
	if c := podCondition(pod, corev1.DisruptionTarget); c != nil && c.Status == corev1.ConditionTrue {
		v.Outcome, v.Reason, v.Message = OutcomeFailed, c.Reason, c.Message
		if v.Reason == "" {
			v.Reason = string(corev1.DisruptionTarget)
		}
		return v, true
	}
	v.Outcome, v.Reason, v.Message = OutcomeCancelled, ReasonPodDeleted, "the pod was deleted before the run finished"
	return v, true
}

// fatalWaitingVerdict finds a container (init or regular) stuck for a reason that will not clear
// (see fatalWaitingReasons).
func fatalWaitingVerdict(pod *corev1.Pod, opts ClassifyOptions) (PodVerdict, bool) {
	var pending *PodVerdict // a transient-looking reason still within its grace
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
				if waited := now.Sub(since); waited < opts.StartErrorGrace {
					if pending == nil {
						pending = &PodVerdict{Phase: PhasePending, Reason: w.Reason, Message: msg, RecheckAfter: opts.StartErrorGrace - waited}
					}
					continue
				}
			}
			return PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: w.Reason, Message: msg}, true
		}
	}
	if pending != nil {
		return *pending, true
	}
	return PodVerdict{}, false
}

// failedInitVerdict finds an init container that failed in a pod that never restarts it.
func failedInitVerdict(pod *corev1.Pod) (PodVerdict, bool) {
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever {
		return PodVerdict{}, false
	}
	for _, s := range pod.Status.InitContainerStatuses {
		t := s.State.Terminated
		if t == nil || t.ExitCode == 0 {
			continue
		}
		return PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: ReasonInitContainerFailed,
			Message: fmt.Sprintf("init container %q exited with code %d (%s)", s.Name, t.ExitCode, t.Reason)}, true
	}
	return PodVerdict{}, false
}

// unschedulableVerdict applies ClassifyOptions.UnschedulableGrace to PodScheduled=False/Unschedulable.
func unschedulableVerdict(pod *corev1.Pod, opts ClassifyOptions) (PodVerdict, bool) {
	c := podCondition(pod, corev1.PodScheduled)
	if c == nil || c.Status != corev1.ConditionFalse || c.Reason != corev1.PodReasonUnschedulable {
		return PodVerdict{}, false
	}
	now := opts.now()
	since := c.LastTransitionTime.Time
	if since.IsZero() {
		since = now
	}
	if waited := now.Sub(since); waited < opts.UnschedulableGrace {
		return PodVerdict{Phase: PhasePending, Reason: ReasonUnschedulable, Message: c.Message,
			RecheckAfter: opts.UnschedulableGrace - waited}, true
	}
	return PodVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: ReasonUnschedulable, Message: c.Message}, true
}

// ClassifyJob decides what a run's Job says about the run. The Job controller's interim
// conditions (FailureTarget, SuccessCriteriaMet) already decide the outcome, so they count as
// terminal; a Failed or FailureTarget condition with reason DeadlineExceeded is a timeout. A Job
// being deleted before it finished is cancelled.
func ClassifyJob(job *batchv1.Job) JobVerdict {
	if job == nil {
		return JobVerdict{Phase: PhasePending}
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
				return JobVerdict{Phase: PhaseSucceeded, Terminal: true, Outcome: OutcomeSucceeded, Reason: orDefault(c.Reason, ReasonCompleted), Message: c.Message}
			}
			v := JobVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeFailed, Reason: orDefault(c.Reason, string(c.Type)), Message: c.Message}
			if c.Reason == batchv1.JobReasonDeadlineExceeded {
				v.Outcome = OutcomeTimedOut
			}
			return v
		}
	}
	if job.DeletionTimestamp != nil {
		return JobVerdict{Phase: PhaseFailed, Terminal: true, Outcome: OutcomeCancelled, Reason: ReasonJobDeleted,
			Message: "the Job was deleted before the run finished"}
	}
	for _, c := range job.Status.Conditions {
		if c.Type == batchv1.JobSuspended && c.Status == corev1.ConditionTrue {
			return JobVerdict{Phase: PhasePending, Reason: ReasonSuspended, Message: c.Message}
		}
	}
	running := job.Status.Active > 0
	if job.Status.Ready != nil {
		running = *job.Status.Ready > 0
	}
	if running {
		return JobVerdict{Phase: PhaseRunning}
	}
	return JobVerdict{Phase: PhasePending}
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

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func ptr[T any](v T) *T { return &v }
