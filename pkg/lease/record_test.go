package lease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// newRecords returns lease records in a fresh KUBECLIP_LEASES bucket on a real JetStream server.
func newRecords(t *testing.T) lease.Records {
	t.Helper()
	_, _, js := natstest.Start(t)
	kv, err := js.CreateKeyValue(t.Context(), events.Options{}.LeaseBucketConfig())
	if err != nil {
		t.Fatalf("creating the lease bucket: %v", err)
	}
	return lease.Records{KV: kv}
}

func record(runID, workload string) lease.Record {
	expires := time.Date(2026, 8, 24, 11, 30, 0, 0, time.UTC)
	return lease.Record{
		RunID: runID, CompanyID: "acme", AgentID: "agent-1",
		Namespace: "paperclip-acme", WorkloadName: workload, SecretName: workload + "-env",
		Backend: "job", State: lease.StateDispatching,
		CreatedAt: time.Date(2026, 8, 24, 10, 30, 0, 0, time.UTC), ExpiresAt: &expires,
	}
}

func TestRecordsCreateKeepsTheFirstRecord(t *testing.T) {
	tests := []struct {
		name  string
		runID string
	}{
		{name: "run id that is a KV key", runID: "0b7c2f2e-5d4e-4c1a-9f57-3c2d1e0a9b8c"},
		{name: "run id that needs encoding", runID: "run:1#ä"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			records := newRecords(t)
			first := record(tc.runID, "pc-01jaaaaaaaaaaaaaaaaaaaaaaa")
			second := record(tc.runID, "pc-01jbbbbbbbbbbbbbbbbbbbbbbb")
			second.CreatedAt = second.CreatedAt.Add(time.Minute)

			got1, rev1, err := records.Create(t.Context(), first)
			if err != nil {
				t.Fatalf("first Create() error: %v", err)
			}
			got2, rev2, err := records.Create(t.Context(), second)
			if err != nil {
				t.Fatalf("second Create() error: %v", err)
			}
			if diff := cmp.Diff(first, got1); diff != "" {
				t.Errorf("first Create() (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(first, got2); diff != "" {
				t.Errorf("second Create() returned (-want first record +got):\n%s", diff)
			}
			if rev1 == 0 || rev2 != rev1 {
				t.Errorf("revisions: first %d, second %d; want the same non-zero revision", rev1, rev2)
			}

			got, rev, err := records.Get(t.Context(), tc.runID)
			if err != nil {
				t.Fatalf("Get() error: %v", err)
			}
			if diff := cmp.Diff(first, got); diff != "" {
				t.Errorf("Get() (-want +got):\n%s", diff)
			}
			if rev != rev1 {
				t.Errorf("Get() revision %d, want %d", rev, rev1)
			}
		})
	}
}

func TestRecordsGetMissing(t *testing.T) {
	records := newRecords(t)
	if _, _, err := records.Create(t.Context(), record("other-run", "pc-01jaaaaaaaaaaaaaaaaaaaaaaa")); err != nil {
		t.Fatalf("Create() error: %v", err)
	}
	_, rev, err := records.Get(t.Context(), "missing-run")
	if !errors.Is(err, lease.ErrNotFound) {
		t.Fatalf("Get() error %v, want lease.ErrNotFound", err)
	}
	if rev != 0 {
		t.Errorf("Get() revision %d, want 0", rev)
	}
}

func TestRecordsUpdate(t *testing.T) {
	records := newRecords(t)
	rec, rev, err := records.Create(t.Context(), record("run-1", "pc-01jaaaaaaaaaaaaaaaaaaaaaaa"))
	if err != nil {
		t.Fatalf("Create() error: %v", err)
	}

	rec.State = lease.StateCreated
	next, err := records.Update(t.Context(), rec, rev)
	if err != nil {
		t.Fatalf("Update() at the current revision: %v", err)
	}
	if next <= rev {
		t.Errorf("Update() revision %d, want more than %d", next, rev)
	}

	stale := rec
	stale.State = lease.StateReleased
	if _, err := records.Update(t.Context(), stale, rev); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Fatalf("Update() at stale revision %d: error %v, want jetstream.ErrKeyExists", rev, err)
	}

	got, gotRev, err := records.Get(t.Context(), "run-1")
	if err != nil {
		t.Fatalf("Get() error: %v", err)
	}
	if diff := cmp.Diff(rec, got); diff != "" {
		t.Errorf("record after the stale update (-want +got):\n%s", diff)
	}
	if gotRev != next {
		t.Errorf("Get() revision %d, want %d", gotRev, next)
	}
}

func TestStateEnded(t *testing.T) {
	tests := []struct {
		state lease.State
		want  bool
	}{
		{lease.StateDispatching, false},
		{lease.StateCreated, false},
		{lease.StateReleased, true},
		{lease.StateDestroyed, true},
		{"", false},
	}
	for _, tc := range tests {
		t.Run(string(tc.state), func(t *testing.T) {
			if got := tc.state.Ended(); got != tc.want {
				t.Errorf("State(%q).Ended() = %v, want %v", tc.state, got, tc.want)
			}
		})
	}
}

// TestModifyRetriesAfterAConcurrentUpdate: Modify reads the record again when another writer
// updated it between its read and its write, and applies the change to the newer record.
func TestModifyRetriesAfterAConcurrentUpdate(t *testing.T) {
	records := newRecords(t)
	ctx := t.Context()
	if _, _, err := records.Create(ctx, lease.Record{RunID: "run-m", CompanyID: "acme", State: lease.StateCreated}); err != nil {
		t.Fatal(err)
	}
	calls := 0
	got, err := records.Modify(ctx, "run-m", func(r *lease.Record) bool {
		calls++
		if calls == 1 {
			// Another writer gets in first: the run's result marks the lease finished.
			rec, rev, err := records.Get(ctx, "run-m")
			if err != nil {
				t.Fatal(err)
			}
			rec.State = lease.StateFinished
			if _, err := records.Update(ctx, rec, rev); err != nil {
				t.Fatal(err)
			}
		}
		r.State = lease.StateReleased
		return true
	})
	if err != nil {
		t.Fatalf("Modify: %v", err)
	}
	if calls != 2 || got.State != lease.StateReleased {
		t.Errorf("calls %d, state %s; want a second attempt ending released", calls, got.State)
	}
	stored, _, err := records.Get(ctx, "run-m")
	if err != nil || stored.State != lease.StateReleased {
		t.Errorf("stored state %s (err %v), want released", stored.State, err)
	}
}
