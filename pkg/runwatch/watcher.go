// Package runwatch follows kubeclip's runs in the cluster and publishes what they do as run
// events: status transitions, live log chunks and exactly one result per run.
//
// It is watch-driven: one shared informer over Jobs and one over Pods, both filtered to the
// objects kubeclip manages, wake a goroutine per live run. Nothing polls.
package runwatch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/rs/zerolog"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// jobEventIndex indexes FailedCreate events by the namespace/name of their Job.
const jobEventIndex = "job"

// quotaEventSelector selects the events the Job controller records when it cannot create a
// Job's pod; a ResourceQuota refusal is one of them, and the only sign of it.
const quotaEventSelector = "reason=FailedCreate,involvedObject.kind=Job"

// runIndex indexes Jobs and Pods by their run: the RunRef.Key of their company-id and run-id
// labels, so two companies' runs with the same run id never meet.
const runIndex = "run"

// Defaults of Options.
const (
	// DefaultContainer is the container the agent runs in (pkg/policy renders it so).
	DefaultContainer = "agent"
	// DefaultFlushInterval is how long a log line may wait for company before its chunk is
	// published. Lines that arrive together share a chunk; a lone line waits at most this long.
	DefaultFlushInterval = 5 * time.Millisecond
	// DefaultUnschedulableGrace lets a transient Unschedulable (capacity freed a moment later)
	// pass before the run fails.
	DefaultUnschedulableGrace = 5 * time.Second
	// DefaultStartErrorGrace lets start errors that clear by themselves pass: right after a pod
	// is bound, the kubelet may report CreateContainerConfigError ("failed to sync secret
	// cache") until the node authorizer lets it read the run's Secret. An image that cannot be
	// pulled still fails the run seconds after the pod starts, not at its deadline.
	DefaultStartErrorGrace = 10 * time.Second
)

// Options configures a Watcher.
type Options struct {
	// Clientset reads the cluster; required.
	Clientset kubernetes.Interface
	// JetStream publishes the events and reads back what was already published; required.
	JetStream jetstream.JetStream
	// Subjects carries the subject prefix.
	Subjects events.Subjects
	// Logger receives the watcher's records.
	Logger zerolog.Logger
	// Now is the clock; defaults to time.Now.
	Now func() time.Time
	// Container is the agent's container name; defaults to DefaultContainer.
	Container string
	// FlushInterval bounds how long a log line waits before it is published.
	FlushInterval time.Duration
	// UnschedulableGrace is how long a pod may stay unschedulable before its run fails.
	UnschedulableGrace time.Duration
	// StartErrorGrace is how long a pod may report a start error (image pull, container config)
	// before its run fails. Zero means DefaultStartErrorGrace; negative fails at once.
	StartErrorGrace time.Duration
	// ReplicaID names this replica in the ownership bucket; it must differ between replicas.
	// Defaults to the host name plus a random suffix.
	ReplicaID string
	// OwnershipTTL is how long a run stays owned by a replica that stopped renewing it, which
	// bounds takeover after a crash (default DefaultOwnershipTTL). Every replica must agree.
	OwnershipTTL time.Duration
	// StreamReplicas is the replica count of the ownership bucket (default 1).
	StreamReplicas int
	// ReconcileInterval is how often runs whose workload vanished unobserved get a result
	// (default DefaultReconcileInterval); the first pass runs at start.
	ReconcileInterval time.Duration
	// Observer is told about published events and runs in flight (metrics); nil means none.
	Observer Observer
}

