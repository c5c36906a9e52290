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
)

// Ended reports whether the lease was released or destroyed, or is being.
func (s State) Ended() bool {
	return s == StateReleasing || s == StateReleased || s == StateDestroyed
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
	// ExpiresAt is the lease's hard stop, when it has one.
	ExpiresAt *time.Time
}

// Dispatch moves a requested lease to dispatching with w. A lease already dispatching or
// created keeps the workload it has (a redelivered dispatch reuses the name). To be used with
// Records.Modify.
func Dispatch(w Workload) func(*Record) (bool, error) {
	return func(r *Record) (bool, error) {
		if err := r.stopped(); err != nil {
			return false, err
		}
		if r.State != StateRequested {
			return false, nil
		}
		r.State = StateDispatching
		r.Namespace, r.WorkloadName, r.SecretName, r.Backend = w.Namespace, w.Name, w.SecretName, w.Backend
		r.ExpiresAt = w.ExpiresAt
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
// or more thoroughly.
func BeginRelease(kind events.LeaseKind, cancelActiveWork bool) func(*Record) (bool, error) {
	return func(r *Record) (bool, error) {
		if r.State == StateDestroyed || (r.State == StateReleased && kind == events.LeaseRelease) {
			return false, nil
		}
		if r.State == StateReleasing && (r.Ending == kind || r.Ending == events.LeaseDestroy) {
			return false, nil
		}
		r.State, r.Ending = StateReleasing, kind
		r.CancelActiveWork = r.CancelActiveWork || cancelActiveWork
		return true, nil
	}
}

// Released records that the workload is gone and `released` may be published.
func Released(r *Record) (bool, error) {
	final := StateReleased
	if r.Ending == events.LeaseDestroy {
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
