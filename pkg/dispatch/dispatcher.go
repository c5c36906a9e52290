// Package dispatch is the dispatcher: it turns dispatch requests into a run's workload (a Job,
// a Pod or an agent-sandbox Sandbox, through pkg/workload) and its per-run Secret, keeps one
// active run per agent, and carries out release and destroy requests.
//
// One idea per file: dispatcher.go is the Dispatcher and its consumers, options.go what
// configures it; acquire.go takes a dispatch to `created` (runsecret.go renders the run's
// Secret), agents.go and park.go keep one run per agent (a busy agent's dispatches wait parked);
// release.go ends a lease; reuse.go is a reusable lease's life after its release (retain,
// suspend, collect) and resume.go its resume; warm.go, warmclaim.go and warmpool.go are the warm
// pools; reconcile.go finds workloads whose lease is gone.
package dispatch

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// Dispatcher is the dispatcher worker.
type Dispatcher struct {
	opts      Options
	log       zerolog.Logger
	publisher *events.Publisher
	records   lease.Records
	tenants   jetstream.KeyValue
	agents    agentGuard
	runs      jetstream.Stream
	parked    jetstream.Stream
	workloads workload.Deps
	// warm is the warm pools (warm.go); nil when they are off.
	warm *warmPools

	// The adapter key Secret's cache (adapterKeys).
	secretMu      sync.Mutex
	secretValues  map[string]string
	secretFetched time.Time

	ready chan struct{}
}

// New validates opts and returns a Dispatcher; Run starts it.
func New(opts Options) (*Dispatcher, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	pub, err := events.NewPublisher(events.PublisherOptions{JS: opts.JetStream, Subjects: opts.Subjects, Now: opts.Now, Observer: opts.Observer})
	if err != nil {
		return nil, err
	}
	return &Dispatcher{
		opts: opts, log: opts.Logger, publisher: pub,
		workloads: workload.Deps{Clientset: opts.Clientset, Dynamic: opts.Dynamic, Metadata: opts.Metadata},
		ready:     make(chan struct{}),
	}, nil
}

// Ready is closed once the dispatcher consumes its three streams.
func (d *Dispatcher) Ready() <-chan struct{} { return d.ready }

// Run starts the dispatcher (its buckets, the parking stream, its consumers), consumes dispatch,
// release/destroy and result messages until ctx is done, then drains for Options.DrainTimeout.
// Reconciliation and the parked-dispatch sweep run beside the consumers; one consumer failing
// stops the others, so the process restarts whole.
func (d *Dispatcher) Run(ctx context.Context) error {
	js := d.opts.JetStream
	leases, err := events.OpenBucket(ctx, js, lease.Bucket)
	if err != nil {
		return err
	}
	agents, err := events.EnsureBucket(ctx, js, AgentBucketConfig(d.opts.StreamReplicas, d.opts.StoreBytes))
	if err != nil {
		return fmt.Errorf("opening KV bucket %s: %w", AgentBucket, err)
	}
	d.records = lease.Records{KV: leases}
	if err := d.checkRecordTTL(ctx, leases); err != nil {
		return err
	}
	if d.tenants, err = events.OpenBucket(ctx, js, lease.TenantBucket); err != nil {
		return err
	}
	if d.runs, err = events.OpenStream(ctx, js, d.opts.Subjects.RunStream()); err != nil {
		return err
	}
	d.agents = agentGuard{kv: agents}
	if d.parked, err = events.EnsureStream(ctx, js, ParkedStreamConfig(d.opts.StreamReplicas, d.opts.StoreBytes)); err != nil {
		return fmt.Errorf("creating stream %s: %w", ParkedStream, err)
	}
	if d.opts.Warm.Enabled() {
		kv, err := events.EnsureBucket(ctx, js, WarmBucketConfig(d.opts.StreamReplicas, d.opts.StoreBytes))
		if err != nil {
			return fmt.Errorf("opening KV bucket %s: %w", WarmBucket, err)
		}
		d.warm = newWarmPools(d.opts, kv)
		if err := d.warm.start(ctx); err != nil {
			return err
		}
	}

	type consumer struct {
		stream     string
		cfg        jetstream.ConsumerConfig
		handle     events.Handler
		onTerminal events.TerminalFunc
	}
	s := d.opts.Subjects
	consumers := []consumer{
		{events.WorkStream, events.DispatcherConsumerConfig(), d.handleDispatch, d.reportDispatchFailure},
		{s.LeaseStream(), events.DispatcherEndConsumerConfig(s), d.handleLease, d.reportFailure},
		// A result that cannot be handled has nobody to report to: it already ended its run.
		{s.RunStream(), events.DispatcherResultConsumerConfig(s), d.handleResult, nil},
	}
	conss := make([]jetstream.Consumer, len(consumers))
	for i, c := range consumers {
		if conss[i], err = events.EnsureConsumer(ctx, js, c.stream, c.cfg); err != nil {
			return err
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	for i, c := range consumers {
		g.Go(func() error {
			return events.Consume(gctx, conss[i], c.handle, events.ConsumeOptions{
				Logger:       d.log,
				Concurrency:  d.opts.Concurrency,
				DrainTimeout: d.opts.DrainTimeout,
				MaxAttempts:  events.ConsumerMaxDeliver,
				Backoff:      d.opts.Backoff,
				OnTerminal:   c.onTerminal,
				Observer:     d.opts.Observer,
				// One queue per company: a company's flood of dispatches (or releases, or
				// results) waits behind its own, not before another company's first.
				QueueKey: events.CompanyKey,
			})
		})
	}
	g.Go(func() error { d.reconcileLoop(gctx); return nil })
	g.Go(func() error { d.sweepLoop(gctx); return nil })
	g.Go(func() error { d.sweepLeasesLoop(gctx); return nil })
	if d.warm != nil {
		g.Go(func() error { d.warm.run(gctx); return nil })
	}
	close(d.ready)
	d.log.Info().Msg("consuming dispatch, release and result messages")
	return g.Wait()
}

// RunObserver is told about runs created (metrics); it must not block.
type RunObserver interface {
	// RunCreated reports the time from the lease record's creation (the tenant-worker's first
	// handling of the acquire) to the first publish of the run's `created`.
	RunCreated(sinceAcquire time.Duration)
}

// workload is the lease's workload: its backend, chosen by workload.For.
func (d *Dispatcher) workload(rec lease.Record) (workload.Workload, error) {
	return workload.For(policy.Backend(rec.Backend), d.workloads)
}
