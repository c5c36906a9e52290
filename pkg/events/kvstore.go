package events

import (
	"context"
	"fmt"

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

// StoreWriteFailures is what a worker does with a write to a shared bucket that failed and was
// let through (fail open: BudgetOptions.OnStoreError, the exec-worker's recorded-exec entries):
// count counts every one (kubeclip_store_write_errors_total{bucket}; nil: not counted), and the
// first of an outage is logged with the store's error, one line an outage rather than one a
// write.
func StoreWriteFailures(log zerolog.Logger, bucket string, count func(bucket string)) func(err error, first bool) {
	return func(err error, first bool) {
		if count != nil {
			count(bucket)
		}
		if first {
			log.Warn().Err(err).Str(LogKeyStream, BucketStream(bucket)).
				Msg("a write to a shared bucket failed; going on without it (fail open) until it takes writes again")
		}
	}
}
