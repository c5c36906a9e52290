package lease_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// The times and windows of the reusable-lease tests: released at t0, an idle window of ten
// minutes, a maximum age of a day.
var (
	t0     = time.Date(2026, 8, 24, 10, 30, 0, 0, time.UTC)
	idle   = 10 * time.Minute
	maxAge = 24 * time.Hour
)

func at(t time.Time) *time.Time { return &t }

// reusable is a reusable lease in state s; with, the changes a row makes to it.
func reusable(s lease.State, with ...func(*lease.Record)) lease.Record {
	r := lease.Record{
		RunID: "r1", CompanyID: "c1", State: s, Reusable: true,
		Namespace: "paperclip-c1", WorkloadName: "pc-1", SecretName: "pc-1-env", Backend: "pod", VolumeClaim: "pc-1-home",
	}
	for _, f := range with {
		f(&r)
	}
	return r
}

func retainedAt(t time.Time) func(*lease.Record) {
	return func(r *lease.Record) { r.RetainedAt = at(t) }
}
func suspendedAt(t time.Time) func(*lease.Record) {
	return func(r *lease.Record) { r.SuspendedAt = at(t) }
}
func generation(g int) func(*lease.Record) { return func(r *lease.Record) { r.Generation = g } }
func resumes(n int) func(*lease.Record)    { return func(r *lease.Record) { r.Resumes = n } }
func resumedFrom(f events.ResumedFrom) func(*lease.Record) {
	return func(r *lease.Record) { r.ResumedFrom = f }
}
func cancelling(r *lease.Record) { r.CancelActiveWork = true }
func collected(r *lease.Record)  { r.Collected = true }
func ending(k events.LeaseKind) func(*lease.Record) {
	return func(r *lease.Record) { r.Ending = k }
}
func notReusable(r *lease.Record) { r.Reusable, r.VolumeClaim = false, "" }
func expiresAt(t time.Time) func(*lease.Record) {
	return func(r *lease.Record) { r.ExpiresAt = at(t) }
}
func deadline(secs int64) func(*lease.Record) {
	return func(r *lease.Record) { r.RunDeadlineSec = secs }
}

