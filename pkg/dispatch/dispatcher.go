// Package dispatch is the dispatcher: it turns dispatch requests into a run's workload (a Job,
// a Pod or an agent-sandbox Sandbox, through pkg/workload) and its per-run Secret, keeps one
// active run per agent, and carries out release and destroy requests.
package dispatch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"

	"github.com/kubeclip/kubeclip/pkg/broker/mintclient"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// Defaults of Options.
const (
	// DefaultAgentBusyTimeout is how long an acquire for a busy agent waits in the queue before
	// it fails with agent_busy.
	DefaultAgentBusyTimeout = 5 * time.Minute
	// DefaultAgentBusyRetry is how often a waiting acquire looks again whether its agent is free.
	DefaultAgentBusyRetry = time.Second
	// DefaultReleaseTimeout bounds a release: deleting the workload and waiting for its pod.
	DefaultReleaseTimeout = 2 * time.Minute
	// DefaultSandboxdImage is the local cluster's sandboxd image (hack/cluster); deployments set
	// their own.
	DefaultSandboxdImage = "kubeclip.local/sandboxd:dev"
	// failureCleanupTimeout bounds deleting what a failed dispatch created before `failed` is
	// reported; what is left is reconciliation's.
	failureCleanupTimeout = 30 * time.Second
	// adapterSecretTTL is how long the adapter key Secret is cached: key rotation shows up
	// within a minute without a GET per acquire.
	adapterSecretTTL = 30 * time.Second
	// DefaultConcurrency is how many requests of each stream one dispatcher handles at once. An
	// acquire's handler is almost all API round trips (issue 16: its KV steps took 6 ms of the
	// 592 a handler took at 1,000 live leases; the rest was two POSTs and a PATCH, now the two
	// POSTs of k8s.StartPodRun), so a dispatcher acquires at most Concurrency ÷ 2 POSTs per
	// second: 16 was 27/s at 100/s offered with POSTs at 227 ms. Past what the API server
	// answers, more only queues in it: 64 on the 2-core test machine made a POST take 1.3 s and
	// acquired 30/s. 32 keeps up with 100/s at POSTs of 160 ms.
	DefaultConcurrency = 32
)