func (o Options) withDefaults() (Options, error) {
	if o.Clientset == nil {
		return o, errors.New("runwatch: Options.Clientset is required")
	}
	if o.JetStream == nil {
		return o, errors.New("runwatch: Options.JetStream is required")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Container == "" {
		o.Container = DefaultContainer
	}
	if o.FlushInterval <= 0 {
		o.FlushInterval = DefaultFlushInterval
	}
	if o.ReconcileInterval <= 0 {
		o.ReconcileInterval = DefaultReconcileInterval
	}
	if o.OwnershipTTL == 0 {
		o.OwnershipTTL = DefaultOwnershipTTL
	}
	if o.OwnershipTTL < time.Second {
		return o, errors.New("runwatch: Options.OwnershipTTL must be at least 1s")
	}
	if o.ReplicaID == "" {
		host, _ := os.Hostname()
		o.ReplicaID = fmt.Sprintf("%s-%s", host, strings.ToLower(ulid.Make().String()[20:]))
	}
	if o.UnschedulableGrace < 0 {
		return o, errors.New("runwatch: Options.UnschedulableGrace must not be negative")
	}
	switch {
	case o.StartErrorGrace == 0:
		o.StartErrorGrace = DefaultStartErrorGrace
	case o.StartErrorGrace < 0:
		o.StartErrorGrace = 0
	}
	return o, nil
}

// Watcher publishes the run events of every run kubeclip manages in the cluster.
type Watcher struct {
	opts      Options
	log       zerolog.Logger
	publisher *events.Publisher

	jobs, pods cache.Indexer
	// jobEvents holds the Job controller's FailedCreate events, by Job.
	jobEvents cache.Indexer
	owners    *owners
	leases    lease.Records

	mu       sync.Mutex
	trackers map[events.RunRef]*tracker
	wg       sync.WaitGroup
}

// New validates opts and returns a Watcher; Run starts it.
func New(opts Options) (*Watcher, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	var pubObs events.PublishObserver
	if opts.Observer != nil {
		pubObs = opts.Observer
	}
	pub, err := events.NewPublisher(events.PublisherOptions{JS: opts.JetStream, Subjects: opts.Subjects, Now: opts.Now, Observer: pubObs})
	if err != nil {
		return nil, err
	}
	return &Watcher{
		opts:      opts,
		log:       opts.Logger,
		publisher: pub,
		trackers:  map[events.RunRef]*tracker{},
	}, nil
}

// Run watches until ctx is done. Runs in flight when it returns are picked up again, from the
// last published log chunk, by the next watcher to start.
func (w *Watcher) Run(ctx context.Context) error {
	stream, err := w.opts.JetStream.Stream(ctx, w.opts.Subjects.RunStream())
	if err != nil {
		return fmt.Errorf("looking up stream %s: %w", w.opts.Subjects.RunStream(), err)
	}
	kv, err := w.opts.JetStream.CreateOrUpdateKeyValue(ctx, OwnershipBucketConfig(w.opts.OwnershipTTL, w.opts.StreamReplicas))
	if err != nil {
		return fmt.Errorf("opening KV bucket %s: %w", OwnershipBucket, err)
	}
	w.owners = newOwners(kv, w.opts.ReplicaID, w.opts.OwnershipTTL, w.log)
	leases, err := w.opts.JetStream.KeyValue(ctx, events.LeaseBucket)
	if err != nil {
		return fmt.Errorf("opening KV bucket %s: %w", events.LeaseBucket, err)
	}
	w.leases = lease.Records{KV: leases}
	factory := informers.NewSharedInformerFactoryWithOptions(w.opts.Clientset, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = policy.LabelManagedBy + "=" + policy.ManagedBy
		}),
		informers.WithTransform(stripManagedFields),
	)
	jobInf := factory.Batch().V1().Jobs().Informer()
	podInf := factory.Core().V1().Pods().Informer()
	for _, inf := range []cache.SharedIndexInformer{jobInf, podInf} {
		if err := inf.AddIndexers(cache.Indexers{runIndex: indexByRun}); err != nil {
			return fmt.Errorf("adding run index: %w", err)
		}
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { w.wake(ctx, stream, obj) },
			UpdateFunc: func(_, obj any) { w.wake(ctx, stream, obj) },
			DeleteFunc: func(obj any) { w.wake(ctx, stream, obj) },
		}); err != nil {
			return fmt.Errorf("adding event handler: %w", err)
		}
	}
	w.jobs, w.pods = jobInf.GetIndexer(), podInf.GetIndexer()

	// Events carry no labels of kubeclip's: their informer selects by field instead.
	eventFactory := informers.NewSharedInformerFactoryWithOptions(w.opts.Clientset, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = quotaEventSelector }),
		informers.WithTransform(stripManagedFields),
	)
	eventInf := eventFactory.Core().V1().Events().Informer()
	if err := eventInf.AddIndexers(cache.Indexers{jobEventIndex: indexByJob}); err != nil {
		return fmt.Errorf("adding job index: %w", err)
	}
	if _, err := eventInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.wakeJobOf(obj) },
		UpdateFunc: func(_, obj any) { w.wakeJobOf(obj) },
	}); err != nil {
		return fmt.Errorf("adding event handler: %w", err)
	}
	w.jobEvents = eventInf.GetIndexer()

	factory.Start(ctx.Done())
	eventFactory.Start(ctx.Done())
	defer eventFactory.Shutdown()
	for _, f := range []informers.SharedInformerFactory{factory, eventFactory} {
		for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok {
				factory.Shutdown()
				return fmt.Errorf("syncing the %v informer: %w", typ, context.Cause(ctx))
			}
		}
	}
	var loops sync.WaitGroup
	loops.Add(3)
	go func() { defer loops.Done(); w.renewOwnership(ctx) }()
	go func() { defer loops.Done(); w.watchOwnership(ctx, kv) }()
	go func() { defer loops.Done(); w.reconcileLoop(ctx, stream) }()
	w.log.Info().Str("replica", w.opts.ReplicaID).Msg("watching runs")
	<-ctx.Done()
	factory.Shutdown()
	w.wg.Wait()
	loops.Wait()
	// Hand the runs over now rather than after the ownership TTL.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	w.owners.releaseAll(rctx)
	return nil
}

