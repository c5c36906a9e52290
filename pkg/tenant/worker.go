// Package tenant is the tenant-worker: it consumes acquire requests, provisions the company's
// tenant (namespace, RBAC, quota, limits, network policies) with server-side apply, and hands
// the lease to the dispatcher.
package tenant

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kubeclip/kubeclip/pkg/api"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// DefaultResync is how often an unchanged tenant is applied again anyway, which is how drift
// (someone editing or deleting a tenant object) gets repaired without applying on every acquire.
const DefaultResync = 10 * time.Minute

// Options configures a Worker.
type Options struct {
	// Clientset watches tenant namespaces; required.
	Clientset kubernetes.Interface
	// Applier server-side applies tenant objects; required.
	Applier *k8s.Applier
	// JetStream consumes acquires and publishes dispatch requests; required.
	JetStream jetstream.JetStream
	// Subjects carries the subject prefix.
	Subjects events.Subjects
	// Logger receives the worker's records.
	Logger zerolog.Logger
	// Now is the clock; defaults to time.Now.
	Now func() time.Time
	// Resync bounds how long an applied tenant is trusted unchanged (default DefaultResync).
	Resync time.Duration
	// Concurrency is the number of acquires handled at once (events.DefaultConcurrency when 0).
	Concurrency int
	// DrainTimeout bounds shutdown (events.DefaultDrainTimeout when 0).
	DrainTimeout time.Duration
	// Observer is told about consumed and published messages (metrics); nil means none.
	Observer events.Observer
	// Operator is the installation's policy for every company (allowed namespace prefixes,
	// reserved namespaces, adapter keys, the namespace cap); zero fields take
	// policy.DefaultOperator's.
	Operator policy.Operator
	// Replies are the inboxes the validate service answers into (api.ServeOptions.Replies); the
	// zero Rule answers nothing.
	Replies inbox.Rule
	// StreamReplicas is the replica count of the retry stream (default 1).
	StreamReplicas int
	// StoreBytes is the JetStream store the retry stream takes its share of (0: the default).
	StoreBytes int64
	// RecordQuota is how many lease records one company may create per
	// events.LeaseRecordWindow (events.Options.LeaseRecordQuota; 0: no quota). Past it an
	// acquire is refused (quota_exceeded) without a record.
	RecordQuota int64
}

// BudgetObserver is told when the lease-record quota refuses an acquire (the worker's metrics
// implement it: kubeclip_budget_exceeded_total{source="lease"}); it must not block.
type BudgetObserver interface {
	BudgetExceeded(source string, kind events.BudgetKind)
}

// Worker is the tenant-worker.
type Worker struct {
	opts      Options
	log       zerolog.Logger
	publisher *events.Publisher
	tenants   jetstream.KeyValue
	records   lease.Records
	quota     *lease.RecordQuota // nil: no quota
	// namespaces lists the managed namespaces that exist, from an informer: a tenant whose
	// namespace was deleted is applied again at once, whatever its record says.
	namespaces cache.Indexer
	ready      chan struct{}
}