// TestReusableTransitions is a reusable lease's state machine (state.go): one row per
// transition and starting state, each refusal with its error, and the whole record after it.
func TestReusableTransitions(t *testing.T) {
	type transition = func(*lease.Record) (bool, error)
	withClaim := lease.Workload{Namespace: "paperclip-c1", Name: "pc-1", SecretName: "pc-1-env", Backend: "pod", VolumeClaim: "pc-1-home"}
	noClaim := withClaim
	noClaim.VolumeClaim = ""
	withDeadline := withClaim
	withDeadline.ExpiresAt, withDeadline.RunDeadline = at(t0.Add(600*time.Second)), 600*time.Second
	withDeadlineNoClaim := withDeadline
	withDeadlineNoClaim.VolumeClaim = ""
	release, cancelRelease := lease.Release(t0, false), lease.Release(t0, true)
	destroy := lease.BeginRelease(events.LeaseDestroy, false)
	resume := lease.Resume(t0)
	suspendDue, suspendEarly := lease.BeginSuspend(t0.Add(idle), idle), lease.BeginSuspend(t0.Add(idle-time.Second), idle)
	collectDue, collectEarly := lease.Collect(t0.Add(maxAge), maxAge), lease.Collect(t0.Add(maxAge-time.Second), maxAge)
	requested := reusable(lease.StateRequested, func(r *lease.Record) {
		r.Namespace, r.WorkloadName, r.SecretName, r.Backend, r.VolumeClaim = "", "", "", "", ""
	})
	tests := []struct {
		name        string
		from        lease.Record
		apply       transition
		wantChanged bool
		wantErr     error // nil, a sentinel, or errAny for a transition that does not exist
		want        lease.Record
	}{
		{"dispatch a reusable lease with its claim", requested, lease.Dispatch(withClaim), true, nil, reusable(lease.StateDispatching)},
		{"dispatch a reusable lease keeps its run deadline", requested, lease.Dispatch(withDeadline), true, nil, reusable(lease.StateDispatching, deadline(600), expiresAt(t0.Add(600*time.Second)))},
		{"dispatch a lease that is not reusable keeps none", reusable(lease.StateRequested, notReusable), lease.Dispatch(withDeadlineNoClaim), true, nil, reusable(lease.StateDispatching, notReusable, expiresAt(t0.Add(600*time.Second)))},
		{"dispatch a reusable lease without a claim", requested, lease.Dispatch(noClaim), false, errAny, requested},
		{"dispatch a lease that is not reusable with a claim", reusable(lease.StateRequested, notReusable), lease.Dispatch(withClaim), false, errAny, reusable(lease.StateRequested, notReusable)},

		{"release a lease that is not reusable ends it", reusable(lease.StateCreated, notReusable), release, true, nil, reusable(lease.StateReleasing, notReusable, ending(events.LeaseRelease))},
		{"release a created lease retains it", reusable(lease.StateCreated), release, true, nil, reusable(lease.StateRetained, retainedAt(t0))},
		{"release with cancelActiveWork", reusable(lease.StateCreated), cancelRelease, true, nil, reusable(lease.StateRetained, retainedAt(t0), cancelling)},
		{"a release clears an earlier run's cancelActiveWork", reusable(lease.StateCreated, cancelling), release, true, nil, reusable(lease.StateRetained, retainedAt(t0))},
		{"release a resuming lease retains it", reusable(lease.StateResuming, generation(1)), release, true, nil, reusable(lease.StateRetained, generation(1), retainedAt(t0))},
		{"release a retained lease again", reusable(lease.StateRetained, retainedAt(t0.Add(-time.Hour))), release, false, nil, reusable(lease.StateRetained, retainedAt(t0.Add(-time.Hour)))},
		{"cancel a retained lease's commands", reusable(lease.StateRetained, retainedAt(t0)), cancelRelease, true, nil, reusable(lease.StateRetained, retainedAt(t0), cancelling)},
		{"release a suspending lease", reusable(lease.StateSuspending), cancelRelease, false, nil, reusable(lease.StateSuspending)},
		{"release a suspended lease", reusable(lease.StateSuspended, suspendedAt(t0)), release, false, nil, reusable(lease.StateSuspended, suspendedAt(t0))},
		{"release a dispatching lease destroys it", reusable(lease.StateDispatching), release, true, nil, reusable(lease.StateReleasing, ending(events.LeaseDestroy))},
		{"release a finished lease destroys it", reusable(lease.StateFinished), cancelRelease, true, nil, reusable(lease.StateReleasing, ending(events.LeaseDestroy), cancelling)},
		{"release a failed lease destroys it", reusable(lease.StateFailed), release, true, nil, reusable(lease.StateReleasing, ending(events.LeaseDestroy))},
		{"release a destroyed lease", reusable(lease.StateDestroyed, ending(events.LeaseDestroy)), release, false, nil, reusable(lease.StateDestroyed, ending(events.LeaseDestroy))},
		{"release a collected lease", reusable(lease.StateCollected, ending(events.LeaseDestroy), collected), release, false, nil, reusable(lease.StateCollected, ending(events.LeaseDestroy), collected)},

		{"BeginRelease refuses a reusable lease's release", reusable(lease.StateCreated), lease.BeginRelease(events.LeaseRelease, true), false, lease.ErrReusable, reusable(lease.StateCreated)},
		{"destroy a retained lease", reusable(lease.StateRetained, retainedAt(t0)), destroy, true, nil, reusable(lease.StateReleasing, retainedAt(t0), ending(events.LeaseDestroy))},
		{"destroy a suspended lease", reusable(lease.StateSuspended, suspendedAt(t0)), destroy, true, nil, reusable(lease.StateReleasing, suspendedAt(t0), ending(events.LeaseDestroy))},
		{"destroy a resuming lease", reusable(lease.StateResuming, generation(1)), destroy, true, nil, reusable(lease.StateReleasing, generation(1), ending(events.LeaseDestroy))},
		{"destroy during a collection", reusable(lease.StateReleasing, ending(events.LeaseDestroy), collected), destroy, false, nil, reusable(lease.StateReleasing, ending(events.LeaseDestroy), collected)},
		{"destroy a collected lease", reusable(lease.StateCollected, ending(events.LeaseDestroy), collected), destroy, false, nil, reusable(lease.StateCollected, ending(events.LeaseDestroy), collected)},

		{"suspend once the idle window is over", reusable(lease.StateRetained, retainedAt(t0)), suspendDue, true, nil, reusable(lease.StateSuspending, retainedAt(t0))},
		{"suspend before the idle window is over", reusable(lease.StateRetained, retainedAt(t0)), suspendEarly, false, lease.ErrNotDue, reusable(lease.StateRetained, retainedAt(t0))},
		{"suspend a lease the host resumed", reusable(lease.StateCreated, resumes(1)), suspendDue, false, lease.ErrInUse, reusable(lease.StateCreated, resumes(1))},
		{"suspend a lease in use within its expiry", reusable(lease.StateCreated, expiresAt(t0.Add(idle+time.Second))), suspendDue, false, lease.ErrInUse, reusable(lease.StateCreated, expiresAt(t0.Add(idle+time.Second)))},
		{"suspend a lease in use past its expiry", reusable(lease.StateCreated, expiresAt(t0.Add(idle))), suspendDue, true, nil, reusable(lease.StateSuspending, expiresAt(t0.Add(idle)))},
		{"suspend a resuming lease past its expiry", reusable(lease.StateResuming, generation(1), expiresAt(t0)), suspendDue, false, lease.ErrInUse, reusable(lease.StateResuming, generation(1), expiresAt(t0))},
		{"suspend a resuming lease", reusable(lease.StateResuming, generation(1)), suspendDue, false, lease.ErrInUse, reusable(lease.StateResuming, generation(1))},
		{"suspend a suspending lease", reusable(lease.StateSuspending), suspendDue, false, nil, reusable(lease.StateSuspending)},
		{"suspend a suspended lease", reusable(lease.StateSuspended, suspendedAt(t0)), suspendDue, false, nil, reusable(lease.StateSuspended, suspendedAt(t0))},
		{"suspend a destroyed lease", reusable(lease.StateDestroyed), suspendDue, false, lease.ErrEnded, reusable(lease.StateDestroyed)},
		{"suspend a lease whose pod ended", reusable(lease.StateFinished), suspendDue, false, lease.ErrFinished, reusable(lease.StateFinished)},
		{"suspend a dispatching lease", reusable(lease.StateDispatching), suspendDue, false, errAny, reusable(lease.StateDispatching)},
		{"suspend a lease that is not reusable", reusable(lease.StateCreated, notReusable), suspendDue, false, lease.ErrNotReusable, reusable(lease.StateCreated, notReusable)},

		{"suspended once the pod is gone", reusable(lease.StateSuspending), lease.Suspended(t0, 0), true, nil, reusable(lease.StateSuspended, suspendedAt(t0))},
		{"suspended twice", reusable(lease.StateSuspended, suspendedAt(t0)), lease.Suspended(t0.Add(time.Hour), 0), false, nil, reusable(lease.StateSuspended, suspendedAt(t0))},
		{"suspended after a resume", reusable(lease.StateResuming, generation(1)), lease.Suspended(t0, 0), false, lease.ErrInUse, reusable(lease.StateResuming, generation(1))},
		{"suspended while a later generation is suspending", reusable(lease.StateSuspending, generation(1)), lease.Suspended(t0, 0), false, lease.ErrInUse, reusable(lease.StateSuspending, generation(1))},
		{"suspended after a resume of the retained pod", reusable(lease.StateCreated), lease.Suspended(t0, 0), false, lease.ErrInUse, reusable(lease.StateCreated)},
		{"suspended after a destroy", reusable(lease.StateReleasing, ending(events.LeaseDestroy)), lease.Suspended(t0, 0), false, lease.ErrEnded, reusable(lease.StateReleasing, ending(events.LeaseDestroy))},
		{"suspended without a suspend", reusable(lease.StateDispatching), lease.Suspended(t0, 0), false, errAny, reusable(lease.StateDispatching)},

		{"resume a retained lease at once", reusable(lease.StateRetained, retainedAt(t0), cancelling), resume, true, nil, reusable(lease.StateCreated, resumes(1), resumedFrom(events.ResumedFromRetained))},
		{"resume renews the expiry by the run deadline", reusable(lease.StateRetained, retainedAt(t0), deadline(600), expiresAt(t0.Add(-time.Minute))), lease.Resume(t0.Add(1500 * time.Millisecond)), true, nil, reusable(lease.StateCreated, resumes(1), deadline(600), expiresAt(t0.Add(601*time.Second)), resumedFrom(events.ResumedFromRetained))},
		{"resume of a suspended lease renews it too", reusable(lease.StateSuspended, suspendedAt(t0), deadline(600), expiresAt(t0)), resume, true, nil, reusable(lease.StateResuming, generation(1), resumes(1), deadline(600), expiresAt(t0.Add(600*time.Second)), resumedFrom(events.ResumedFromSuspended))},
		{"resume of a lease with no run deadline keeps no stale expiry", reusable(lease.StateRetained, retainedAt(t0), expiresAt(t0.Add(-time.Minute))), resume, true, nil, reusable(lease.StateCreated, resumes(1), resumedFrom(events.ResumedFromRetained))},
		{"a repeated resume does not renew", reusable(lease.StateCreated, resumes(1), deadline(600), expiresAt(t0)), lease.Resume(t0.Add(time.Hour)), false, nil, reusable(lease.StateCreated, resumes(1), deadline(600), expiresAt(t0))},
		{"resume a suspended lease", reusable(lease.StateSuspended, suspendedAt(t0), resumes(1)), resume, true, nil, reusable(lease.StateResuming, generation(1), resumes(2), resumedFrom(events.ResumedFromSuspended))},
		{"resume a suspending lease", reusable(lease.StateSuspending, retainedAt(t0)), resume, true, nil, reusable(lease.StateResuming, generation(1), resumes(1), resumedFrom(events.ResumedFromSuspended))},
		{"resume a live lease", reusable(lease.StateCreated), resume, false, nil, reusable(lease.StateCreated)},
		{"resume a resuming lease", reusable(lease.StateResuming, generation(1), resumes(1)), resume, false, nil, reusable(lease.StateResuming, generation(1), resumes(1))},
		{"resume a lease being destroyed", reusable(lease.StateReleasing, ending(events.LeaseDestroy)), resume, false, lease.ErrEnded, reusable(lease.StateReleasing, ending(events.LeaseDestroy))},
		{"resume a destroyed lease", reusable(lease.StateDestroyed), resume, false, lease.ErrEnded, reusable(lease.StateDestroyed)},
		{"resume a collected lease", reusable(lease.StateCollected, collected), resume, false, lease.ErrEnded, reusable(lease.StateCollected, collected)},
		{"resume a failed lease", reusable(lease.StateFailed), resume, false, lease.ErrFailed, reusable(lease.StateFailed)},
		{"resume a lease whose pod ended", reusable(lease.StateFinished), resume, false, lease.ErrFinished, reusable(lease.StateFinished)},
		{"resume a requested lease", requested, resume, false, errAny, requested},
		{"resume a lease that is not reusable", reusable(lease.StateCreated, notReusable), resume, false, lease.ErrNotReusable, reusable(lease.StateCreated, notReusable)},

		{"resumed: the new pod is ready", reusable(lease.StateResuming, generation(1)), lease.Resumed(1), true, nil, reusable(lease.StateCreated, generation(1))},
		{"resumed twice", reusable(lease.StateCreated, generation(1)), lease.Resumed(1), false, nil, reusable(lease.StateCreated, generation(1))},
		{"resumed after a release", reusable(lease.StateRetained, generation(1), retainedAt(t0)), lease.Resumed(1), false, nil, reusable(lease.StateRetained, generation(1), retainedAt(t0))},
		{"resumed after a suspend began", reusable(lease.StateSuspending, generation(1)), lease.Resumed(1), false, lease.ErrSuspended, reusable(lease.StateSuspending, generation(1))},
		{"resumed after a suspension", reusable(lease.StateSuspended, generation(1), suspendedAt(t0)), lease.Resumed(1), false, lease.ErrSuspended, reusable(lease.StateSuspended, generation(1), suspendedAt(t0))},
		{"resumed by a resume a later one took over", reusable(lease.StateResuming, generation(2)), lease.Resumed(1), false, lease.ErrSuspended, reusable(lease.StateResuming, generation(2))},
		{"resumed after a destroy", reusable(lease.StateReleasing, generation(1), ending(events.LeaseDestroy)), lease.Resumed(1), false, lease.ErrEnded, reusable(lease.StateReleasing, generation(1), ending(events.LeaseDestroy))},
		{"resumed without a resume", reusable(lease.StateDispatching), lease.Resumed(0), false, errAny, reusable(lease.StateDispatching)},

		{"collect past the maximum age", reusable(lease.StateSuspended, suspendedAt(t0)), collectDue, true, nil, reusable(lease.StateReleasing, suspendedAt(t0), ending(events.LeaseDestroy), collected)},
		{"collect before the maximum age", reusable(lease.StateSuspended, suspendedAt(t0)), collectEarly, false, lease.ErrNotDue, reusable(lease.StateSuspended, suspendedAt(t0))},
		{"collect a suspending lease", reusable(lease.StateSuspending), collectDue, false, lease.ErrNotDue, reusable(lease.StateSuspending)},
		{"collect a retained lease", reusable(lease.StateRetained, retainedAt(t0)), collectDue, false, lease.ErrInUse, reusable(lease.StateRetained, retainedAt(t0))},
		{"collect a resuming lease", reusable(lease.StateResuming, generation(1)), collectDue, false, lease.ErrInUse, reusable(lease.StateResuming, generation(1))},
		{"collect a live lease", reusable(lease.StateCreated), collectDue, false, lease.ErrInUse, reusable(lease.StateCreated)},
		{"collect during a collection", reusable(lease.StateReleasing, ending(events.LeaseDestroy), collected), collectDue, false, nil, reusable(lease.StateReleasing, ending(events.LeaseDestroy), collected)},
		{"collect a lease being destroyed", reusable(lease.StateReleasing, ending(events.LeaseDestroy)), collectDue, false, lease.ErrEnded, reusable(lease.StateReleasing, ending(events.LeaseDestroy))},
		{"collect a requested lease", requested, collectDue, false, errAny, requested},
		{"collect a lease that is not reusable", reusable(lease.StateSuspended, notReusable), collectDue, false, lease.ErrNotReusable, reusable(lease.StateSuspended, notReusable)},

		{"released after a collection", reusable(lease.StateReleasing, ending(events.LeaseDestroy), collected), lease.Released, true, nil, reusable(lease.StateCollected, ending(events.LeaseDestroy), collected)},
		{"released after a collection, twice", reusable(lease.StateCollected, ending(events.LeaseDestroy), collected), lease.Released, false, nil, reusable(lease.StateCollected, ending(events.LeaseDestroy), collected)},
		{"released after a destroy", reusable(lease.StateReleasing, ending(events.LeaseDestroy)), lease.Released, true, nil, reusable(lease.StateDestroyed, ending(events.LeaseDestroy))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.from
			changed, err := tc.apply(&r)
			switch {
			case errors.Is(tc.wantErr, errAny) && err == nil:
				t.Errorf("error nil, want a refused transition")
			case !errors.Is(tc.wantErr, errAny) && !errors.Is(err, tc.wantErr):
				t.Errorf("error %v, want %v", err, tc.wantErr)
			}
			if changed != tc.wantChanged {
				t.Errorf("changed %v, want %v", changed, tc.wantChanged)
			}
			if diff := cmp.Diff(tc.want, r); diff != "" {
				t.Errorf("record (-want +got):\n%s", diff)
			}
			if err != nil && changed {
				t.Errorf("a refused transition reported a change")
			}
		})
	}
}