// Options configures a Dispatcher.
type Options struct {
	// Clientset creates Jobs, Secrets and pods; required.
	Clientset kubernetes.Interface
	// Dynamic creates Sandbox CRs and scoped egress policies; required.
	Dynamic dynamic.Interface
	// Metadata lists the workloads of the reconcile pass, their metadata only; required.
	Metadata metadata.Interface
	// Applier applies scoped egress policies; required.
	Applier *k8s.Applier
	// JetStream consumes the requests and publishes the events; required.
	JetStream jetstream.JetStream
	// Subjects carries the subject prefix.
	Subjects events.Subjects
	// Logger receives the dispatcher's records.
	Logger zerolog.Logger
	// Now is the clock; defaults to time.Now.
	Now func() time.Time
	// NewID mints workload ids; defaults to ulid.Make (monotonic, safe for concurrent use).
	NewID func() ulid.ULID
	// Random feeds bootstrap tokens; defaults to crypto/rand.
	Random io.Reader
	// LookupEnv finds adapter API keys in the dispatcher's environment (os.LookupEnv from main);
	// nil finds none.
	LookupEnv func(string) (string, bool)
	// AdapterSecret, when set, is a Secret whose keys are adapter API keys; they win over
	// LookupEnv. It is read with the dispatcher's own credentials, never taken from an event.
	AdapterSecret types.NamespacedName
	// BrokeredKeys are the environment keys the credential broker holds (issue 27; the
	// operator's --brokered-keys): a run's Secret carries the lease's placeholder for each,
	// minted by Minter, never its real value. None: off.
	BrokeredKeys []string
	// Minter mints the placeholders of BrokeredKeys (mintclient.Client); required with them.
	Minter Minter
	// AgentBusyTimeout bounds how long an acquire waits for its agent's previous run.
	AgentBusyTimeout time.Duration
	// AgentBusyRetry is how often a waiting acquire checks its agent again.
	AgentBusyRetry time.Duration
	// ReleaseTimeout bounds one release or destroy.
	ReleaseTimeout time.Duration
	// Concurrency is the number of requests handled at once per consumer (default
	// DefaultConcurrency).
	Concurrency int
	// DrainTimeout bounds shutdown.
	DrainTimeout time.Duration
	// OrphanPolicy says what to do with a workload that has no lease at all (default report).
	OrphanPolicy OrphanPolicy
	// ReconcileInterval is how often orphaned workloads are looked for (default
	// DefaultReconcileInterval).
	ReconcileInterval time.Duration
	// ReconcilePageSize is how many workloads one LIST of the reconcile pass returns (default
	// workload.DefaultListPageSize): the pass holds one page at a time.
	ReconcilePageSize int64
	// Observer is told about consumed and published messages (metrics); nil means none.
	Observer events.Observer
	// StreamReplicas is the replica count of the parking stream and the agent bucket (default 1).
	StreamReplicas int
	// StoreBytes is the JetStream store the parking stream and the agent and warm buckets take
	// their share of (0: the default).
	StoreBytes int64
	// Backoff is the retry schedule of failed messages (events.DefaultBackoff when nil).
	Backoff func(attempt uint64) time.Duration
	// SandboxKey is the installation's master key (execspec.ReadMasterKey): the run Secret of
	// an exec-capable lease carries the seed derived from it. Without it, exec-capable backends
	// are refused with backend_unavailable.
	SandboxKey []byte
	// SandboxdImage is the image of sandboxd's init container (default DefaultSandboxdImage).
	SandboxdImage string
	// Operator is the installation's policy for every company (allowed namespace prefixes,
	// reserved namespaces, adapter keys, the namespace cap, reusable leases' volumes); zero
	// fields take policy.DefaultOperator's.
	Operator policy.Operator
	// LeaseIdleWindow is how long a released reusable lease keeps its pod before it is
	// suspended (default DefaultLeaseIdleWindow); see reuse.go.
	LeaseIdleWindow time.Duration
	// LeaseMaxAge is how long a suspended reusable lease keeps its volume before it is
	// collected (default DefaultLeaseMaxAge).
	LeaseMaxAge time.Duration
	// LeaseSweepInterval is how often reusable leases are looked at (default
	// DefaultLeaseSweepInterval).
	LeaseSweepInterval time.Duration
	// Warm bounds the warm pools of backend pod (warm.go); off unless Warm.Max > 0, which
	// needs SandboxKey.
	Warm WarmOptions
	// WarmObserver is told about warm acquires and pools (metrics); nil means none.
	WarmObserver WarmObserver
	// RunObserver is told how long each lease took from its record to `created` (metrics);
	// nil means none.
	RunObserver RunObserver
	// Bind is sandboxd's bind call, which warm pools need.
	Bind Binder
}