// New validates opts and returns a Worker; Run starts it.
func New(opts Options) (*Worker, error) {
	switch {
	case opts.Clientset == nil:
		return nil, errors.New("tenant: Options.Clientset is required")
	case opts.Applier == nil:
		return nil, errors.New("tenant: Options.Applier is required")
	case opts.JetStream == nil:
		return nil, errors.New("tenant: Options.JetStream is required")
	case opts.Resync < 0:
		return nil, errors.New("tenant: Options.Resync must not be negative")
	}
	opts.Operator = opts.Operator.WithDefaults()
	if err := opts.Operator.Validate(); err != nil {
		return nil, fmt.Errorf("tenant: Options.Operator: %w", err)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Resync == 0 {
		opts.Resync = DefaultResync
	}
	pub, err := events.NewPublisher(events.PublisherOptions{JS: opts.JetStream, Subjects: opts.Subjects, Now: opts.Now, Observer: opts.Observer})
	if err != nil {
		return nil, err
	}
	return &Worker{opts: opts, log: opts.Logger, publisher: pub, ready: make(chan struct{})}, nil
}

// Ready is closed once the worker consumes acquire requests.
func (w *Worker) Ready() <-chan struct{} { return w.ready }

// Run starts the worker (its buckets, its consumer, the namespace cache, the validate service),
// consumes acquire requests until ctx is done, then drains for Options.DrainTimeout.
func (w *Worker) Run(ctx context.Context) error {
	js := w.opts.JetStream
	kv, err := events.OpenBucket(ctx, js, lease.TenantBucket)
	if err != nil {
		return err
	}
	w.tenants = kv
	leases, err := events.OpenBucket(ctx, js, lease.Bucket)
	if err != nil {
		return err
	}
	w.records = lease.Records{KV: leases}
	if w.opts.RecordQuota > 0 {
		counters, err := events.EnsureBucket(ctx, js, events.BudgetBucketConfig(w.opts.StreamReplicas, 0, w.opts.StoreBytes))
		if err != nil {
			return fmt.Errorf("opening KV bucket %s: %w", events.BudgetBucket, err)
		}
		var onExceeded func(events.BudgetKind)
		if bo, ok := w.opts.Observer.(BudgetObserver); ok {
			onExceeded = func(kind events.BudgetKind) { bo.BudgetExceeded(lease.QuotaSource, kind) }
		}
		if w.quota, err = lease.NewRecordQuota(counters, w.opts.RecordQuota, w.opts.Now, onExceeded); err != nil {
			return err
		}
	}
	cons, err := events.EnsureConsumer(ctx, js, w.opts.Subjects.LeaseStream(), events.TenantWorkerConsumerConfig(w.opts.Subjects))
	if err != nil {
		return err
	}
	// Acquires that failed retryably wait in the retry queue, worked through by a consumer of
	// their own, so no company's retries delay another company's first attempt.
	if _, err := events.EnsureStream(ctx, js, events.RetryStreamConfig(w.opts.StreamReplicas, w.opts.StoreBytes)); err != nil {
		return fmt.Errorf("creating stream %s: %w", events.RetryStream, err)
	}
	retryCfg := events.RetryConsumerConfig(events.TenantWorkerConsumer)
	retryCons, err := events.EnsureConsumer(ctx, js, events.RetryStream, retryCfg)
	if err != nil {
		return err
	}

	factory := informers.NewSharedInformerFactoryWithOptions(w.opts.Clientset, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = policy.LabelManagedBy + "=" + policy.ManagedBy
		}))
	nsInf := factory.Core().V1().Namespaces().Informer()
	w.namespaces = nsInf.GetIndexer()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), nsInf.HasSynced) {
		return fmt.Errorf("syncing the namespace informer: %w", context.Cause(ctx))
	}

	// Clients (the Paperclip plugin) ask for the verdict on a config without acquiring.
	apiObs, _ := w.opts.Observer.(api.Observer)
	serve := api.ServeOptions{Subjects: w.opts.Subjects, Replies: w.opts.Replies, Logger: w.log, Observer: apiObs}
	if _, err := api.ServeValidate(js.Conn(), serve, w.opts.Operator); err != nil {
		return err
	}
	// `kubeclip status` asks where the queue workers' oldest requests stand, never reading one.
	if _, err := api.ServeQueues(ctx, js.Conn(), serve, js); err != nil {
		return err
	}
	consume := events.ConsumeOptions{
		Logger:       w.log,
		Concurrency:  w.opts.Concurrency,
		DrainTimeout: w.opts.DrainTimeout,
		OnTerminal:   w.reportFailure,
		Observer:     w.opts.Observer,
		Retries:      &events.RetryQueue{Publisher: js, Name: events.TenantWorkerConsumer},
		// One queue per company on each consumer: a company's flood of acquires, first
		// attempts or retries, waits behind its own, not before another company's.
		QueueKey: events.CompanyKey,
	}
	g, gctx := errgroup.WithContext(ctx)
	// First attempts and retries each get Concurrency handler slots.
	g.Go(func() error { return events.Consume(gctx, cons, w.handle, consume) })
	g.Go(func() error { return events.Consume(gctx, retryCons, w.handle, consume) })
	close(w.ready)
	w.log.Info().Msg("consuming acquire requests")
	return g.Wait()
}

// handle provisions the acquire's tenant and hands the lease to the dispatcher. It records the
// lease first of all: every acquire, also one that fails, leaves a record, so a redelivered or
// replayed acquire of a lease that moved on (dispatched, failed, released) does nothing.
func (w *Worker) handle(ctx context.Context, m jetstream.Msg) error {
	req, err := w.opts.Subjects.DecodeAcquire(m.Subject(), m.Data())
	if err != nil {
		return err
	}
	log := w.log.With().Str(events.LogKeyRunID, req.RunID).Str(events.LogKeyTenant, req.CompanyID).Logger()
	rec, _, err := w.records.CreateCounted(ctx, lease.Record{
		RunID: req.RunID, CompanyID: req.CompanyID, AgentID: req.AgentID,
		State: lease.StateRequested, CreatedAt: w.opts.Now().UTC(), Reusable: req.ReuseLease,
	}, w.quota)
	var quota *lease.RecordQuotaError
	if errors.As(err, &quota) {
		return events.Terminal(events.CodeQuotaExceeded, "", err)
	}
	if err != nil {
		return err
	}
	if rec.State != lease.StateRequested {
		log.Info().Str("state", string(rec.State)).Msg("acquire already handled; nothing to do")
		return nil
	}
	plan, err := lease.New(req, w.opts.Now(), w.opts.Operator)
	if err != nil {
		return err
	}
	if err := w.ensureTenant(ctx, log, plan); err != nil {
		return err
	}
	// The plan travels with the dispatch: the dispatcher takes it as decided here, the one
	// place an acquire's plan is derived (lease.Decode).
	decided, err := plan.Encode()
	if err != nil {
		return err
	}
	if _, err := w.publisher.Publish(ctx, events.DispatchRequest{AcquireRequest: req, Namespace: plan.Namespace, Plan: decided}); err != nil {
		return fmt.Errorf("handing the lease to the dispatcher: %w", err)
	}
	log.Debug().Str(events.LogKeyNamespace, plan.Namespace).Msg("lease handed to the dispatcher")
	return nil
}

