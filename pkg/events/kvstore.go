package events

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// StreamPurger is the part of a KV bucket's stream (jetstream.Stream) PurgeKeys needs.
type StreamPurger interface {
	Purge(ctx context.Context, opts ...jetstream.StreamPurgeOpt) error
}

var _ StreamPurger = (jetstream.Stream)(nil)

// BucketStream is the name of the stream that holds KV bucket bucket.
func BucketStream(bucket string) string { return "KV_" + bucket }

// PurgeKeys removes every key of bucket that filter matches (a KV key, whose tokens may be the
// wildcards * and >) from st, the bucket's stream, leaving nothing behind. It is how an entry
// that belongs to an exec or a run goes when its owner ends: a KV delete or purge writes a
// marker as large as the entry itself, which would fill a bucket as fast as the entries did,
// and which a full bucket (DiscardNew) refuses anyway; a stream purge is an API request, not a
// stored message, so it works on a full bucket and frees the entry's bytes at once. Purging a
// key that is not there is no error (the call is idempotent). Nobody watches these buckets, so
// nobody misses the delete operation a KV delete would have shown.
func PurgeKeys(ctx context.Context, st StreamPurger, bucket, filter string) error {
	if err := st.Purge(ctx, jetstream.WithPurgeSubject("$KV."+bucket+"."+filter)); err != nil {
		return fmt.Errorf("purging %s from KV bucket %s: %w", filter, bucket, err)
	}
	return nil
}

// StoreFailures is what a worker does with the writes to one shared bucket that failed and
// were let through (fail open: the budget counters, the exec-worker's recorded-exec entries):
// every one is counted (count, kubeclip_store_write_errors_total{bucket}; nil: not counted), and
// the first of an outage, the first failure since the bucket last took a write, is logged with
// the store's error: one line an outage rather than one a write. A nil *StoreFailures does
// nothing.
type StoreFailures struct {
	log     zerolog.Logger
	bucket  string
	count   func(bucket string)
	failing atomic.Bool
}

// NewStoreFailures reports failed writes to bucket.
func NewStoreFailures(log zerolog.Logger, bucket string, count func(bucket string)) *StoreFailures {
	return &StoreFailures{log: log, bucket: bucket, count: count}
}

// Failed reports a write that failed with err and was let through.
func (f *StoreFailures) Failed(err error) {
	if f == nil {
		return
	}
	if f.count != nil {
		f.count(f.bucket)
	}
	if f.failing.CompareAndSwap(false, true) {
		f.log.Warn().Err(err).Str(LogKeyStream, BucketStream(f.bucket)).
			Msg("writing to a shared bucket failed; going on without it (fail open) until it takes writes again")
	}
}

// Wrote reports a write the bucket took: the next failure starts a new outage.
func (f *StoreFailures) Wrote() {
	if f != nil && f.failing.Load() {
		f.failing.Store(false)
		f.log.Info().Str(LogKeyStream, BucketStream(f.bucket)).Msg("the shared bucket takes writes again")
	}
}

// KVWatcher is the part of a KV bucket (jetstream.KeyValue) ReadCurrent needs.
type KVWatcher interface {
	WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error)
}

var _ KVWatcher = (jetstream.KeyValue)(nil)

// ReadCurrent calls fn with every current entry of kv once, in one pass: a watch of the
// bucket's last values (deletes left out), stopped at the nil entry that ends them. It is how a
// scrape reads a whole bucket in one request instead of a get per key.
func ReadCurrent(ctx context.Context, kv KVWatcher, fn func(jetstream.KeyValueEntry)) error {
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e := <-w.Updates():
			if e == nil {
				return nil
			}
			fn(e)
		}
	}
}
