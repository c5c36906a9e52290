package lease_test

import (
	"strings"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

func TestEnsureBucketsIsIdempotentAndApplied(t *testing.T) {
	_, _, js := natstest.Start(t)
	ctx := t.Context()
	for i := range 2 {
		if err := lease.EnsureBuckets(ctx, js, lease.BucketOptions{}); err != nil {
			t.Fatalf("EnsureBuckets call %d: %v", i+1, err)
		}
	}
	leases, err := js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	ls, err := leases.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ls.TTL() != 14*24*time.Hour || ls.History() != 5 || ls.BackingStore() != "JetStream" {
		t.Errorf("lease bucket: ttl %s history %d", ls.TTL(), ls.History())
	}
	tenants, err := js.KeyValue(ctx, lease.TenantBucket)
	if err != nil {
		t.Fatal(err)
	}
	ts, err := tenants.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ts.TTL() != 0 || ts.History() != 1 {
		t.Errorf("tenant bucket: ttl %s history %d", ts.TTL(), ts.History())
	}
}

func TestBucketOptionsValidate(t *testing.T) {
	if err := (lease.BucketOptions{}).Validate(); err != nil {
		t.Errorf("defaults: %v", err)
	}
	// The lease stream keeps requests for 30 days, the records only the default 14.
	err := lease.BucketOptions{LeaseMaxAge: 30 * 24 * time.Hour}.Validate()
	if err == nil || !strings.Contains(err.Error(), "lease record TTL") {
		t.Errorf("Validate = %v, want an error about the lease record TTL", err)
	}
}

func TestRunKeysAreUsableInTheBucket(t *testing.T) {
	_, _, js := natstest.Start(t)
	ctx := t.Context()
	if err := lease.EnsureBuckets(ctx, js, lease.BucketOptions{}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"r1", "run:1", "société", `r%"1`, "a/b"} {
		if _, err := kv.Create(ctx, events.Ref(id, id).Key(), []byte("{}")); err != nil {
			t.Errorf("creating the lease record of %q: %v", id, err)
		}
	}
}

// TestEnsureBucketsUpgradesABucketFromBefore: a lease bucket made by an earlier kubeclip (no
// byte limit, no per-key TTLs) is updated in place at start-up to its share of the store and
// per-key TTLs, its records kept: a failed acquire's record can expire after a day from then on.
func TestEnsureBucketsUpgradesABucketFromBefore(t *testing.T) {
	_, _, js := natstest.Start(t)
	ctx := t.Context()
	old := lease.BucketOptions{}.RecordBucketConfig()
	old.MaxBytes, old.LimitMarkerTTL = 0, 0
	kv, err := js.CreateKeyValue(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(ctx, events.Ref("co", "run-1").Key(), []byte(`{"runId":"run-1","companyId":"co","state":"released"}`)); err != nil {
		t.Fatal(err)
	}
	if err := lease.EnsureBuckets(ctx, js, lease.BucketOptions{}); err != nil {
		t.Fatalf("updating the bucket from before: %v", err)
	}
	st, err := js.Stream(ctx, "KV_"+lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	c := st.CachedInfo().Config
	if c.MaxBytes != events.StoreLimit(0, events.StoreLeaseRecords) || !c.AllowMsgTTL || c.SubjectDeleteMarkerTTL != time.Minute {
		t.Errorf("updated bucket: max bytes %d, msg TTLs %v, marker TTL %s; want %d, true, 1m",
			c.MaxBytes, c.AllowMsgTTL, c.SubjectDeleteMarkerTTL, events.StoreLimit(0, events.StoreLeaseRecords))
	}
	if _, _, err := (lease.Records{KV: kv}).Get(ctx, events.Ref("co", "run-1")); err != nil {
		t.Errorf("the record from before: %v", err)
	}
}
