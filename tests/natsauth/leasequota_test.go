package natsauth_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// TestTenantWorkerCountsLeaseRecords does, as the workers' user, what the tenant-worker does
// with the lease-record quota: create the counters' bucket, count a company's records there
// (source "lease"), and have a failed acquire's record expire (purge its revisions, create it
// again with a TTL).
func TestTenantWorkerCountsLeaseRecords(t *testing.T) {
	srv := authServer(t)
	c := connect(t, srv, "kubeclip")
	ctx := t.Context()
	if err := lease.EnsureBuckets(ctx, c.js, lease.BucketOptions{}); err != nil {
		t.Fatalf("the lease buckets as the workers' user: %v", err)
	}
	kv, err := c.js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	counters, err := events.EnsureBucket(ctx, c.js, events.BudgetBucketConfig(1, 0, 0))
	if err != nil {
		t.Fatalf("creating %s as the workers' user: %v", events.BudgetBucket, err)
	}
	quota, err := lease.NewRecordQuota(counters, 10, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	records := lease.Records{KV: kv}
	if _, created, err := records.CreateCounted(ctx, lease.Record{RunID: "run-1", CompanyID: "co", State: lease.StateRequested}, quota); err != nil || !created {
		t.Fatalf("a counted lease record as the workers' user: created %v, %v", created, err)
	}
	m := acquireMsg{subject: "paperclip.lease.co.acquire", data: []byte(`{"runId":"run-1","companyId":"co"}`)}
	if err := lease.RecordFailure(ctx, records, m, events.CodeInvalidConfig, time.Now()); err != nil {
		t.Fatalf("a failed acquire's expiring record as the workers' user: %v", err)
	}
	if rec, _, err := records.Get(ctx, events.Ref("co", "run-1")); err != nil || rec.State != lease.StateFailed {
		t.Errorf("the failed record: %+v, %v", rec, err)
	}
}

// acquireMsg is an acquire request as a consumer delivers it; RecordFailure reads its subject
// and payload only.
type acquireMsg struct {
	jetstream.Msg
	subject string
	data    []byte
}

func (m acquireMsg) Subject() string { return m.subject }
func (m acquireMsg) Data() []byte    { return m.data }
