package lease_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// quotaEnv is the lease bucket and the counters' bucket on one real JetStream server.
type quotaEnv struct {
	js      jetstream.JetStream
	records lease.Records
	bucket  jetstream.KeyValue // KUBECLIP_BUDGETS
}

func newQuotaEnv(t *testing.T) quotaEnv {
	t.Helper()
	_, _, js := natstest.Start(t)
	if err := lease.EnsureBuckets(t.Context(), js, lease.BucketOptions{}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	counters, err := events.EnsureBucket(t.Context(), js, events.BudgetBucketConfig(1, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	return quotaEnv{js: js, records: lease.Records{KV: kv}, bucket: counters}
}

// clock is a settable clock for the quota's window.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// TestLeaseRecordQuota: a company creates records up to its quota per window; the next acquire
// is refused with an error naming the quota and leaves no record, while a redelivered acquire
// of a run that has its record is not counted, another company creates its records as before,
// and the next window counts afresh. Before, nothing bounded a company's records: failing
// acquires filled KUBECLIP_LEASES (a KV bucket refuses new writes when full) for every company.
func TestLeaseRecordQuota(t *testing.T) {
	const quota = 3
	e := newQuotaEnv(t)
	clk := &clock{now: time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)}
	refused := 0 // the budget metric's count
	q, err := lease.NewRecordQuota(e.bucket, quota, clk.Now, func(events.BudgetKind) { refused++ })
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	for i := range quota {
		clk.Add(time.Second) // past the company counter's 100 ms gathering: every charge is written
		if _, created, err := e.records.CreateCounted(ctx, record("co-a", fmt.Sprintf("run-%d", i)), q); err != nil || !created {
			t.Fatalf("record %d within the quota: created %v, %v", i, created, err)
		}
	}
	clk.Add(time.Second)
	// A redelivered acquire of a run that has its record: not counted, the record returned.
	if rec, created, err := e.records.CreateCounted(ctx, record("co-a", "run-0"), q); err != nil || created || rec.RunID != "run-0" {
		t.Fatalf("redelivered acquire: %+v, created %v, %v; want the existing record", rec, created, err)
	}
	_, _, err = e.records.CreateCounted(ctx, record("co-a", "run-over"), q)
	var qe *lease.RecordQuotaError
	if !errors.As(err, &qe) || qe.Limit != quota || !strings.Contains(err.Error(), "3 lease records within 24h0m0s") || !strings.Contains(err.Error(), "--store-companies") {
		t.Fatalf("past the quota: %v, want a RecordQuotaError naming the quota of %d and its settings", err, quota)
	}
	if _, _, err := e.records.Get(ctx, events.Ref("co-a", "run-over")); !errors.Is(err, lease.ErrNotFound) {
		t.Errorf("the refused acquire left a record: %v", err)
	}
	if refused != 1 {
		t.Errorf("the metric was told %d refusals, want 1", refused)
	}
	if _, created, err := e.records.CreateCounted(ctx, record("co-b", "run-0"), q); err != nil || !created {
		t.Errorf("another company's first record: created %v, %v", created, err)
	}
	clk.Add(events.LeaseRecordWindow)
	if _, created, err := e.records.CreateCounted(ctx, record("co-a", "run-next-day"), q); err != nil || !created {
		t.Errorf("the next window: created %v, %v", created, err)
	}
}

// acquireMsg is an acquire request as the tenant-worker's consumer delivers it: only its subject
// and payload are read by lease.RecordFailure.
type acquireMsg struct {
	jetstream.Msg
	subject string
	data    []byte
}

func (m acquireMsg) Subject() string { return m.subject }
func (m acquireMsg) Data() []byte    { return m.data }

// TestFailedRecordExpires: the record of a failed acquire, created failed or failed after it was
// requested, is stored with a TTL of FailedRecordTTL and no earlier revision (which would
// outlive it), so failing acquires leave nothing for RecordTTL (14 days); a record that moved on
// keeps RecordTTL. Before, every failed acquire's record stayed 14 days.
func TestFailedRecordExpires(t *testing.T) {
	e := newQuotaEnv(t)
	ctx := t.Context()
	kvStream, err := e.js.Stream(ctx, "KV_"+lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	msg := func(runID string) acquireMsg {
		return acquireMsg{subject: "paperclip.lease.co-a.acquire", data: []byte(`{"runId":"` + runID + `","companyId":"co-a"}`)}
	}
	now := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	// Failed before any record (a request the worker could not take in).
	if err := lease.RecordFailure(ctx, e.records, msg("run-new"), events.CodeInvalidConfig, now); err != nil {
		t.Fatal(err)
	}
	// Failed after it was requested.
	if _, _, err := e.records.Create(ctx, record("co-a", "run-requested")); err != nil {
		t.Fatal(err)
	}
	if err := lease.RecordFailure(ctx, e.records, msg("run-requested"), events.CodeQuotaExceeded, now); err != nil {
		t.Fatal(err)
	}
	// Created, then a late failure: the record does not change, and keeps the bucket's TTL.
	if _, _, err := e.records.Create(ctx, record("co-a", "run-created")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.records.Modify(ctx, events.Ref("co-a", "run-created"), lease.Dispatch(lease.Workload{Namespace: "ns", Name: "w", Backend: "job"})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.records.Modify(ctx, events.Ref("co-a", "run-created"), lease.Created); err != nil {
		t.Fatal(err)
	}
	if err := lease.RecordFailure(ctx, e.records, msg("run-created"), events.CodeInternal, now); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		run       string
		wantState lease.State
		wantTTL   string
		wantRevs  int
	}{
		{"run-new", lease.StateFailed, "24h0m0s", 1},
		{"run-requested", lease.StateFailed, "24h0m0s", 2}, // the purge marker and the failed record
		{"run-created", lease.StateCreated, "", 3},
	} {
		ref := events.Ref("co-a", tc.run)
		rec, _, err := e.records.Get(ctx, ref)
		if err != nil || rec.State != tc.wantState {
			t.Errorf("%s: %+v, %v; want state %s", tc.run, rec, err, tc.wantState)
			continue
		}
		last, err := kvStream.GetLastMsgForSubject(ctx, "$KV."+lease.Bucket+"."+ref.Key())
		if err != nil {
			t.Fatal(err)
		}
		if got := last.Header.Get(jetstream.MsgTTLHeader); got != tc.wantTTL {
			t.Errorf("%s: the record's TTL header is %q, want %q", tc.run, got, tc.wantTTL)
		}
		kv, _ := e.js.KeyValue(ctx, lease.Bucket)
		hist, err := kv.History(ctx, ref.Key())
		if err != nil {
			t.Fatal(err)
		}
		if len(hist) != tc.wantRevs {
			var ops []string
			for _, h := range hist {
				ops = append(ops, h.Operation().String())
			}
			t.Errorf("%s: %d revisions kept (%v), want %d", tc.run, len(hist), ops, tc.wantRevs)
		}
	}
}

// TestLeaseRecordQuotaFitsItsShare: what the quota lets the companies the store is sized for
// create, every day of a record's life, fits KUBECLIP_LEASES' share, measured on a real server
// with records at their largest: ids of MaxTokenLen bytes and every revision a run's record
// goes through (requested, dispatching, created, releasing, released).
func TestLeaseRecordQuotaFitsItsShare(t *testing.T) {
	const runs = 200
	e := newQuotaEnv(t)
	ctx := t.Context()
	stream, err := e.js.Stream(ctx, "KV_"+lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	company := strings.Repeat("c", events.MaxTokenLen)
	for i := range runs {
		runID := fmt.Sprintf("%0*d", events.MaxTokenLen, i)
		ref := events.Ref(company, runID)
		rec := record(company, runID)
		rec.AgentID = strings.Repeat("a", events.MaxTokenLen)
		if _, _, err := e.records.Create(ctx, rec); err != nil {
			t.Fatal(err)
		}
		w := lease.Workload{Namespace: strings.Repeat("n", 63), Name: strings.Repeat("w", 63), SecretName: strings.Repeat("s", 63), Backend: "sandbox"}
		for _, change := range []func(*lease.Record) (bool, error){lease.Dispatch(w), lease.Created, lease.BeginRelease(events.LeaseRelease, false), lease.Released} {
			if _, err := e.records.Modify(ctx, ref, change); err != nil {
				t.Fatal(err)
			}
		}
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	perRun := int64(info.State.Bytes) / runs
	o := events.Options{StoreBytes: events.DefaultStoreBytes, Companies: events.DefaultStoreCompanies, RunMaxAge: events.DefaultRunMaxAge}
	windows := int64(o.RunMaxAge/events.LeaseRecordWindow) + 1
	need := o.LeaseRecordQuota() * int64(o.Companies) * windows * perRun
	t.Logf("%d runs' records at their largest: %d bytes, %d a run (%d messages); the quota of %d a day × %d companies × %d days needs %d of the share's %d bytes",
		runs, info.State.Bytes, perRun, info.State.Msgs, o.LeaseRecordQuota(), o.Companies, windows, need, events.StoreLimit(0, events.StoreLeaseRecords))
	if need > events.StoreLimit(0, events.StoreLeaseRecords) {
		t.Errorf("the quota needs %d bytes, more than the lease records' share %d", need, events.StoreLimit(0, events.StoreLeaseRecords))
	}
}
