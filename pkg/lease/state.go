package lease

import (
	"errors"
	"fmt"
	"time"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// State is where a lease is in its life:
//
//	requested ──Dispatch──▶ dispatching ──Created──▶ created ──Finish──▶ finished
//	    │                       │                       │                  │
//	    │ Fail                  │ Fail                  └──────┬───────────┘
//	    ▼                       ▼                              │ BeginRelease
//	  failed                  failed            (from requested, dispatching too)
//	                                                           ▼
//	                                            releasing ──Released──▶ released | destroyed
//
// A released lease can still be destroyed (its Secret goes too). failed, released and
// destroyed are final for the acquire: a replayed acquire of such a lease does nothing.
//
// A reusable lease (Record.Reusable) outlives its run: Paperclip's host resumes it for the
// agent's next run (docs/reuse.md, The host's rules). The host's release keeps its pod for an idle
// window and its volume until a destroy:
//
//	created ──Release──▶ retained ──BeginSuspend──▶ suspending ──Suspended──▶ suspended
//	  ▲  ▲                  │      (idle window over)  (pod being deleted)          │
//	  │  └──────Resume──────┘                                                       │ Resume
//	  │        (at once)                                                            ▼
//	  └───────────────────────────────Resumed (new pod ready) ◀──────────────── resuming
//
//	suspended ──Collect (max age over)──▶ releasing ──Released──▶ collected
//	any state ──BeginRelease(destroy)──▶ releasing ──Released──▶ destroyed
//
// Destroying is releasing with Ending destroy: what it deletes (pod, Secret, volume) and its
// receipt are those of any destroy. A reusable lease never ends as released: a release keeps it,
// and one with nothing worth keeping is destroyed (see Release). retained, suspending, suspended
// and resuming are neither Live nor Ended: the host released the lease or is resuming it.
type State string

// Lease states.
const (
	// StateRequested: the tenant-worker accepted the acquire; nothing exists in the cluster.
	StateRequested State = "requested"
	// StateDispatching: the workload name is chosen; the workload may or may not exist yet.
	StateDispatching State = "dispatching"
	// StateCreated: the workload exists and `created` was published.
	StateCreated State = "created"
	// StateFinished: the run's result was published; the workload may linger until its TTL
	// or a release.
	StateFinished State = "finished"
	// StateFailed: the acquire failed for good and `failed` was published; whatever it had
	// created was removed.
	StateFailed State = "failed"
	// StateReleasing: a release or destroy is deleting the workload.
	StateReleasing State = "releasing"
	// StateReleased and StateDestroyed: the workload is gone and `released` was published.
	StateReleased  State = "released"
	StateDestroyed State = "destroyed"

	// StateRetained: the host released a reusable lease; its pod stays up for the operator's
	// idle window, so the agent's next run resumes it at once.
	StateRetained State = "retained"
	// StateSuspending: the idle window of a retained lease is over and its pod is being
	// deleted; its volume stays.
	StateSuspending State = "suspending"
	// StateSuspended: a reusable lease without a pod; its volume holds the workspace and the
	// agent's home until a resume, a destroy or the operator's maximum age.
	StateSuspended State = "suspended"
	// StateResuming: the host resumed a suspended lease; a new pod on its volume (the next
	// Generation) is being made ready.
	StateResuming State = "resuming"
	// StateCollected: a suspended lease stayed past the operator's maximum age; its pod,
	// Secret and volume are gone.
	StateCollected State = "collected"
)

// Ended reports whether the lease was released, destroyed or collected, or is being.
func (s State) Ended() bool {
	return s == StateReleasing || s == StateReleased || s == StateDestroyed || s == StateCollected
}

// Kept reports whether the host released a reusable lease that kubeclip keeps for a resume: its
// pod kept for the idle window (retained), or deleted with its volume kept (suspending,
// suspended). For the lease's run that release was its normal end, as an ordinary release is.
func (s State) Kept() bool {
	return s == StateRetained || s == StateSuspending || s == StateSuspended
}

// Live reports whether the lease's run may still start or run: it was neither ended nor
// failed nor finished.
func (s State) Live() bool {
	return s == StateRequested || s == StateDispatching || s == StateCreated
}

// ErrEnded is returned by a transition refused because the lease was released, destroyed or
// is being; ErrFailed because its acquire failed; ErrFinished because its run has its result.
// The caller undoes what it did (a dispatch deletes the workload it created) and stops.
var (
	ErrEnded    = errors.New("lease was released")
	ErrFailed   = errors.New("lease's acquire failed")
	ErrFinished = errors.New("lease's run is over")
)

// The refusals of a reusable lease's transitions. ErrNotReusable: the transition is a reusable
// lease's and the lease is not one. ErrReusable: BeginRelease with kind release on a reusable
// lease, whose release keeps it (Release decides). ErrInUse: a suspend or collect of a lease the
// host resumed meanwhile; the caller leaves the lease alone (a suspend that deleted its
// generation's pod is done: the resume made the next one). ErrNotDue: the idle window or the
// maximum age is not over (a resume and a release since restarted it). ErrSuspended: a resume's
// new pod came up after the lease was released again and suspended, or after a later resume
// took over; the caller deletes the pod it made.
var (
	ErrNotReusable = errors.New("lease is not reusable")
	ErrReusable    = errors.New("lease is reusable: a release keeps it")
	ErrInUse       = errors.New("lease was resumed")
	ErrNotDue      = errors.New("lease's window is not over")
	ErrSuspended   = errors.New("lease was suspended")
)

// errTransition is a transition the state machine does not have: a bug, or two kubeclip
// installations writing one bucket.
type errTransition struct {
	from State
	what string
}

func (e *errTransition) Error() string {
	return fmt.Sprintf("lease in state %s cannot %s", e.from, e.what)
}

// stopped maps the states a run can no longer move on from to their error.
func (r *Record) stopped() error {
	switch {
	case r.State.Ended():
		return ErrEnded
	case r.State == StateFailed:
		return ErrFailed
	case r.State == StateFinished:
		return ErrFinished
	}
	return nil
}

// Workload is what the dispatch transition fixes about a run's workload.
type Workload struct {
	Namespace, Name, SecretName, Backend string
	// VolumeClaim is a reusable lease's PersistentVolumeClaim; empty for any other lease.
	VolumeClaim string
	// ExpiresAt is the lease's hard stop, when it has one.
	ExpiresAt *time.Time
	// RunDeadline is how long from its acquire ExpiresAt is: a reusable lease keeps it to renew
	// its expiry on each resume (Record.RunDeadlineSec).
	RunDeadline time.Duration
	// Warm: the workload is a warm pod the acquire bound (Record.Warm).
	Warm bool
}

// Dispatch moves a requested lease to dispatching with w. A lease already dispatching or
// created keeps the workload it has (a redelivered dispatch reuses the name). A reusable lease
// needs a volume claim and any other lease must have none: the volume is what a resume keeps.
// To be used with Records.Modify.
func Dispatch(w Workload) func(*Record) (bool, error) {
	return func(r *Record) (bool, error) {
		if err := r.stopped(); err != nil {
			return false, err
		}
		if r.State != StateRequested {
			return false, nil
		}
		if r.Reusable != (w.VolumeClaim != "") {
			return false, &errTransition{from: r.State, what: fmt.Sprintf("be dispatched with volume claim %q (reusable %v)", w.VolumeClaim, r.Reusable)}
		}
		r.State = StateDispatching
		r.Namespace, r.WorkloadName, r.SecretName, r.Backend = w.Namespace, w.Name, w.SecretName, w.Backend
		r.VolumeClaim, r.Warm = w.VolumeClaim, w.Warm
		r.ExpiresAt = w.ExpiresAt
		if r.Reusable {
			r.RunDeadlineSec = int64(w.RunDeadline / time.Second)
		}
		return true, nil
	}
}

// Created moves a dispatching lease to created once its workload exists. It fails with ErrEnded
// when a release came meanwhile: the run must not be announced, and its workload goes.
func Created(r *Record) (bool, error) {
	if err := r.stopped(); err != nil {
		return false, err
	}
	switch r.State {
	case StateCreated:
		return false, nil
	case StateDispatching:
		r.State = StateCreated
		return true, nil
	}
	return false, &errTransition{from: r.State, what: "be created"}
}

// Fail records that the acquire failed for good with code. A lease that already moved on
// (created, ended) is not failed: the failure of a late duplicate must not undo it.
func Fail(code events.Code) func(*Record) (bool, error) {
	return func(r *Record) (bool, error) {
		switch r.State {
		case StateRequested, StateDispatching:
			r.State, r.Failure = StateFailed, code
			return true, nil
		case StateFailed:
			return false, nil
		}
		return false, r.stopped()
	}
}

// Finish records that the run's result was published.
func Finish(r *Record) (bool, error) {
	if r.State != StateCreated && r.State != StateDispatching {
		return false, nil
	}
	r.State = StateFinished
	return true, nil
}

// BeginRelease starts ending the lease for a release or destroy (kind), from any state: a lease
// still requested or dispatching ends before its run starts (the dispatch sees ErrEnded and
// undoes its work), a failed one has nothing to delete. A destroy after a release deletes what
// the release kept (the Secret). It reports false when the lease already ended the same way
// or more thoroughly. A reusable lease's release is Release's: BeginRelease refuses it with
// ErrReusable, so no release path deletes the volume a resume needs.
func BeginRelease(kind events.LeaseKind, cancelActiveWork bool) func(*Record) (bool, error) {
	return func(r *Record) (bool, error) {
		if r.Reusable && kind == events.LeaseRelease {
			return false, ErrReusable
		}
		return beginEnding(r, kind, cancelActiveWork), nil
	}
}

// beginEnding moves the lease to releasing for kind unless it already ended that way or more
// thoroughly.
func beginEnding(r *Record, kind events.LeaseKind, cancelActiveWork bool) bool {
	if r.State == StateDestroyed || r.State == StateCollected || (r.State == StateReleased && kind == events.LeaseRelease) {
		return false
	}
	if r.State == StateReleasing && (r.Ending == kind || r.Ending == events.LeaseDestroy) {
		return false
	}
	r.State, r.Ending = StateReleasing, kind
	r.CancelActiveWork = r.CancelActiveWork || cancelActiveWork
	return true
}

// Released records that the workload is gone and `released` may be published: a release ends
// released, a destroy destroyed, a collection collected.
func Released(r *Record) (bool, error) {
	final := StateReleased
	switch {
	case r.Collected:
		final = StateCollected
	case r.Ending == events.LeaseDestroy:
		final = StateDestroyed
	}
	switch r.State {
	case final:
		return false, nil
	case StateReleasing:
		r.State = final
		return true, nil
	}
	return false, &errTransition{from: r.State, what: "be released"}
}

// Release is what the host's release (not a destroy: BeginRelease) does to a lease at now.
// A lease that is not reusable starts ending, as BeginRelease. A reusable lease whose pod is up
// or coming (created, resuming) is retained from now: its commands finish, or are cancelled
// with cancelActiveWork, and its pod stays for the idle window. One the host released already
// (retained, suspending, suspended) stays as it is; a cancelActiveWork still reaches a retained
// lease's commands. One that never got a pod, or whose pod ended on its own (requested,
// dispatching, failed, finished), has nothing a resume could use: it is destroyed, volume and
// all.
func Release(now time.Time, cancelActiveWork bool) func(*Record) (bool, error) {
	return func(r *Record) (bool, error) {
		if !r.Reusable {
			return beginEnding(r, events.LeaseRelease, cancelActiveWork), nil
		}
		switch r.State {
		case StateCreated, StateResuming:
			at := now.UTC()
			r.State, r.RetainedAt, r.CancelActiveWork = StateRetained, &at, cancelActiveWork
			return true, nil
		case StateRetained:
			if cancelActiveWork && !r.CancelActiveWork {
				r.CancelActiveWork = true
				return true, nil
			}
			return false, nil
		case StateSuspending, StateSuspended:
			return false, nil
		}
		return beginEnding(r, events.LeaseDestroy, cancelActiveWork), nil
	}
}

// BeginSuspend starts suspending a retained lease whose idle window (from its last release) is
// over at now, or a lease in use past its expiry (ExpiresAt: its run's time is up, as a pod's
// activeDeadlineSeconds would end it, but its volume stays): its pod is deleted, its volume
// kept. It refuses a lease the host resumed since, or one in use within its expiry (ErrInUse),
// and one whose window is not over (ErrNotDue). The pod to delete is the record's Generation's.
func BeginSuspend(now time.Time, idle time.Duration) func(*Record) (bool, error) {
	return func(r *Record) (bool, error) {
		if !r.Reusable {
			return false, ErrNotReusable
		}
		switch r.State {
		case StateSuspending, StateSuspended:
			return false, nil
		case StateCreated:
			if !r.Expired(now) {
				return false, ErrInUse
			}
			r.State = StateSuspending
			return true, nil
		case StateResuming:
			return false, ErrInUse
		case StateRetained:
			if r.RetainedAt != nil && now.Before(r.RetainedAt.Add(idle)) {
				return false, ErrNotDue
			}
			r.State = StateSuspending
			return true, nil
		}
		if err := r.stopped(); err != nil {
			return false, err
		}
		return false, &errTransition{from: r.State, what: "be suspended"}
	}
}

// Suspended records at now that the pod of generation is gone. It refuses with ErrInUse when
// the host resumed the lease meanwhile, so its Generation moved on: that generation's pod is
// the resume's, and the lease is not suspended.
func Suspended(now time.Time, generation int) func(*Record) (bool, error) {
	return func(r *Record) (bool, error) {
		if err := r.stopped(); err != nil {
			return false, err
		}
		if r.Generation != generation {
			return false, ErrInUse
		}
		switch r.State {
		case StateSuspended:
			return false, nil
		case StateSuspending:
			at := now.UTC()
			r.State, r.SuspendedAt = StateSuspended, &at
			return true, nil
		case StateCreated, StateResuming, StateRetained:
			return false, ErrInUse
		}
		return false, &errTransition{from: r.State, what: "be suspended"}
	}
}

// Resume is the host's resume at now of a reusable lease. A retained lease is live again at
// once (created, same pod); a suspended or suspending one is resuming: a new pod, the next
// Generation, on its volume. Either way its expiry is renewed: RunDeadlineSec from now (none
// for a lease that kept no run deadline). A created or resuming lease stays as it is (the host
// resumes within one run too, and retries). A resume clears the previous run's cancelActiveWork.
// A lease that ended, failed or whose pod ended on its own is refused with ErrEnded, ErrFailed
// or ErrFinished: the plugin answers so that the host acquires afresh
// (docs/reuse.md, The host's rules).
func Resume(now time.Time) func(*Record) (bool, error) {
	return func(r *Record) (bool, error) {
		if !r.Reusable {
			return false, ErrNotReusable
		}
		switch r.State {
		case StateCreated, StateResuming:
			return false, nil
		case StateRetained:
			r.State, r.ResumedFrom = StateCreated, events.ResumedFromRetained
		case StateSuspending, StateSuspended:
			r.State, r.ResumedFrom = StateResuming, events.ResumedFromSuspended
			r.Generation++
		default:
			if err := r.stopped(); err != nil {
				return false, err
			}
			return false, &errTransition{from: r.State, what: "be resumed"}
		}
		r.Resumes++
		r.RetainedAt, r.SuspendedAt, r.CancelActiveWork = nil, nil, false
		r.ExpiresAt = nil
		if r.RunDeadlineSec > 0 {
			at := now.UTC().Truncate(time.Second).Add(time.Duration(r.RunDeadlineSec) * time.Second)
			r.ExpiresAt = &at
		}
		return true, nil
	}
}

// Expired reports whether the lease's expiry (ExpiresAt) is over at now.
func (r Record) Expired(now time.Time) bool {
	return r.ExpiresAt != nil && !now.Before(*r.ExpiresAt)
}

// Resumed records that the pod of generation, made by a resume, is ready to run commands. A
// lease the host released again meanwhile stays retained (its pod stays for the idle window).
// It fails with ErrSuspended when that generation was suspended since (a later resume may have
// taken over) and with ErrEnded when the lease was destroyed: the caller deletes the pod it made.
func Resumed(generation int) func(*Record) (bool, error) {
	return func(r *Record) (bool, error) {
		if err := r.stopped(); err != nil {
			return false, err
		}
		if r.Generation != generation {
			return false, ErrSuspended
		}
		switch r.State {
		case StateResuming:
			r.State = StateCreated
			return true, nil
		case StateCreated, StateRetained:
			return false, nil
		case StateSuspending, StateSuspended:
			return false, ErrSuspended
		}
		return false, &errTransition{from: r.State, what: "be resumed"}
	}
}

// Collect starts ending a suspended lease whose maximum age (from its suspension) is over at
// now: pod, Secret and volume go, and it ends collected. It refuses a lease the host resumed
// since (ErrInUse), one not suspended long enough (ErrNotDue), and one that is ending for
// another reason (ErrEnded); a collection under way is left as it is.
func Collect(now time.Time, maxAge time.Duration) func(*Record) (bool, error) {
	return func(r *Record) (bool, error) {
		if !r.Reusable {
			return false, ErrNotReusable
		}
		switch r.State {
		case StateSuspended:
			if r.SuspendedAt != nil && now.Before(r.SuspendedAt.Add(maxAge)) {
				return false, ErrNotDue
			}
			r.State, r.Ending, r.Collected = StateReleasing, events.LeaseDestroy, true
			return true, nil
		case StateSuspending:
			return false, ErrNotDue
		case StateCreated, StateResuming, StateRetained:
			return false, ErrInUse
		}
		if r.Collected {
			return false, nil
		}
		if err := r.stopped(); err != nil {
			return false, err
		}
		return false, &errTransition{from: r.State, what: "be collected"}
	}
}
