// Package cas updates a JetStream KV key by compare-and-set: read the key, decide its next
// value from what was read, write it at the revision read, and start over when another writer
// got in between, a bounded number of times. It is the one read-modify-write loop of kubeclip's
// records (lease records, tenant records and company indexes), as client-go's RetryOnConflict
// is Kubernetes'.
package cas

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// MaxAttempts bounds the reads and writes of one Update. Few writers race on one key (the
// replicas handling one run or one company); a key that changes this many times in a row is
// being written in a loop, and the caller's message is retried later rather than spinning here.
const MaxAttempts = 5

// ErrContended is returned when every attempt lost to another writer.
var ErrContended = errors.New("the key keeps changing")

// KV is the part of a jetstream.KeyValue Update reads and writes with.
type KV interface {
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
}

var _ KV = (jetstream.KeyValue)(nil)

// Modify decides a key's next value from its current one. current is nil and rev 0 when the
// key has no value (never written, deleted or purged). write false leaves the key as it is; an
// error ends the Update and is returned as is. Modify may run once per attempt, so it must
// decide from its arguments alone.
type Modify func(current []byte, rev uint64) (next []byte, write bool, err error)

// Update applies modify to key: it creates the key when it had no value and updates it at the
// revision read otherwise, and reads it again when another writer changed it meanwhile, at most
// MaxAttempts times (then ErrContended). It returns the key's revision: the one written, or the
// one read when modify wrote nothing (0: the key has no value).
func Update(ctx context.Context, kv KV, key string, modify Modify) (uint64, error) {
	for range MaxAttempts {
		current, rev, err := get(ctx, kv, key)
		if err != nil {
			return 0, err
		}
		next, write, err := modify(current, rev)
		if err != nil {
			return rev, err
		}
		if !write {
			return rev, nil
		}
		var written uint64
		if rev == 0 {
			written, err = kv.Create(ctx, key, next)
		} else {
			written, err = kv.Update(ctx, key, next, rev)
		}
		if IsConflict(err) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("writing %s: %w", key, err)
		}
		return written, nil
	}
	return 0, fmt.Errorf("writing %s: %w (%d attempts)", key, ErrContended, MaxAttempts)
}

// get reads key's value and revision; nil and 0 when it has none.
func get(ctx context.Context, kv KV, key string) ([]byte, uint64, error) {
	entry, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("reading %s: %w", key, err)
	}
	return entry.Value(), entry.Revision(), nil
}

// IsConflict reports a write refused because the key is not at the revision expected: a Create
// of a key that has a value (ErrKeyExists) or an Update, or a Delete with LastRevision, at
// another revision (ErrKeyRevisionMismatch). ErrKeyExists alone misses an Update's conflict on
// a replicated bucket: the server answers it with code 10164, which nats.go maps to
// ErrKeyRevisionMismatch only.
func IsConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}