// renewOwnership renews the owned runs every third of the ownership TTL and hands the runs it
// lost back to their trackers, which drop their state.
func (w *Watcher) renewOwnership(ctx context.Context) {
	tick := time.NewTicker(w.opts.OwnershipTTL / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		for _, ref := range w.owners.renewAll(ctx) {
			w.log.Warn().Str(events.LogKeyRunID, ref.RunID).Str(events.LogKeyTenant, ref.CompanyID).Msg("lost ownership of a run")
			w.pokeRun(ref)
		}
	}
}

// watchOwnership wakes a run's tracker when its ownership key expires or is released, so a
// replica takes over a run whose owner died. The watch restarts after NATS comes back; every
// tracker is then woken in case it missed a change.
func (w *Watcher) watchOwnership(ctx context.Context, kv jetstream.KeyValue) {
	for ctx.Err() == nil {
		kw, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
		if err != nil {
			w.log.Warn().Err(err).Msg("watching run ownership failed; retrying")
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		w.pokeAll()
		for entry := range kw.Updates() {
			if entry == nil {
				continue
			}
			if op := entry.Operation(); op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge {
				if ref, ok := events.ParseRunKey(entry.Key()); ok {
					w.ownerChanged(ref)
				}
			}
		}
		_ = kw.Stop()
	}
}

// ownerChanged tells a run's tracker that its ownership key changed.
func (w *Watcher) ownerChanged(ref events.RunRef) {
	w.mu.Lock()
	t := w.trackers[ref]
	w.mu.Unlock()
	if t != nil {
		t.ownerChanged()
	}
}

func (w *Watcher) pokeRun(ref events.RunRef) {
	w.mu.Lock()
	t := w.trackers[ref]
	w.mu.Unlock()
	if t != nil {
		t.poke()
	}
}

func (w *Watcher) pokeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, t := range w.trackers {
		t.ownerChanged()
	}
}

// wake hands an informer event to the run's tracker, starting one for a run seen first.
func (w *Watcher) wake(ctx context.Context, stream jetstream.Stream, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, err := metaOf(obj)
	if err != nil {
		return
	}
	ref, ok := runOf(m)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if ctx.Err() != nil {
		return
	}
	t, ok := w.trackers[ref]
	if !ok {
		t = newTracker(w, stream, m.GetNamespace(), ref)
		w.trackers[ref] = t
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			t.run(ctx)
		}()
	}
	t.poke()
}

