package events

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Streams and buckets are ensured by every worker at start-up, and on a first install the
// workers start together with a fresh NATS cluster. Until the cluster has elected its
// JetStream meta leader and every peer has joined, a create request is dropped unanswered (the
// caller waits out its timeout) or answered "JetStream system temporarily unavailable", "no
// suitable peers for placement" or "insufficient resources" (the peers have not reported yet).
// One request per stream with no retry made every worker exit, each restart one stream further:
// a crash loop (issue 16). So each create or update is retried with a bounded request
// timeout and a backoff, for setupTimeout in all; an error no wait can fix (an invalid
// configuration, 3 replicas on a server that is not clustered) is returned at once.
const (
	// setupAttemptTimeout bounds one attempt: jetstream's own API timeout (5 s), which a
	// healthy cluster answers well within even on a loaded machine. A request the server
	// dropped is sent again after it, not waited on for the whole bound.
	setupAttemptTimeout = 5 * time.Second
	// setupTimeout bounds all attempts: a fresh 3-node cluster elects its meta leader in about
	// a second once its peers see each other, and the production overlay's StatefulSet starts
	// its pods one after another within a minute or so. Past it the worker exits with the
	// stream's name, and its restart (with Kubernetes' back-off) waits again.
	setupTimeout = 2 * time.Minute
	// setupBackoffBase and setupBackoffLimit space the attempts: quick while the cluster
	// forms, no busier than one request per worker every 5 s after.
	setupBackoffBase  = 250 * time.Millisecond
	setupBackoffLimit = 5 * time.Second
)

// setupRetry bounds and spaces the attempts of settle; tests shorten them.
type setupRetry struct {
	attempt time.Duration
	total   time.Duration
	backoff func(attempt uint64) time.Duration
}

var defaultSetupRetry = setupRetry{
	attempt: setupAttemptTimeout,
	total:   setupTimeout,
	backoff: exponentialBackoff(setupBackoffBase, setupBackoffLimit),
}

// settle runs try, each attempt bounded by r.attempt, until it succeeds, fails in a way no wait
// can fix (setupRetryable), r.total has passed, or ctx ends.
func (r setupRetry) settle(ctx context.Context, try func(ctx context.Context) error) error {
	deadline := time.Now().Add(r.total)
	for attempt := uint64(1); ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, r.attempt)
		err := try(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !setupRetryable(err) {
			return err
		}
		wait := r.backoff(attempt)
		if time.Now().Add(wait).After(deadline) {
			return fmt.Errorf("JetStream not ready after %d attempts in %s: %w", attempt, r.total, err)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(wait):
		}
	}
}

// setupRetryable reports whether a create or update of a stream or bucket that failed with err
// may succeed later: its request went unanswered or the connection was between servers, or
// JetStream answered that it is unavailable for now (status 503), or it found no peers to place
// the replicas on (peers not joined yet). Every other answer is about the request itself.
func setupRetryable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, nats.ErrConnectionReconnecting) {
		return true
	}
	var jsErr jetstream.JetStreamError
	if !errors.As(err, &jsErr) || jsErr.APIError() == nil {
		return false
	}
	api := jsErr.APIError()
	return api.Code == http.StatusServiceUnavailable || api.ErrorCode == jsErrCodeClusterNoPeers
}

// jsErrCodeClusterNoPeers is nats-server's JSClusterNoPeersErrF ("no suitable peers for
// placement"), which nats.go does not name.
const jsErrCodeClusterNoPeers jetstream.ErrorCode = 10005

// BucketMaker is the part of jetstream.JetStream EnsureBucket needs.
type BucketMaker interface {
	CreateOrUpdateKeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error)
}

var _ BucketMaker = (jetstream.JetStream)(nil)

// EnsureBucket creates the KV bucket cfg names, or updates it to cfg, and returns it. Every
// worker calls it at start-up for the buckets it uses; like EnsureStream it waits for a cluster
// that is still forming.
func EnsureBucket(ctx context.Context, js BucketMaker, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	var kv jetstream.KeyValue
	err := defaultSetupRetry.settle(ctx, func(ctx context.Context) error {
		var err error
		kv, err = js.CreateOrUpdateKeyValue(ctx, cfg)
		return err
	})
	if err != nil {
		return nil, err
	}
	return kv, nil
}

// A worker's Run opens the buckets and streams its start-up ensured, and creates its durable
// consumers, right after EnsureStreams and EnsureBuckets, while a fresh cluster may still be
// slow to answer: each lookup is retried as a create is (settle), or the worker exits on the
// first unanswered request (issue 17's CI run: a dispatcher exited on "opening KV bucket
// KUBECLIP_LEASES: context deadline exceeded" a second after its buckets were made).

// AtStartup runs try, one of a worker's start-up requests to JetStream, retried as a create is
// (settle) while a fresh cluster is slow to answer.
func AtStartup(ctx context.Context, try func(ctx context.Context) error) error {
	return defaultSetupRetry.settle(ctx, try)
}

// BucketOpener is the part of jetstream.JetStream OpenBucket needs.
type BucketOpener interface {
	KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error)
}

// StreamOpener is the part of jetstream.JetStream OpenStream needs.
type StreamOpener interface {
	Stream(ctx context.Context, name string) (jetstream.Stream, error)
}

// ConsumerMaker is the part of jetstream.JetStream EnsureConsumer needs.
type ConsumerMaker interface {
	CreateOrUpdateConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error)
}

var (
	_ BucketOpener  = (jetstream.JetStream)(nil)
	_ StreamOpener  = (jetstream.JetStream)(nil)
	_ ConsumerMaker = (jetstream.JetStream)(nil)
)

// OpenBucket opens the existing KV bucket name, waiting for a cluster that is still forming.
func OpenBucket(ctx context.Context, js BucketOpener, name string) (jetstream.KeyValue, error) {
	var kv jetstream.KeyValue
	err := defaultSetupRetry.settle(ctx, func(ctx context.Context) (err error) {
		kv, err = js.KeyValue(ctx, name)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("opening KV bucket %s: %w", name, err)
	}
	return kv, nil
}

// OpenStream opens the existing stream name, waiting for a cluster that is still forming.
func OpenStream(ctx context.Context, js StreamOpener, name string) (jetstream.Stream, error) {
	var st jetstream.Stream
	err := defaultSetupRetry.settle(ctx, func(ctx context.Context) (err error) {
		st, err = js.Stream(ctx, name)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("opening stream %s: %w", name, err)
	}
	return st, nil
}

// EnsureConsumer creates the durable consumer cfg on stream, or updates it to cfg, waiting for a
// cluster that is still forming.
func EnsureConsumer(ctx context.Context, js ConsumerMaker, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	var c jetstream.Consumer
	err := defaultSetupRetry.settle(ctx, func(ctx context.Context) (err error) {
		c, err = js.CreateOrUpdateConsumer(ctx, stream, cfg)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("creating consumer %s on stream %s: %w", cfg.Durable, stream, err)
	}
	return c, nil
}