func (o Options) withDefaults() (_ Options, err error) {
	switch {
	case o.Clientset == nil:
		return o, errors.New("dispatch: Options.Clientset is required")
	case o.Dynamic == nil:
		return o, errors.New("dispatch: Options.Dynamic is required")
	case o.Metadata == nil:
		return o, errors.New("dispatch: Options.Metadata is required")
	case o.Applier == nil:
		return o, errors.New("dispatch: Options.Applier is required")
	case o.JetStream == nil:
		return o, errors.New("dispatch: Options.JetStream is required")
	case o.AgentBusyTimeout < 0, o.AgentBusyRetry < 0, o.ReleaseTimeout < 0,
		o.LeaseIdleWindow < 0, o.LeaseMaxAge < 0, o.LeaseSweepInterval < 0:
		return o, errors.New("dispatch: Options durations must not be negative")
	}
	o.Operator = o.Operator.WithDefaults()
	if err := o.Operator.Validate(); err != nil {
		return o, fmt.Errorf("dispatch: Options.Operator: %w", err)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.NewID == nil {
		o.NewID = ulid.Make
	}
	if o.Random == nil {
		o.Random = rand.Reader
	}
	if o.LookupEnv == nil {
		o.LookupEnv = func(string) (string, bool) { return "", false }
	}
	if len(o.BrokeredKeys) > 0 && o.Minter == nil {
		return o, errors.New("dispatch: Options.BrokeredKeys need Options.Minter: a brokered key's Secret entry is its placeholder, minted by the credential broker")
	}
	if o.AgentBusyTimeout == 0 {
		o.AgentBusyTimeout = DefaultAgentBusyTimeout
	}
	if o.AgentBusyRetry == 0 {
		o.AgentBusyRetry = DefaultAgentBusyRetry
	}
	if o.ReleaseTimeout == 0 {
		o.ReleaseTimeout = DefaultReleaseTimeout
	}
	if o.SandboxdImage == "" {
		o.SandboxdImage = DefaultSandboxdImage
	}
	if o.SandboxKey != nil && len(o.SandboxKey) < execspec.MinMasterKeySize {
		return o, fmt.Errorf("dispatch: Options.SandboxKey must hold at least %d bytes", execspec.MinMasterKeySize)
	}
	if o.Warm, err = o.Warm.withDefaults(); err != nil {
		return o, err
	}
	if o.Warm.Enabled() && (o.SandboxKey == nil || o.Bind == nil) {
		return o, errors.New("dispatch: warm pools (Options.Warm.Max > 0) need Options.SandboxKey and Options.Bind: their pods serve backend pod")
	}
	if o.OrphanPolicy == "" {
		o.OrphanPolicy = OrphanReport
	}
	if !o.OrphanPolicy.Valid() {
		return o, fmt.Errorf("dispatch: unknown orphan policy %q (delete or report)", o.OrphanPolicy)
	}
	if o.ReconcileInterval <= 0 {
		o.ReconcileInterval = DefaultReconcileInterval
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.ReconcilePageSize <= 0 {
		o.ReconcilePageSize = workload.DefaultListPageSize
	}
	if o.LeaseIdleWindow == 0 {
		o.LeaseIdleWindow = DefaultLeaseIdleWindow
	}
	if o.LeaseMaxAge == 0 {
		o.LeaseMaxAge = DefaultLeaseMaxAge
	}
	if o.LeaseSweepInterval == 0 {
		o.LeaseSweepInterval = DefaultLeaseSweepInterval
	}
	return o, nil
}

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

// handleDispatch creates the run's workload and Secret and publishes `created`.
//
// The lease record decides what happens, with compare-and-set at each step (pkg/lease): a
// dispatch of a lease that failed, finished or ended does nothing; the workload name is fixed
// by the dispatch transition, so a redelivery reuses it; and `created` goes out only if the
// lease could move to created. A release that came while the workload was being made leaves
// the lease releasing, and this handler, which holds the only dispatch, completes it: the
// run ends in exactly one coherent outcome.
func (d *Dispatcher) handleDispatch(ctx context.Context, m jetstream.Msg) error {
	took := newStepTimer(d.opts.Now, queuedAt(m, time.Time{}))
	req, err := events.DecodeDispatch(m.Subject(), m.Data())
	if err != nil {
		return err
	}
	ref := events.Ref(req.CompanyID, req.RunID)
	log := d.log.With().Str(events.LogKeyRunID, req.RunID).Str(events.LogKeyTenant, req.CompanyID).Logger()
	plan, err := lease.New(req.AcquireRequest, d.opts.Now(), d.opts.Operator)
	if err != nil {
		return err
	}
	if plan.Namespace != req.Namespace {
		return events.Terminalf(events.CodeInternal, "namespace", "the tenant-worker chose namespace %s, the dispatcher %s", req.Namespace, plan.Namespace)
	}
	// Defence in depth: the tenant-worker claimed the namespace for this company before it
	// handed the lease over; a run never goes into a namespace another company owns.
	owner, _, _, err := lease.ReadTenant(ctx, d.tenants, plan.Namespace)
	if err != nil {
		return err
	}
	if owner.CompanyID != req.CompanyID {
		return events.Terminalf(events.CodeNamespaceNotAllowed, "namespace", "namespace %s is not this company's tenant", plan.Namespace)
	}
	rec, _, err := d.records.Get(ctx, ref)
	if errors.Is(err, lease.ErrNotFound) {
		return events.Terminalf(events.CodeInternal, "", "run %s has no lease record; the tenant-worker writes one before it dispatches", req.RunID)
	}
	// A dispatch redelivered after its run was created counts nowhere again (warm pools).
	createdBefore := rec.State == lease.StateCreated
	if err != nil {
		return err
	}
	switch {
	case rec.State == lease.StateReleasing && rec.WorkloadName != "":
		return d.completeRelease(ctx, log, rec) // redelivered after a release caught it mid-way
	case !rec.State.Live():
		log.Info().Str("state", string(rec.State)).Msg("lease is no longer live; dropping its dispatch")
		return nil
	}
	// A redelivery of a created run: its lease may not say finished yet (that update is best
	// effort), so ask the run stream; a dispatch redelivered after its run's result would run
	// the agent a second time.
	if rec.State == lease.StateCreated {
		if over, err := events.ResultPublished(ctx, d.runs, d.opts.Subjects, ref); err != nil || over {
			return err
		}
	}

	if err := d.checkReusable(rec, plan); err != nil {
		return err
	}
	took.done(stepCheck)
	if held, err := d.holdAgent(ctx, log, m, plan); !held || err != nil {
		return err
	}
	took.done(stepGuard)
	name := policy.WorkloadName(d.opts.NewID())
	var warmPod *corev1.Pod
	if rec.State == lease.StateRequested && d.warmEligible(plan, rec) {
		if warmPod, err = d.claimWarm(ctx, m, plan); err != nil {
			return err
		}
		if warmPod != nil {
			name = warmPod.Name
		}
		took.done(stepClaim)
	}
	var claim string
	if rec.Reusable {
		w, err := workload.For(plan.Config.Backend, d.workloads)
		if err != nil {
			return err
		}
		claim = w.ClaimName(name)
	}
	rec, err = d.records.Modify(ctx, ref, lease.Dispatch(lease.Workload{
		Namespace: plan.Namespace, Name: name, SecretName: policy.SecretName(name),
		Backend: string(plan.Config.Backend), VolumeClaim: claim, ExpiresAt: plan.ExpiresAt(),
		RunDeadline: plan.RunDeadline(), Warm: warmPod != nil,
	}))
	ended := errors.Is(err, lease.ErrEnded) || errors.Is(err, lease.ErrFailed) || errors.Is(err, lease.ErrFinished)
	if warmPod != nil && (ended || (err == nil && rec.WorkloadName != warmPod.Name)) {
		// The lease did not take the pod this attempt claimed: nothing else may have it. (After
		// any other error the record may have taken it: a redelivery finds it, boundTo.)
		if eerr := workload.EvictWarmPod(ctx, d.opts.Clientset, warmPod); eerr != nil {
			log.Warn().Err(eerr).Msg("evicting a warm pod the lease did not take failed; the orphan pass will")
		}
	}
	if ended {
		// Released (or failed) before anything was created: nothing to undo but the guard.
		d.freeAgent(ctx, log, req.CompanyID, req.AgentID, req.RunID)
		log.Info().Str("state", string(rec.State)).Msg("lease ended before its workload was created")
		return nil
	}
	if err != nil {
		return err
	}
	took.done(stepRecord)
	created, run, err := d.create(ctx, log, plan, rec, warmPod)
	if err != nil {
		return err
	}
	took.done(stepCreate)
	rec, err = d.records.Modify(ctx, ref, lease.Created)
	if errors.Is(err, lease.ErrEnded) {
		return d.completeRelease(ctx, log, rec)
	}
	if err != nil {
		return err
	}
	took.done(stepCreated)
	ack, err := d.publisher.Publish(ctx, created)
	if err != nil {
		return fmt.Errorf("publishing created: %w", err)
	}
	took.done(stepPublish)
	if d.opts.RunObserver != nil && !ack.Duplicate {
		// Timed once: a redelivery's publish is a duplicate.
		d.opts.RunObserver.RunCreated(d.opts.Now().Sub(rec.CreatedAt))
	}
	// A Secret the workload does not own yet (a redelivery found it; a reusable lease's, which
	// its claim owns) is adopted after `created` goes out: the pod starts without it, and
	// Paperclip hears one API round trip sooner. A warm pod's is created only now: its sandboxd
	// got the keys with the bind. A failure is retried through the whole (idempotent) handler.
	if err := run.AdoptSecret(ctx); err != nil {
		return err
	}
	took.done(stepAdopt)
	log.Info().Str(events.LogKeyNamespace, created.Namespace).Str("workload", created.WorkloadName).Bool("warm", rec.Warm).Dict(logKeyTookMs, took.dict()).Msg("run created")
	if d.warmEligible(plan, rec) && !createdBefore {
		d.afterWarmAcquire(ctx, log, plan, rec)
	}
	return nil
}

// warmEligible reports whether an acquire may get a warm pod: warm pools are on, its workload
// can be a warm pod (workload.Workload.Warmable: the backend's answer, not a name compared
// here), and it is not a reusable lease (whose pod mounts the lease's own volume).
func (d *Dispatcher) warmEligible(plan lease.Plan, rec lease.Record) bool {
	if d.warm == nil || rec.Reusable {
		return false
	}
	w, err := workload.For(plan.Config.Backend, d.workloads)
	return err == nil && w.Warmable()
}

// warmSpec is the run's spec as a warm pod of its shape is rendered from (policy.WarmSpec).
func (d *Dispatcher) warmSpec(plan lease.Plan) policy.RunSpec {
	spec := plan.RunSpec("")
	spec.SandboxdImage = d.opts.SandboxdImage
	return spec
}

// claimWarm claims a warm pod for the acquire: the one an earlier attempt of this dispatch
// claimed without recording it, or a Ready one of its pool; nil when there is none.
func (d *Dispatcher) claimWarm(ctx context.Context, m jetstream.Msg, plan lease.Plan) (*corev1.Pod, error) {
	if md, err := m.Metadata(); err == nil && md.NumDelivered > 1 {
		if pod, err := d.warm.boundTo(ctx, plan.Namespace, plan.Request.RunID); err != nil || pod != nil {
			return pod, err
		}
	}
	return d.warm.claim(ctx, d.warmSpec(plan))
}

// startWarm makes pod, the warm pod the lease record names (claimed by this dispatch, or read
// again on a redelivery), the run's workload: the bind call, with the run Secret's keys; the
// Secret itself is created once `created` is out (workload.StartBound).
func (d *Dispatcher) startWarm(ctx context.Context, rec lease.Record, secret *corev1.Secret, pod *corev1.Pod) (workload.Created, error) {
	if pod == nil {
		got, err := d.opts.Clientset.CoreV1().Pods(rec.Namespace).Get(ctx, rec.WorkloadName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return workload.Created{}, events.Terminalf(events.CodeInternal, "", "the warm pod %s the lease bound is gone before it served", rec.WorkloadName)
		}
		if err != nil {
			return workload.Created{}, fmt.Errorf("reading warm pod %s/%s: %w", rec.Namespace, rec.WorkloadName, err)
		}
		pod = got
	}
	if pod.Labels[policy.LabelRunID] != rec.RunID {
		return workload.Created{}, events.Terminalf(events.CodeInternal, "", "pod %s is not bound to run %s", rec.WorkloadName, rec.RunID)
	}
	if err := d.warm.bind(ctx, pod, secret); err != nil {
		return workload.Created{}, err
	}
	return workload.StartBound(d.opts.Clientset, secret, pod), nil
}

// afterWarmAcquire is an eligible acquire's bookkeeping once `created` is out: a bound pod's
// bind Secret deleted (its sandboxd read it long ago), the acquire recorded in its pool. Errors
// are logged; the run is created.
func (d *Dispatcher) afterWarmAcquire(ctx context.Context, log zerolog.Logger, plan lease.Plan, rec lease.Record) {
	if rec.Warm {
		if err := workload.DeleteWarmSecret(ctx, d.opts.Clientset, rec.Namespace, rec.WorkloadName); err != nil {
			log.Warn().Err(err).Msg("deleting a bound pod's bind Secret failed; the pod's deletion takes it")
		}
	}
	d.warm.noteAcquire(ctx, d.warmSpec(plan), rec.Warm)
}

// createEvictingWarm is a cold create the tenant's quota refused (err): the company's warm pods
// are evicted for it, and it is tried again until the quota takes the deletions into account
// (its controller recounts within a second or two), for at most warmQuotaRetry. Without warm
// pods to evict, err stands.
func (d *Dispatcher) createEvictingWarm(ctx context.Context, log zerolog.Logger, w workload.Workload, spec policy.RunSpec, secret *corev1.Secret, err error) (workload.Created, error) {
	evicted, eerr := d.warm.evictForQuota(ctx, log, spec.Namespace, spec.CompanyID)
	if eerr != nil {
		log.Warn().Err(eerr).Msg("evicting warm pods for a quota refusal failed in part")
	}
	if evicted == 0 {
		return workload.Created{}, err
	}
	deadline := d.opts.Now().Add(warmQuotaRetry)
	for {
		select {
		case <-ctx.Done():
			return workload.Created{}, errors.Join(err, context.Cause(ctx))
		case <-time.After(warmQuotaRetryEvery):
		}
		run, err := w.Create(ctx, spec, secret)
		if _, quota := k8s.QuotaRefusal(err); !quota || !d.opts.Now().Before(deadline) {
			return run, err
		}
	}
}

// holdAgent takes the agent's guard for this run. While another run of the agent holds it, the
// dispatch is parked (see park.go) and holdAgent reports held false: the caller acknowledges
// the message. A dispatch that has waited AgentBusyTimeout since its acquire fails with
// agent_busy.
func (d *Dispatcher) holdAgent(ctx context.Context, log zerolog.Logger, m jetstream.Msg, plan lease.Plan) (held bool, err error) {
	req := plan.Request
	ttl := time.Duration(plan.Config.PodActivityDeadlineSec)*time.Second + agentGuardMargin
	if plan.Deadline != nil {
		ttl = time.Duration(plan.Deadline.ActiveDeadlineSeconds)*time.Second + agentGuardMargin
	}
	holder, err := d.agents.take(ctx, req.CompanyID, req.AgentID, req.RunID, ttl)
	if err != nil {
		return false, err
	}
	if holder == req.RunID {
		return true, nil
	}
	queuedAt := queuedAt(m, d.opts.Now())
	if waited := d.opts.Now().Sub(queuedAt); waited >= d.opts.AgentBusyTimeout {
		return false, events.Terminalf(events.CodeAgentBusy, "agentId",
			"agent %s is still running run %s after %s; one run per agent at a time", req.AgentID, holder, waited.Round(time.Second))
	}
	if err := d.park(ctx, log, m, req, queuedAt); err != nil {
		return false, err
	}
	// The holder may have freed the agent between take and park, finding nothing to unpark.
	if now, err := d.agents.holder(ctx, req.CompanyID, req.AgentID); err == nil && now == "" {
		if err := d.unpark(ctx, req.CompanyID, req.AgentID); err != nil {
			log.Warn().Err(err).Msg("unparking after the agent was freed failed; the sweep will")
		}
	}
	return false, nil
}

// freeAgent frees the agent of runID and hands the agent's oldest parked dispatch back to the
// work queue. Errors are logged: the guard's TTL frees the agent, the sweep unparks.
func (d *Dispatcher) freeAgent(ctx context.Context, log zerolog.Logger, companyID, agentID, runID string) {
	if agentID == "" {
		return
	}
	d.agents.free(ctx, log, companyID, agentID, runID)
	if err := d.unpark(ctx, companyID, agentID); err != nil {
		log.Warn().Err(err).Msg("unparking the agent's next dispatch failed; the sweep will")
	}
}

// create makes the run's workload and Secret under the name its lease record fixed,
// idempotently, and returns the created event and the workload, whose Secret adoption is done
// once the event is published. A warm lease's workload is the warm pod it claimed (warmPod,
// nil on a redelivery: read again), bound instead of created.
func (d *Dispatcher) create(ctx context.Context, log zerolog.Logger, plan lease.Plan, rec lease.Record, warmPod *corev1.Pod) (events.RunCreatedEvent, workload.Created, error) {
	req := plan.Request
	spec := plan.RunSpec(rec.WorkloadName)
	spec.SandboxdImage, spec.ExpiresAt = d.opts.SandboxdImage, rec.ExpiresAt
	w, err := d.workload(rec)
	if err != nil {
		return events.RunCreatedEvent{}, workload.Created{}, err
	}
	if w.Backend().ExecCapable() && d.opts.SandboxKey == nil {
		return events.RunCreatedEvent{}, workload.Created{}, events.Terminalf(events.CodeBackendUnavailable, "config.backend",
			"backend %q needs this kubeclip installation's sandbox key, which its operator has not set up; use backend %q", w.Backend(), policy.BackendJob)
	}
	secret, err := d.renderSecret(ctx, plan, spec, w)
	if err != nil {
		return events.RunCreatedEvent{}, workload.Created{}, err
	}
	spec.SecretEnvKeys = policy.SecretEnvKeys(secret)
	if rec.VolumeClaim != "" {
		if spec.VolumeClaim, err = d.renderClaim(rec); err != nil {
			return events.RunCreatedEvent{}, workload.Created{}, err
		}
	}

	var run workload.Created
	switch {
	case rec.Warm:
		run, err = d.startWarm(ctx, rec, secret, warmPod)
	default:
		run, err = w.Create(ctx, spec, secret)
		if _, quota := k8s.QuotaRefusal(err); quota && d.warm != nil {
			run, err = d.createEvictingWarm(ctx, log, w, spec, secret, err)
		}
	}
	if err != nil {
		return events.RunCreatedEvent{}, workload.Created{}, k8s.Meaning(k8s.OpCreate, err)
	}

	if !plan.Grant.Empty() {
		obj, err := policy.RenderScopedEgress(spec, plan.Grant, run.Owner)
		if err != nil {
			return events.RunCreatedEvent{}, workload.Created{}, events.Terminal(events.CodeInternal, "executionWorkspaceSettings.networkEgress", err)
		}
		if err := d.opts.Applier.Apply(ctx, obj); err != nil {
			return events.RunCreatedEvent{}, workload.Created{}, k8s.Meaning(k8s.OpCreate, err)
		}
	}

	if run.Existed {
		log.Info().Msg("workload already existed; republishing created")
	}
	phase := events.PhasePending
	if rec.Warm {
		phase = events.PhaseRunning // a warm pod is Running and Ready when it is claimed
	}
	return events.RunCreatedEvent{
		RunID: req.RunID, CompanyID: req.CompanyID,
		ProviderLeaseID: rec.WorkloadName, Namespace: rec.Namespace,
		WorkloadName: rec.WorkloadName, SecretName: rec.SecretName, Backend: rec.Backend,
		Phase: phase, ExpiresAt: rec.ExpiresAt, Warm: rec.Warm,
	}, run, nil
}

// workload is the lease's workload: its backend, chosen by workload.For.
func (d *Dispatcher) workload(rec lease.Record) (workload.Workload, error) {
	return workload.For(policy.Backend(rec.Backend), d.workloads)
}

// renderSecret renders the run's Secret: bootstrap token, adapter API keys from the dispatcher's
// own environment or its adapter Secret, the adapter's default env and the egress grant env.
// The owner reference is set by workload.Created.AdoptSecret once the workload has a UID.
func (d *Dispatcher) renderSecret(ctx context.Context, plan lease.Plan, spec policy.RunSpec, w workload.Workload) (*corev1.Secret, error) {
	lookup, err := d.adapterKeys(ctx)
	if err != nil {
		return nil, err
	}
	env := policy.BuildAdapterEnv(plan.Adapter, lookup)
	for k, v := range policy.EgressGrantEnv(plan.Grant) {
		env[k] = v
	}
	if env, err = d.placeholders(ctx, plan, spec, env); err != nil {
		return nil, err
	}
	if w.Backend().ExecCapable() {
		// sandboxd's key for this lease; the exec-worker derives the same from the master key.
		// Only the pod's init container reads it (not the agent container's environment).
		env[execspec.SeedEnv] = hex.EncodeToString(execspec.DeriveSeed(d.opts.SandboxKey, spec.Namespace, spec.WorkloadName))
	}
	token, err := policy.NewBootstrapToken(d.opts.Random)
	if err != nil {
		return nil, err
	}
	placeholder := policy.OwnerReference("batch/v1", "Job", spec.WorkloadName, "set-on-create")
	secret, err := policy.RenderSecret(spec, placeholder, token, env)
	if err != nil {
		return nil, events.Terminal(events.CodeInvalidConfig, "config.adapters", err)
	}
	return secret, nil
}

// Minter mints a lease's placeholders: env with each brokered key's value replaced by its
// placeholder, or an error naming the key (pkg/broker/mintclient.Client).
type Minter interface {
	Placeholders(ctx context.Context, lease mintclient.Lease, keys []string, env map[string]string) (map[string]string, error)
}

var _ Minter = (*mintclient.Client)(nil)

// placeholders replaces the brokered keys' values in a run Secret's env with the lease's
// placeholders (issue 27), so the Secret, the pod's environment and a warm pod's bind (which
// sends the Secret's keys) carry placeholders only. It runs before anything of the run is
// created, so a broker that does not answer or refuses fails the dispatch with nothing to
// undo; what the failure means is mintclient.Meaning's to say. The mint is idempotent per
// lease and key, so a redelivered dispatch renders the same Secret.
func (d *Dispatcher) placeholders(ctx context.Context, plan lease.Plan, spec policy.RunSpec, env map[string]string) (map[string]string, error) {
	if len(d.opts.BrokeredKeys) == 0 {
		return env, nil
	}
	ref := mintclient.Lease{CompanyID: plan.Request.CompanyID, RunID: plan.Request.RunID, LeaseID: spec.WorkloadName}
	out, err := d.opts.Minter.Placeholders(ctx, ref, d.opts.BrokeredKeys, env)
	if err != nil {
		return nil, mintclient.Meaning(err)
	}
	return out, nil
}

// adapterKeys returns the lookup for adapter API keys: the adapter Secret's keys first, then
// the dispatcher's environment.
func (d *Dispatcher) adapterKeys(ctx context.Context) (func(string) (string, bool), error) {
	if d.opts.AdapterSecret.Name == "" {
		return d.opts.LookupEnv, nil
	}
	d.secretMu.Lock()
	defer d.secretMu.Unlock()
	if d.secretValues == nil || d.opts.Now().Sub(d.secretFetched) > adapterSecretTTL {
		// Optional: a missing Secret means no keys from it, not a stuck dispatcher.
		values, err := k8s.SecretValues(ctx, d.opts.Clientset, d.opts.AdapterSecret)
		if err != nil {
			return nil, err
		}
		d.secretValues, d.secretFetched = values, d.opts.Now()
	}
	values := d.secretValues
	return func(k string) (string, bool) {
		if v, ok := values[k]; ok && v != "" {
			return v, true
		}
		return d.opts.LookupEnv(k)
	}, nil
}

// reportFailure publishes the run's failed event for a release or destroy that will not be
// retried; nothing changed.
func (d *Dispatcher) reportFailure(ctx context.Context, m jetstream.Msg, te *events.TerminalError) error {
	return events.PublishFailure(ctx, d.publisher, d.log, m, te)
}

// reportDispatchFailure ends an acquire that failed for good: the lease is marked failed, what
// the dispatch created is deleted and the agent freed (both best effort: reconciliation deletes
// the workload of a failed lease, the guard's TTL frees the agent), then `failed` goes out. A
// lease that a release caught meanwhile is released instead, and no failure is reported.
func (d *Dispatcher) reportDispatchFailure(ctx context.Context, m jetstream.Msg, te *events.TerminalError) error {
	ref, _ := events.FailureRef(m)
	if ref.Validate() != nil {
		return events.PublishFailure(ctx, d.publisher, d.log, m, te)
	}
	log := d.log.With().Str(events.LogKeyRunID, ref.RunID).Str(events.LogKeyTenant, ref.CompanyID).Logger()
	if err := lease.RecordFailure(ctx, d.records, m, te.Code, d.opts.Now()); err != nil {
		return err
	}
	rec, _, err := d.records.Get(ctx, ref)
	if err != nil {
		return err
	}
	switch rec.State {
	case lease.StateReleasing:
		return d.completeRelease(ctx, log, rec)
	case lease.StateFailed:
	default:
		// A redelivered dispatch failed after an earlier delivery created the run: the run
		// stands, and nothing is reported.
		log.Warn().Err(te).Str("state", string(rec.State)).Msg("dispatch failed after its run was created; the run stands")
		return nil
	}
	if rec.WorkloadName != "" {
		cctx, cancel := context.WithTimeout(ctx, failureCleanupTimeout)
		err := d.deleteRun(cctx, rec, true)
		cancel()
		if err != nil {
			log.Warn().Err(err).Msg("deleting what the failed dispatch created failed; reconciliation will")
		}
	}
	d.freeAgent(ctx, log, ref.CompanyID, rec.AgentID, ref.RunID)
	return events.PublishFailure(ctx, d.publisher, d.log, m, te)
}

// queuedAt is when the acquire first reached the work queue: the header a parked dispatch
// carries back, else the message's stream timestamp, so the wait for a busy agent counts from
// the acquire, not from this delivery.
func queuedAt(m jetstream.Msg, fallback time.Time) time.Time {
	if h := m.Headers().Get(headerQueuedAt); h != "" {
		if t, err := time.Parse(time.RFC3339Nano, h); err == nil {
			return t
		}
	}
	md, err := m.Metadata()
	if err != nil {
		return fallback
	}
	return md.Timestamp
}
