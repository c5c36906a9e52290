package events

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Stream and bucket defaults. Each is explained where Options documents its field.
const (
	DefaultLeaseMaxAge = 7 * 24 * time.Hour
	DefaultRunMaxAge   = 14 * 24 * time.Hour
	DefaultWorkMaxAge  = 24 * time.Hour
	DefaultDuplicates  = 10 * time.Minute
	DefaultReplicas    = 1
	// DefaultStoreBytes is the shipped nats.conf's max_file_store (8GB).
	DefaultStoreBytes = 8 << 30
)

// Options configures the streams EnsureStreams creates. The zero value of every field means its
// default. The KV buckets are their owners' (pkg/lease, pkg/dispatch, pkg/runwatch,
// pkg/execsvc).
type Options struct {
	// Prefix is the subject prefix (default "paperclip"); stream names derive from it.
	Prefix string

	// Replicas of every stream (default 1). 1 fits the single-node embedded server
	// and small clusters; use 3 on a 3-node JetStream cluster so a node loss loses no requests.
	Replicas int

	// Storage of every stream (default file). Lease requests and run events must survive a
	// server restart: a lost acquire is a run that never starts, a lost result is a run
	// Paperclip waits on forever.
	Storage jetstream.StorageType

	// LeaseMaxAge is how long lease requests are kept (default 7 days). The lease stream is an
	// audit log of what Paperclip asked for; a week covers incident review, and it must not
	// outlive the lease records (lease.BucketOptions.RecordTTL).
	LeaseMaxAge time.Duration

	// RunMaxAge is how long run events are kept (default 14 days, Armada's event retention):
	// Paperclip and operators can replay any run of the last two weeks, logs included.
	RunMaxAge time.Duration

	// WorkMaxAge bounds dispatch requests left in the work queue (default 24 hours). Handled ones
	// are deleted on ack; only a request whose last delivery timed out stays. A day-old dispatch
	// belongs to a lease Paperclip has long given up on, so it is dropped rather than run late.
	WorkMaxAge time.Duration

	// Duplicates is the de-duplication window of every stream (default 10 minutes). It has to
	// cover the longest a publisher can retry the same event: the consumers retry a failed
	// message for about 1.5 minutes (MaxDeliver × backoff) and a restarted run-watcher replays
	// recent events, so 10 minutes leaves margin while keeping the server's id table small
	// (one entry per message published in the window).
	Duplicates time.Duration

	// MaxMsgSize bounds every message of the lease, run and work streams (default 1 MiB, NATS's
	// default max_payload). Log events are at most 64 KiB and requests a few KiB, so anything
	// near the bound is a bug or abuse and the server rejects it at publish time.
	MaxMsgSize int32

	// StoreBytes is the JetStream file store the streams and buckets share (default 8 GiB, the
	// shipped nats.conf's max_file_store; set it to the server's): each one's byte limit is its
	// share of it (Stores, StoreLimit).
	StoreBytes int64

	// Companies is how many companies the store is sized for (default DefaultStoreCompanies):
	// the per-company budgets and quotas are the stores' shares divided among them
	// (CompanyBudget, LeaseRecordQuota), so that many companies writing at their budgets every
	// day evict nobody's history before RunMaxAge.
	Companies int
}

