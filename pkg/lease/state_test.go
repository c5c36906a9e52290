package lease_test

import (
	"errors"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// TestTransitions is the lease's state machine, one row per transition and starting state.
func TestTransitions(t *testing.T) {
	dispatch := lease.Dispatch(lease.Workload{Namespace: "ns", Name: "pc-1", SecretName: "pc-1-env", Backend: "job"})
	release := lease.BeginRelease(events.LeaseRelease, false)
	destroy := lease.BeginRelease(events.LeaseDestroy, true)
	type transition = func(*lease.Record) (bool, error)
	tests := []struct {
		name        string
		from        lease.State
		ending      events.LeaseKind
		apply       transition
		wantChanged bool
		wantErr     error // nil, a sentinel, or errAny for a transition that does not exist
		wantState   lease.State
	}{
		{"dispatch a requested lease", lease.StateRequested, "", dispatch, true, nil, lease.StateDispatching},
		{"dispatch again keeps the name", lease.StateDispatching, "", dispatch, false, nil, lease.StateDispatching},
		{"dispatch a released lease", lease.StateReleased, "", dispatch, false, lease.ErrEnded, lease.StateReleased},
		{"dispatch a lease being released", lease.StateReleasing, events.LeaseRelease, dispatch, false, lease.ErrEnded, lease.StateReleasing},
		{"dispatch a failed lease", lease.StateFailed, "", dispatch, false, lease.ErrFailed, lease.StateFailed},
		{"dispatch a finished lease", lease.StateFinished, "", dispatch, false, lease.ErrFinished, lease.StateFinished},

		{"created after dispatch", lease.StateDispatching, "", lease.Created, true, nil, lease.StateCreated},
		{"created again", lease.StateCreated, "", lease.Created, false, nil, lease.StateCreated},
		{"created after a release came", lease.StateReleasing, events.LeaseRelease, lease.Created, false, lease.ErrEnded, lease.StateReleasing},
		{"created without dispatch", lease.StateRequested, "", lease.Created, false, errAny, lease.StateRequested},

		{"fail a requested lease", lease.StateRequested, "", lease.Fail(events.CodeAgentBusy), true, nil, lease.StateFailed},
		{"fail a dispatching lease", lease.StateDispatching, "", lease.Fail(events.CodeInternal), true, nil, lease.StateFailed},
		{"a late failure does not undo created", lease.StateCreated, "", lease.Fail(events.CodeInternal), false, nil, lease.StateCreated},
		{"a failure after a release", lease.StateReleasing, events.LeaseRelease, lease.Fail(events.CodeInternal), false, lease.ErrEnded, lease.StateReleasing},

		{"finish a created lease", lease.StateCreated, "", lease.Finish, true, nil, lease.StateFinished},
		{"finish a released lease", lease.StateReleased, "", lease.Finish, false, nil, lease.StateReleased},

		{"release a requested lease", lease.StateRequested, "", release, true, nil, lease.StateReleasing},
		{"release a created lease", lease.StateCreated, "", release, true, nil, lease.StateReleasing},
		{"release a failed lease", lease.StateFailed, "", release, true, nil, lease.StateReleasing},
		{"release twice", lease.StateReleasing, events.LeaseRelease, release, false, nil, lease.StateReleasing},
		{"release a released lease", lease.StateReleased, events.LeaseRelease, release, false, nil, lease.StateReleased},
		{"destroy a released lease", lease.StateReleased, events.LeaseRelease, destroy, true, nil, lease.StateReleasing},
		{"destroy upgrades a release under way", lease.StateReleasing, events.LeaseRelease, destroy, true, nil, lease.StateReleasing},
		{"release after destroy", lease.StateDestroyed, events.LeaseDestroy, release, false, nil, lease.StateDestroyed},

		{"released after release", lease.StateReleasing, events.LeaseRelease, lease.Released, true, nil, lease.StateReleased},
		{"released after destroy", lease.StateReleasing, events.LeaseDestroy, lease.Released, true, nil, lease.StateDestroyed},
		{"released twice", lease.StateReleased, events.LeaseRelease, lease.Released, false, nil, lease.StateReleased},
		{"released without a release", lease.StateCreated, "", lease.Released, false, errAny, lease.StateCreated},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := lease.Record{State: tc.from, Ending: tc.ending}
			changed, err := tc.apply(&r)
			switch {
			case errors.Is(tc.wantErr, errAny) && err == nil:
				t.Errorf("error nil, want a refused transition")
			case !errors.Is(tc.wantErr, errAny) && !errors.Is(err, tc.wantErr):
				t.Errorf("error %v, want %v", err, tc.wantErr)
			}
			if changed != tc.wantChanged || r.State != tc.wantState {
				t.Errorf("changed %v, state %s; want %v, %s", changed, r.State, tc.wantChanged, tc.wantState)
			}
		})
	}
}

var errAny = errors.New("any error")
