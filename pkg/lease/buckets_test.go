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