// ensureTenant makes sure the plan's namespace is the company's (claiming it on first use) and
// applies the tenant unless the same objects were applied recently and the namespace still
// exists. Concurrent acquires for one company may both apply: server-side apply of the same
// objects by the same field manager is idempotent, so that costs a round trip, not a conflict.
func (w *Worker) ensureTenant(ctx context.Context, log zerolog.Logger, plan lease.Plan) error {
	tenant, err := plan.Tenant()
	if err != nil {
		return err
	}
	hash := tenant.Hash()
	ns := plan.Namespace
	prev, rev, err := w.ownedRecord(ctx, plan)
	if err != nil {
		return err
	}
	if w.fresh(prev, ns, hash) {
		return nil
	}
	_, nsExisted, _ := w.namespaces.GetByKey(ns)

	objs, err := tenant.Objects()
	if err != nil {
		return events.Terminal(events.CodeInternal, "", fmt.Errorf("rendering tenant %s: %w", ns, err))
	}
	start := w.opts.Now()
	if err := w.apply(ctx, objs); err != nil {
		return k8s.Meaning(k8s.OpApply, err)
	}
	// The other egress mode's policy exists only if the tenant was applied in that mode before,
	// or if its history is unknown (a namespace older than its record).
	mode := string(plan.Config.EgressMode)
	if nsExisted && prev.EgressMode != mode {
		for _, stale := range tenant.Stale() {
			if err := w.opts.Applier.Delete(ctx, stale.GVK, stale.Namespace, stale.Name); err != nil {
				return k8s.Meaning(k8s.OpDelete, err)
			}
		}
	}
	next := prev
	next.Hash, next.AppliedAt, next.EgressMode = hash, w.opts.Now().UTC(), mode
	recorded, err := lease.RecordApplied(ctx, w.tenants, ns, rev, next)
	switch {
	case err != nil:
		// The tenant is applied; losing the record only costs a re-apply next time. The owner
		// never changes.
		log.Warn().Err(err).Str(events.LogKeyNamespace, ns).Msg("recording the applied tenant failed")
	case !recorded:
		// Another acquire of the company applied and recorded the same tenant meanwhile.
		log.Debug().Str(events.LogKeyNamespace, ns).Msg("tenant recorded by a concurrent acquire")
	}
	log.Info().Str(events.LogKeyNamespace, ns).Dur("took", w.opts.Now().Sub(start)).Msg("tenant applied")
	return nil
}

// apply applies the Namespace first, since everything else lives in it, then the other objects
// at once: they do not depend on each other, and a cold tenant's first run waits for them.
func (w *Worker) apply(ctx context.Context, objs []*unstructured.Unstructured) error {
	if len(objs) == 0 {
		return nil
	}
	if err := w.opts.Applier.Apply(ctx, objs[0]); err != nil {
		return err
	}
	errs := make([]error, len(objs)-1)
	var wg sync.WaitGroup
	for i, obj := range objs[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = w.opts.Applier.Apply(ctx, obj)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// fresh reports whether rec says the tenant with this hash was applied within the resync
// period, and the namespace exists.
func (w *Worker) fresh(rec record, ns, hash string) bool {
	if _, ok, _ := w.namespaces.GetByKey(ns); !ok {
		return false
	}
	return rec.Hash == hash && w.opts.Now().Sub(rec.AppliedAt) < w.opts.Resync
}

// reportFailure records that the acquire failed and publishes the run's failed event. A request
// too malformed to name a run has no record and nobody to tell (PublishFailure logs it). An
// acquire the lease-record quota refused gets no record: a company past its quota writes none.
func (w *Worker) reportFailure(ctx context.Context, m jetstream.Msg, te *events.TerminalError) error {
	var quota *lease.RecordQuotaError
	if !errors.As(te, &quota) {
		if err := lease.RecordFailure(ctx, w.records, m, te.Code, w.opts.Now()); err != nil {
			return err
		}
	}
	return events.PublishFailure(ctx, w.publisher, w.log, m, te)
}
