package natsauth_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/cas"
	"github.com/kubeclip/kubeclip/pkg/dispatch"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestDispatcherKeepsWarmPools does, as the workers' user, what a dispatcher with warm pools
// (--warm-pool-max) does with its bucket: create it, update a pool's record, take and free a
// pool's maintenance lock (a per-key TTL), list the keys and delete a record. The clients' users
// may not read it.
func TestDispatcherKeepsWarmPools(t *testing.T) {
	srv := authServer(t)
	c := connect(t, srv, "kubeclip")
	ctx := t.Context()
	kv, err := events.EnsureBucket(ctx, c.js, dispatch.WarmBucketConfig(1, 0))
	if err != nil {
		t.Fatalf("creating %s as the workers' user: %v", dispatch.WarmBucket, err)
	}
	if _, err := cas.Update(ctx, kv, "co.shape", func([]byte, uint64) ([]byte, bool, error) { return []byte(`{}`), true, nil }); err != nil {
		t.Fatalf("a pool's record: %v", err)
	}
	if _, _, err := cas.Take(ctx, kv, "lock/co.shape", []byte("me"), jetstream.KeyTTL(30*time.Second)); err != nil {
		t.Fatalf("a pool's lock: %v", err)
	}
	if err := cas.Free(ctx, kv, "lock/co.shape", []byte("me")); err != nil {
		t.Fatalf("freeing a pool's lock: %v", err)
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatalf("listing the pools: %v", err)
	}
	var n int
	for range keys.Keys() {
		n++
	}
	if n != 1 {
		t.Errorf("%d keys, want the pool's record", n)
	}
	if err := kv.Delete(ctx, "co.shape"); err != nil {
		t.Fatalf("deleting a pool's record: %v", err)
	}
	for _, user := range []string{"paperclip", "cli"} {
		cl := connect(t, srv, user)
		short, cancel := context.WithTimeout(ctx, time.Second) // a refused request is only a timeout
		_, err := cl.js.KeyValue(short, dispatch.WarmBucket)
		cancel()
		if err == nil {
			t.Errorf("%s opened %s", user, dispatch.WarmBucket)
		}
	}
}