func (o Options) withDefaults() Options {
	if o.StoreBytes == 0 {
		o.StoreBytes = DefaultStoreBytes
	}
	if o.Companies == 0 {
		o.Companies = DefaultStoreCompanies
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.Replicas == 0 {
		o.Replicas = DefaultReplicas
	}
	if o.LeaseMaxAge == 0 {
		o.LeaseMaxAge = DefaultLeaseMaxAge
	}
	if o.RunMaxAge == 0 {
		o.RunMaxAge = DefaultRunMaxAge
	}
	if o.WorkMaxAge == 0 {
		o.WorkMaxAge = DefaultWorkMaxAge
	}
	if o.Duplicates == 0 {
		o.Duplicates = DefaultDuplicates
	}
	if o.MaxMsgSize == 0 {
		o.MaxMsgSize = DefaultMaxMsgSize
	}
	return o
}

// Validate reports the first invalid setting, after defaults are applied.
func (o Options) Validate() error {
	o = o.withDefaults()
	if _, err := NewSubjects(o.Prefix); err != nil {
		return err
	}
	var errs []error
	if o.Replicas < 1 || o.Replicas > 5 {
		errs = append(errs, fmt.Errorf("replicas must be between 1 and 5, got %d", o.Replicas))
	}
	if o.Storage != jetstream.FileStorage && o.Storage != jetstream.MemoryStorage {
		errs = append(errs, fmt.Errorf("storage must be file or memory, got %v", o.Storage))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"lease max age", o.LeaseMaxAge}, {"run max age", o.RunMaxAge}, {"work max age", o.WorkMaxAge},
		{"duplicate window", o.Duplicates},
	} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", d.name, d.v))
		}
	}
	for _, age := range []struct {
		name string
		v    time.Duration
	}{{"lease max age", o.LeaseMaxAge}, {"run max age", o.RunMaxAge}, {"work max age", o.WorkMaxAge}} {
		// The server refuses a duplicate window longer than the stream's max age.
		if o.Duplicates > age.v {
			errs = append(errs, fmt.Errorf("duplicate window %s must not exceed the %s %s", o.Duplicates, age.name, age.v))
		}
	}
	if o.StoreBytes < MinStoreBytes {
		errs = append(errs, fmt.Errorf("store bytes must be at least %d (16 MiB), got %d", MinStoreBytes, o.StoreBytes))
	}
	if o.Companies < 1 {
		errs = append(errs, fmt.Errorf("the companies the store is sized for must be at least 1, got %d", o.Companies))
	} else if o.LeaseRecordQuota() < 1 {
		errs = append(errs, fmt.Errorf("a store of %d bytes sized for %d companies leaves each no lease record a day: raise the store bytes or lower the companies", o.StoreBytes, o.Companies))
	}
	if o.MaxMsgSize < 64<<10 {
		errs = append(errs, fmt.Errorf("max message size must be at least 64 KiB (one log event), got %d", o.MaxMsgSize))
	}
	return errors.Join(errs...)
}

// limit is store s's byte limit in o's store.
func (o Options) limit(s Store) int64 { return StoreLimit(o.StoreBytes, s) }

// subjects uses the prefix as given: Validate reports a bad one, and the server refuses the
// stream names it would produce.
func (o Options) subjects() Subjects { return Subjects{prefix: o.Prefix} }

// LeaseStreamConfig is the lease request stream, e.g. PAPERCLIP_LEASES on paperclip.lease.>.
func (o Options) LeaseStreamConfig() jetstream.StreamConfig {
	o = o.withDefaults()
	s := o.subjects()
	return jetstream.StreamConfig{
		Name:        s.LeaseStream(),
		Description: "Paperclip lease requests (acquire, release, destroy); see docs/contract.md",
		Subjects:    []string{s.LeaseAll()},
		// Limits, not work-queue: two consumers read it (the tenant-worker takes acquires, the
		// dispatcher takes release and destroy) and operators replay it, so acked requests
		// must stay until they age out.
		Retention: jetstream.LimitsPolicy,
		// Full, it drops its oldest requests: handled ones kept for audit, days old.
		// DiscardNew would refuse every company's acquires once a week of audit filled it.
		Discard: jetstream.DiscardOld,
		MaxAge:  o.LeaseMaxAge,
		// Counts are not bounded, so a burst is never dropped before it is handled; bytes are
		// the stream's share of the store.
		MaxMsgs:           -1,
		MaxBytes:          o.limit(StoreLeaseRequests),
		MaxMsgsPerSubject: -1,
		MaxConsumers:      -1,
		MaxMsgSize:        o.MaxMsgSize,
		Duplicates:        o.Duplicates,
		Storage:           o.Storage,
		Replicas:          o.Replicas,
	}
}

// RunStreamConfig is the run event stream, e.g. PAPERCLIP_RUNS on paperclip.run.>.
func (o Options) RunStreamConfig() jetstream.StreamConfig {
	o = o.withDefaults()
	s := o.subjects()
	return jetstream.StreamConfig{
		Name:        s.RunStream(),
		Description: "kubeclip run events (created, status, log, result, released, failed); see docs/contract.md",
		Subjects:    []string{s.RunAll()},
		// Limits: every reader (Paperclip, the CLI, dashboards) replays a run's history with
		// its own ordered or durable consumer.
		Retention: jetstream.LimitsPolicy,
		// Full, it drops its oldest events, the runs of about RunMaxAge ago whose readers are
		// long done: a new result is always stored. DiscardNew would refuse every company's
		// results once the stream filled. What one company may write is bounded upstream,
		// per exec, run and company (KUBECLIP_BUDGETS, docs/security.md, Budgets), each
		// company's daily budget sized so the companies the store is sized for fit the whole
		// RunMaxAge (CompanyBudget): only more companies than that evict history early.
		Discard:  jetstream.DiscardOld,
		MaxAge:   o.RunMaxAge,
		MaxMsgs:  -1,
		MaxBytes: o.limit(StoreRuns),
		// No per-subject bound: it would drop the first log or exec events of a long run
		// silently; the run budget bounds a run instead.
		MaxMsgsPerSubject: -1,
		MaxConsumers:      -1,
		MaxMsgSize:        o.MaxMsgSize,
		Duplicates:        o.Duplicates,
		Storage:           o.Storage,
		Replicas:          o.Replicas,
		// Direct gets let a restarted run-watcher read a run's last status, log chunk and result
		// (GetLastMsgForSubject) from any replica without a consumer.
		AllowDirect: true,
	}
}