// TestStateKinds pins which states are Live and which Ended: the reusable lease's states
// between runs are neither, so nothing that starts runs or ends them takes them for its own.
func TestStateKinds(t *testing.T) {
	tests := []struct {
		state     lease.State
		wantLive  bool
		wantEnded bool
	}{
		{lease.StateRequested, true, false},
		{lease.StateDispatching, true, false},
		{lease.StateCreated, true, false},
		{lease.StateFinished, false, false},
		{lease.StateFailed, false, false},
		{lease.StateReleasing, false, true},
		{lease.StateReleased, false, true},
		{lease.StateDestroyed, false, true},
		{lease.StateRetained, false, false},
		{lease.StateSuspending, false, false},
		{lease.StateSuspended, false, false},
		{lease.StateResuming, false, false},
		{lease.StateCollected, false, true},
	}
	for _, tc := range tests {
		if got := tc.state.Live(); got != tc.wantLive {
			t.Errorf("%s.Live() = %v, want %v", tc.state, got, tc.wantLive)
		}
		if got := tc.state.Ended(); got != tc.wantEnded {
			t.Errorf("%s.Ended() = %v, want %v", tc.state, got, tc.wantEnded)
		}
	}
}

// TestReusableLeaseLife follows one reusable lease through Records.Modify on a real JetStream
// server, as the host's calls and kubeclip's timers would move it: the first run, its release,
// the idle window, a resume onto a new pod, the second run's release and a resume at once, and a
// destroy. Each step is stored and read back.
func TestReusableLeaseLife(t *testing.T) {
	records := newRecords(t)
	ctx := t.Context()
	rec := record("acme", "run-1")
	rec.Reusable = true
	if _, _, err := records.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	w := lease.Workload{Namespace: "paperclip-acme", Name: "pc-1", SecretName: "pc-1-env", Backend: "pod", VolumeClaim: "pc-1-home"}
	steps := []struct {
		name           string
		apply          func(*lease.Record) (bool, error)
		wantState      lease.State
		wantGeneration int
		wantResumes    int
	}{
		{"dispatch", lease.Dispatch(w), lease.StateDispatching, 0, 0},
		{"created", lease.Created, lease.StateCreated, 0, 0},
		{"first run released", lease.Release(t0, false), lease.StateRetained, 0, 0},
		{"idle window over", lease.BeginSuspend(t0.Add(idle), idle), lease.StateSuspending, 0, 0},
		{"pod deleted", lease.Suspended(t0.Add(idle+time.Second), 0), lease.StateSuspended, 0, 0},
		{"second run resumes", lease.Resume(t0), lease.StateResuming, 1, 1},
		{"new pod ready", lease.Resumed(1), lease.StateCreated, 1, 1},
		{"second run released", lease.Release(t0.Add(time.Hour), false), lease.StateRetained, 1, 1},
		{"third run resumes at once", lease.Resume(t0), lease.StateCreated, 1, 2},
		{"destroy", lease.BeginRelease(events.LeaseDestroy, true), lease.StateReleasing, 1, 2},
		{"destroyed", lease.Released, lease.StateDestroyed, 1, 2},
	}
	for _, s := range steps {
		got, err := records.Modify(ctx, rec.Ref(), s.apply)
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		stored, _, err := records.Get(ctx, rec.Ref())
		if err != nil {
			t.Fatalf("%s: reading back: %v", s.name, err)
		}
		if diff := cmp.Diff(got, stored); diff != "" {
			t.Errorf("%s: Modify returned (-) what was not stored (+):\n%s", s.name, diff)
		}
		if stored.State != s.wantState || stored.Generation != s.wantGeneration || stored.Resumes != s.wantResumes {
			t.Errorf("%s: state %s, generation %d, resumes %d; want %s, %d, %d",
				s.name, stored.State, stored.Generation, stored.Resumes, s.wantState, s.wantGeneration, s.wantResumes)
		}
	}
	if _, err := records.Modify(ctx, rec.Ref(), lease.Resume(t0)); !errors.Is(err, lease.ErrEnded) {
		t.Errorf("a resume after the destroy: error %v, want ErrEnded", err)
	}
}