// following reports whether this replica has a tracker for the run: reconcile must not build
// a second one.
func (w *Watcher) following(ref events.RunRef) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, ok := w.trackers[ref]
	return ok
}

// forget drops a finished run's tracker once neither its Job nor its pods are left, so the map
// does not grow with every run ever seen.
func (w *Watcher) forget(ref events.RunRef) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.trackers, ref)
}

// objects returns the run's Job (nil once deleted) and its newest pod (nil before it exists) in
// namespace.
func (w *Watcher) objects(ref events.RunRef, namespace string) (*batchv1.Job, *corev1.Pod) {
	var job *batchv1.Job
	if objs, err := w.jobs.ByIndex(runIndex, ref.Key()); err == nil {
		for _, o := range objs {
			if j, ok := o.(*batchv1.Job); ok && j.Namespace == namespace {
				job = j
			}
		}
	}
	var pod *corev1.Pod
	if objs, err := w.pods.ByIndex(runIndex, ref.Key()); err == nil {
		for _, o := range objs {
			p, ok := o.(*corev1.Pod)
			if !ok || p.Namespace != namespace {
				continue
			}
			if pod == nil || p.CreationTimestamp.After(pod.CreationTimestamp.Time) {
				pod = p
			}
		}
	}
	return job, pod
}

// wakeJobOf wakes the tracker of the Job a FailedCreate event is about.
func (w *Watcher) wakeJobOf(obj any) {
	ev, ok := obj.(*corev1.Event)
	if !ok {
		return
	}
	o, exists, err := w.jobs.GetByKey(ev.InvolvedObject.Namespace + "/" + ev.InvolvedObject.Name)
	if err != nil || !exists {
		return
	}
	if job, ok := o.(*batchv1.Job); ok {
		if ref, ok := runOf(job); ok {
			w.pokeRun(ref)
		}
	}
}

// quotaRefusal reports whether the Job controller recorded that a ResourceQuota refused to let
// this Job (this incarnation: by UID) create its pod, and which quota.
func (w *Watcher) quotaRefusal(job *batchv1.Job) (k8s.Quota, bool) {
	if w.jobEvents == nil {
		return k8s.Quota{}, false
	}
	objs, err := w.jobEvents.ByIndex(jobEventIndex, job.Namespace+"/"+job.Name)
	if err != nil {
		return k8s.Quota{}, false
	}
	for _, o := range objs {
		ev, ok := o.(*corev1.Event)
		if !ok || ev.InvolvedObject.UID != job.UID {
			continue
		}
		if q, ok := k8s.QuotaFromMessage(ev.Message); ok {
			return q, true
		}
	}
	return k8s.Quota{}, false
}

func indexByJob(obj any) ([]string, error) {
	ev, ok := obj.(*corev1.Event)
	if !ok {
		return nil, nil
	}
	return []string{ev.InvolvedObject.Namespace + "/" + ev.InvolvedObject.Name}, nil
}

func indexByRun(obj any) ([]string, error) {
	m, err := metaOf(obj)
	if err != nil {
		return nil, nil //nolint:nilerr // objects without metadata are not indexed
	}
	if ref, ok := runOf(m); ok {
		return []string{ref.Key()}, nil
	}
	return nil, nil
}

// runOf is the run an object's labels name.
func runOf(m metav1.Object) (events.RunRef, bool) {
	ref := events.Ref(m.GetLabels()[policy.LabelCompanyID], m.GetLabels()[policy.LabelRunID])
	return ref, ref.CompanyID != "" && ref.RunID != ""
}

func metaOf(obj any) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no object metadata", obj)
	}
	return m, nil
}

// stripManagedFields drops managedFields from cached objects: the watcher never reads them and
// they are often the largest part of an object.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}