// WorkStreamConfig is KUBECLIP_WORK on kubeclip.dispatch.>.
func (o Options) WorkStreamConfig() jetstream.StreamConfig {
	o = o.withDefaults()
	return jetstream.StreamConfig{
		Name:        WorkStream,
		Description: "kubeclip dispatch requests (tenant-worker → dispatcher)",
		Subjects:    []string{DispatchAll()},
		// Work queue: each dispatch is done once by one dispatcher, then deleted.
		Retention: jetstream.WorkQueuePolicy,
		// Full, it refuses new dispatches: what it holds is unhandled work, never to be dropped
		// for newer; the tenant-worker's publish fails and its acquire is retried.
		Discard:           jetstream.DiscardNew,
		MaxAge:            o.WorkMaxAge,
		MaxMsgs:           -1,
		MaxBytes:          o.limit(StoreWork),
		MaxMsgsPerSubject: -1,
		MaxConsumers:      -1,
		MaxMsgSize:        o.MaxMsgSize,
		// A redelivered acquire makes the tenant-worker publish the same dispatch again; the
		// window drops the copy.
		Duplicates: o.Duplicates,
		Storage:    o.Storage,
		Replicas:   o.Replicas,
	}
}

// StreamManager is the part of jetstream.JetStream EnsureStream needs.
type StreamManager interface {
	Stream(ctx context.Context, name string) (jetstream.Stream, error)
	CreateStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error)
	UpdateStream(ctx context.Context, cfg jetstream.StreamConfig) (jetstream.Stream, error)
}

var _ StreamManager = (jetstream.JetStream)(nil)

// EnsureStream creates the stream cfg names, or updates it when its configuration differs from
// cfg, and returns it. Every worker calls it at start-up, so it waits for a cluster that is still
// forming (settle). An update it does not need is left out: nats-server applies even an
// unchanged configuration to its store, racing consumers being created on the stream at the same
// time (seen as a data race in nats-server v2.15.2 under -race: a stream update's
// fileStore.UpdateConfig against a consumer create's fileStore.ConsumerStore).
//
// A field cfg leaves at its zero value is the server's to choose (its default), so it is not
// compared: a setting can be changed, not returned to its default by leaving it out.
func EnsureStream(ctx context.Context, js StreamManager, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	var st jetstream.Stream
	err := defaultSetupRetry.settle(ctx, func(ctx context.Context) error {
		var err error
		st, err = ensureStream(ctx, js, cfg)
		return err
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// ensureStream is one attempt of EnsureStream.
func ensureStream(ctx context.Context, js StreamManager, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	st, err := js.Stream(ctx, cfg.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = js.CreateStream(ctx, cfg)
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return st, err
		}
		st, err = js.Stream(ctx, cfg.Name) // another worker created it first
	}
	if err != nil {
		return nil, err
	}
	if configCovers(st.CachedInfo().Config, cfg) {
		return st, nil
	}
	return js.UpdateStream(ctx, cfg)
}

// configCovers reports whether the server's configuration have already holds every setting want
// makes: want's zero fields take have's value, then the two must be equal.
func configCovers(have, want jetstream.StreamConfig) bool {
	w := reflect.ValueOf(&want).Elem()
	h := reflect.ValueOf(have)
	for i := range w.NumField() {
		if w.Field(i).IsZero() {
			w.Field(i).Set(h.Field(i))
		}
	}
	return reflect.DeepEqual(want, have)
}

// EnsureStreams creates the lease, run and work streams, or updates them to opts. It is
// idempotent: every binary calls it at start-up.
func EnsureStreams(ctx context.Context, js StreamManager, opts Options) error {
	if err := opts.Validate(); err != nil {
		return fmt.Errorf("stream options: %w", err)
	}
	for _, cfg := range []jetstream.StreamConfig{opts.LeaseStreamConfig(), opts.RunStreamConfig(), opts.WorkStreamConfig()} {
		if _, err := EnsureStream(ctx, js, cfg); err != nil {
			return fmt.Errorf("creating or updating stream %s: %w", cfg.Name, err)
		}
	}
	return nil
}