// TestTransitionsAreIdempotent runs every transition on a lease in every state, reusable or not,
// and checks what Records.Modify and every redelivered message rely on: a refused or unneeded
// transition leaves the record as it was, one that changed it says so, and the same transition
// applied again finds nothing to do.
func TestTransitionsAreIdempotent(t *testing.T) {
	states := []lease.State{
		lease.StateRequested, lease.StateDispatching, lease.StateCreated, lease.StateFinished, lease.StateFailed,
		lease.StateReleasing, lease.StateReleased, lease.StateDestroyed,
		lease.StateRetained, lease.StateSuspending, lease.StateSuspended, lease.StateResuming, lease.StateCollected,
	}
	transitions := map[string]func(*lease.Record) (bool, error){
		"Dispatch":               lease.Dispatch(lease.Workload{Namespace: "n", Name: "pc-1", SecretName: "s", Backend: "pod", VolumeClaim: "v"}),
		"Dispatch without claim": lease.Dispatch(lease.Workload{Namespace: "n", Name: "pc-1", SecretName: "s", Backend: "pod"}),
		"Created":                lease.Created,
		"Fail":                   lease.Fail(events.CodeInternal),
		"Finish":                 lease.Finish,
		"BeginRelease(release)":  lease.BeginRelease(events.LeaseRelease, false),
		"BeginRelease(destroy)":  lease.BeginRelease(events.LeaseDestroy, true),
		"Released":               lease.Released,
		"Release":                lease.Release(t0, false),
		"Release(cancel)":        lease.Release(t0, true),
		"BeginSuspend":           lease.BeginSuspend(t0.Add(idle), idle),
		"Suspended":              lease.Suspended(t0, 0),
		"Resume":                 lease.Resume(t0),
		"Resumed":                lease.Resumed(0),
		"Collect":                lease.Collect(t0.Add(maxAge), maxAge),
	}
	for _, s := range states {
		for _, reuse := range []bool{false, true} {
			for _, kind := range []events.LeaseKind{"", events.LeaseRelease, events.LeaseDestroy} {
				for name, apply := range transitions {
					from := reusable(s, retainedAt(t0), suspendedAt(t0), ending(kind))
					if !reuse {
						notReusable(&from)
					}
					if s == lease.StateCollected {
						collected(&from)
					}
					r := from
					changed, err := apply(&r)
					label := fmt.Sprintf("%s on %s (reusable %v, ending %q)", name, s, reuse, kind)
					if !changed && !cmp.Equal(from, r) {
						t.Errorf("%s reported no change but changed the record:\n%s", label, cmp.Diff(from, r))
					}
					if err != nil && changed {
						t.Errorf("%s was refused (%v) but reported a change", label, err)
					}
					if !changed {
						continue
					}
					again := r
					changed2, err2 := apply(&again)
					if changed2 || err2 != nil || !cmp.Equal(r, again) {
						t.Errorf("%s applied again: changed %v, error %v, record diff:\n%s", label, changed2, err2, cmp.Diff(r, again))
					}
				}
			}
		}
	}
}
