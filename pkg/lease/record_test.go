package lease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// newRecords returns lease records in a fresh KUBECLIP_LEASES bucket on a real JetStream server.
func newRecords(t *testing.T) lease.Records {
	t.Helper()
	_, _, js := natstest.Start(t)
	kv, err := js.CreateKeyValue(t.Context(), lease.BucketOptions{}.RecordBucketConfig())
	if err != nil {
		t.Fatalf("creating the lease bucket: %v", err)
	}
	return lease.Records{KV: kv}
}

func record(companyID, runID string) lease.Record {
	return lease.Record{
		RunID: runID, CompanyID: companyID, AgentID: "agent-1", State: lease.StateRequested,
		CreatedAt: time.Date(2026, 8, 24, 10, 30, 0, 0, time.UTC),
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
			first := record("acme", tc.runID)
			second := record("acme", tc.runID)
			second.AgentID = "agent-2"

			got1, created1, err := records.Create(t.Context(), first)
			if err != nil || !created1 {
				t.Fatalf("first Create() = created %v, error %v", created1, err)
			}
			got2, created2, err := records.Create(t.Context(), second)
			if err != nil || created2 {
				t.Fatalf("second Create() = created %v, error %v; want the existing record", created2, err)
			}
			if diff := cmp.Diff(first, got1); diff != "" {
				t.Errorf("first Create() (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(first, got2); diff != "" {
				t.Errorf("second Create() returned (-want first record +got):\n%s", diff)
			}
			got, rev, err := records.Get(t.Context(), first.Ref())
			if err != nil || rev == 0 {
				t.Fatalf("Get() = revision %d, error %v", rev, err)
			}
			if diff := cmp.Diff(first, got); diff != "" {
				t.Errorf("Get() (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRecordsAreScopedByCompany is issue 8.3: run ids are Paperclip's, and one company can send
// another's. Records of two companies with the same run id are two records.
func TestRecordsAreScopedByCompany(t *testing.T) {
	records := newRecords(t)
	ctx := t.Context()
	a, b := record("company-a", "run-1"), record("company-b", "run-1")
	a.AgentID, b.AgentID = "agent-a", "agent-b"
	for _, rec := range []lease.Record{a, b} {
		if _, created, err := records.Create(ctx, rec); err != nil || !created {
			t.Fatalf("Create(%s) = created %v, error %v; want a record of its own", rec.CompanyID, created, err)
		}
	}
	if _, err := records.Modify(ctx, b.Ref(), lease.BeginRelease(events.LeaseRelease, false)); err != nil {
		t.Fatal(err)
	}
	got, _, err := records.Get(ctx, a.Ref())
	if err != nil || got.State != lease.StateRequested || got.AgentID != "agent-a" {
		t.Errorf("company A's record after company B's release: %+v (err %v); want it untouched", got, err)
	}
	if _, _, err := records.Get(ctx, events.Ref("company-c", "run-1")); !errors.Is(err, lease.ErrNotFound) {
		t.Errorf("Get(company-c) error %v, want lease.ErrNotFound", err)
	}
}

// TestModifyRetriesAfterAConcurrentUpdate: Modify reads the record again when another writer
// updated it between its read and its write, and applies the change to the newer record.
func TestModifyRetriesAfterAConcurrentUpdate(t *testing.T) {
	records := newRecords(t)
	ctx := t.Context()
	rec := record("acme", "run-m")
	rec.State = lease.StateDispatching
	if _, _, err := records.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}
	calls := 0
	_, err := records.Modify(ctx, rec.Ref(), func(r *lease.Record) (bool, error) {
		calls++
		if calls == 1 {
			// A release gets in first.
			if _, err := records.Modify(ctx, rec.Ref(), lease.BeginRelease(events.LeaseRelease, false)); err != nil {
				t.Fatal(err)
			}
		}
		return lease.Created(r)
	})
	if calls != 2 || !errors.Is(err, lease.ErrEnded) {
		t.Errorf("calls %d, error %v; want a second attempt refused with ErrEnded", calls, err)
	}
	stored, _, err := records.Get(ctx, rec.Ref())
	if err != nil || stored.State != lease.StateReleasing {
		t.Errorf("stored state %s (err %v), want releasing", stored.State, err)
	}
}
