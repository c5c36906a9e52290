package cas

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// A hold is a KV key whose value names its holder (a run holding an agent, a replica owning a
// run): taken by creating the key, so one holder wins across every replica, and freed by its
// holder only. The key's expiry (a per-key TTL, or the bucket's) frees the hold of a holder that
// died.

// HoldKV is the part of a jetstream.KeyValue a hold is taken and freed with.
type HoldKV interface {
	KV
	Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error
}

var _ HoldKV = (jetstream.KeyValue)(nil)

// Take makes value the holder of key unless another holds it: it creates the key (opts: its
// per-key TTL) and, when the key exists, reads who holds it. It returns the holder's value and
// the key's revision. A key freed between the create and the read is taken again, at most
// MaxAttempts times (then ErrContended).
func Take(ctx context.Context, kv KV, key string, value []byte, opts ...jetstream.KVCreateOpt) (holder []byte, rev uint64, err error) {
	for range MaxAttempts {
		rev, err := kv.Create(ctx, key, value, opts...)
		if err == nil {
			return value, rev, nil
		}
		if !IsConflict(err) {
			return nil, 0, fmt.Errorf("taking %s: %w", key, err)
		}
		held, rev, err := get(ctx, kv, key)
		if err != nil {
			return nil, 0, err
		}
		if rev != 0 {
			return held, rev, nil
		}
		// freed between the two calls: take it again
	}
	return nil, 0, fmt.Errorf("taking %s: %w (%d attempts)", key, ErrContended, MaxAttempts)
}

// Free deletes key if value holds it, at the revision read, so a hold taken by another holder
// meanwhile stays. A key held by another, or by nobody, is left as it is.
func Free(ctx context.Context, kv HoldKV, key string, value []byte) error {
	held, rev, err := get(ctx, kv, key)
	if err != nil || rev == 0 || !bytes.Equal(held, value) {
		return err
	}
	err = kv.Delete(ctx, key, jetstream.LastRevision(rev))
	if err == nil || IsConflict(err) || errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	return fmt.Errorf("freeing %s: %w", key, err)
}
