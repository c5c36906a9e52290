package main

import (
	"context"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// timedJS is the JetStream handle the bench gives a worker: the real one, with publishes and
// key-value operations timed into stats.
type timedJS struct {
	jetstream.JetStream
	stats     *opStats
	component string
	subjects  events.Subjects
}

var _ jetstream.JetStream = timedJS{}

func (t timedJS) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	start := time.Now()
	ack, err := t.JetStream.PublishMsg(ctx, msg, opts...)
	end := time.Now()
	kind := subjectKind(msg.Subject)
	t.stats.record(op{t.component, "NATS", "publish " + kind}, end.Sub(start), err)
	if (kind == string(events.KindCreated) || kind == string(events.KindResult)) && err == nil {
		if _, runID, _, perr := t.subjects.ParseRunSubject(msg.Subject); perr == nil {
			t.stats.mark(markPublishing+kind, runID, start)
			t.stats.mark(markPublished+kind, runID, end)
		}
	}
	return ack, err
}

func (t timedJS) KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	kv, err := t.JetStream.KeyValue(ctx, bucket)
	return t.wrapKV(kv, bucket), err
}

func (t timedJS) CreateKeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := t.JetStream.CreateKeyValue(ctx, cfg)
	return t.wrapKV(kv, cfg.Bucket), err
}

func (t timedJS) CreateOrUpdateKeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := t.JetStream.CreateOrUpdateKeyValue(ctx, cfg)
	return t.wrapKV(kv, cfg.Bucket), err
}

func (t timedJS) wrapKV(kv jetstream.KeyValue, bucket string) jetstream.KeyValue {
	if kv == nil {
		return nil
	}
	return timedKV{KeyValue: kv, stats: t.stats, component: t.component, bucket: bucket}
}

// subjectKind is what a published subject is, for the breakdown: the run event kind
// (paperclip.run.<c>.<r>.<kind>), "dispatch", or the lease request kind.
func subjectKind(subject string) string {
	tokens := strings.Split(subject, ".")
	switch {
	case len(tokens) >= 2 && tokens[0] == "kubeclip" && tokens[1] == "dispatch":
		return "dispatch"
	case len(tokens) > 0:
		return tokens[len(tokens)-1]
	}
	return subject
}

// timedKV times a bucket's reads and writes.
type timedKV struct {
	jetstream.KeyValue
	stats     *opStats
	component string
	bucket    string
}

func (k timedKV) done(what string, start time.Time, err error) {
	k.stats.record(op{k.component, "NATS", "KV " + k.bucket + " " + what}, time.Since(start), err)
}

func (k timedKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	start := time.Now()
	if ref, ok := events.ParseRunKey(key); ok && k.bucket == lease.Bucket {
		k.stats.mark(markLeaseRead, ref.RunID, start)
	}
	e, err := k.KeyValue.Get(ctx, key)
	k.done("get", start, err)
	return e, err
}

func (k timedKV) Put(ctx context.Context, key string, value []byte) (uint64, error) {
	start := time.Now()
	rev, err := k.KeyValue.Put(ctx, key, value)
	k.done("put", start, err)
	return rev, err
}

func (k timedKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	start := time.Now()
	rev, err := k.KeyValue.Create(ctx, key, value, opts...)
	k.done("create", start, err)
	return rev, err
}

func (k timedKV) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	start := time.Now()
	rev, err := k.KeyValue.Update(ctx, key, value, revision)
	k.done("update", start, err)
	return rev, err
}

func (k timedKV) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	start := time.Now()
	err := k.KeyValue.Delete(ctx, key, opts...)
	k.done("delete", start, err)
	return err
}
