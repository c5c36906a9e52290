// Package runwatch is the run-watcher: it follows kubeclip's runs in the cluster and publishes
// what they do as run events: status transitions, live log chunks and exactly one result per
// run.
//
// It is watch-driven: one shared informer over Jobs and one over Pods, both filtered to the
// objects kubeclip manages, wake the tracker of each live run (tracker.go), which a pool of step
// workers shared by every run steps, one step of a run at a time. Each run's tracker wires
// three parts with explicit inputs: the pure verdict on its Job and pod
// (pkg/runwatch/verdict), its journal (journal.go: numbering, batching, fencing and replay of
// its log chunks) and its log follower (follower.go). Replicas share the runs through an
// ownership bucket (ownership.go); reconcile.go ends runs whose workload vanished unobserved.
// Nothing polls.
package runwatch

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// Watcher publishes the run events of every run kubeclip manages in the cluster.
type Watcher struct {
	opts      Options
	log       zerolog.Logger
	publisher *events.Publisher

	mu       sync.Mutex
	trackers map[events.RunRef]*tracker
	// steps holds the runs poked and not yet stepped; a run poked while it is stepped is
	// stepped again after.
	steps workqueue.TypedInterface[events.RunRef]
	ready chan struct{}
}

// stepWorkers is how many runs are stepped at once. A step waits on NATS (a publish, a KV or
// stream read: a few round trips when a run is first seen) and never on the cluster, whose
// state is in the informer cache. An idle run costs no goroutine: 10,000 live runs held
// 10,022 goroutines, one per run, each with its stack, when each run had its own (issue 16).
const stepWorkers = 64

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
		ready:     make(chan struct{}),
	}, nil
}

// Ready is closed once the watcher follows runs: its caches are in and its loops run.
func (w *Watcher) Ready() <-chan struct{} { return w.ready }

// Run starts the watcher (the run stream, the ownership and lease buckets, the informer caches),
// follows runs until ctx is done, then stops: the steps end (a run's state is in the stream,
// not in memory) and the runs it owned are handed over at once. Runs in flight are
// picked up again, from the last published log chunk, by the next watcher to own them.
func (w *Watcher) Run(ctx context.Context) error {
	js := w.opts.JetStream
	stream, err := events.OpenStream(ctx, js, w.opts.Subjects.RunStream())
	if err != nil {
		return err
	}
	kv, err := events.EnsureBucket(ctx, js, OwnershipBucketConfig(w.opts.OwnershipTTL, w.opts.StreamReplicas, w.opts.StoreBytes))
	if err != nil {
		return fmt.Errorf("opening KV bucket %s: %w", OwnershipBucket, err)
	}
	leases, err := events.OpenBucket(ctx, js, lease.Bucket)
	if err != nil {
		return err
	}
	budgets, err := openLogBudgets(ctx, js, w.opts)
	if err != nil {
		return err
	}
	owners, err := newOwners(js.Conn(), kv, w.opts.ReplicaID, w.opts.OwnershipTTL, w.log)
	if err != nil {
		return err
	}
	d := &deps{
		opts: w.opts, log: w.log, pub: w.publisher, stream: stream, owners: owners,
		leases: lease.Records{KV: leases}, budgets: budgets,
		workloads: workload.Deps{Clientset: w.opts.Clientset, Dynamic: w.opts.Dynamic},
	}
	g, gctx := errgroup.WithContext(ctx)
	stopSteps := w.startSteps(gctx)
	defer stopSteps()
	d.cluster, err = newClusterCache(w.opts.Clientset, clusterHandlers{
		object: func(obj any) { w.wake(gctx, d, obj) },
		jobEvent: func(obj any) {
			if ref, ok := d.cluster.runOfJobEvent(obj); ok {
				w.pokeRun(ref)
			}
		},
	})
	if err != nil {
		return err
	}
	if err := d.cluster.start(gctx); err != nil {
		return err
	}
	g.Go(func() error { w.renewOwnership(gctx, d); return nil })
	g.Go(func() error { w.watchOwnership(gctx, kv); return nil })
	g.Go(func() error { w.reconcileLoop(gctx, d); return nil })
	g.Go(func() error {
		<-gctx.Done()
		d.cluster.stop()
		stopSteps()
		return nil
	})
	close(w.ready)
	w.log.Info().Str("replica", w.opts.ReplicaID).Msg("watching runs")
	err = g.Wait()
	// Hand the runs over now rather than after the ownership TTL.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
	defer cancel()
	d.owners.releaseAll(rctx)
	return err
}

// releaseTimeout bounds handing the owned runs over at shutdown; what is not released by then
// expires after the ownership TTL.
const releaseTimeout = 5 * time.Second

// renewOwnership renews the owned runs every third of the ownership TTL and hands the runs it
// lost back to their trackers, which drop their state.
func (w *Watcher) renewOwnership(ctx context.Context, d *deps) {
	tick := time.NewTicker(w.opts.OwnershipTTL / 3)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		lost := d.owners.renewAll(ctx)
		if len(lost) > 0 {
			// One line a pass: a replica too slow to renew loses its runs by the thousand.
			w.log.Warn().Int("runs", len(lost)).Str(events.LogKeyRunID, lost[0].RunID).Str(events.LogKeyTenant, lost[0].CompanyID).
				Msg("lost ownership of runs")
		}
		for _, ref := range lost {
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

// wake hands an informer event to the run's tracker, making one for a run seen first. The
// tracker is stepped until the run is done and its objects are gone; then it is forgotten.
func (w *Watcher) wake(ctx context.Context, d *deps, obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
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
		t = newTracker(d, m.GetNamespace(), ref, func() { w.steps.Add(ref) })
		w.trackers[ref] = t
	}
	t.poke()
}

// startSteps starts the step workers; stop (once ctx ended, or any time: it may be called
// again) ends them and then every tracker.
func (w *Watcher) startSteps(ctx context.Context) (stop func()) {
	w.steps = workqueue.NewTyped[events.RunRef]()
	ctx, cancel := context.WithCancel(ctx)
	var steppers sync.WaitGroup
	for range stepWorkers {
		steppers.Go(func() { w.stepRuns(ctx) })
	}
	return sync.OnceFunc(func() {
		cancel()
		w.steps.ShutDown()
		steppers.Wait()
		w.stopTrackers()
	})
}

// stepRuns steps the runs poked, one at a time, until the watcher stops.
func (w *Watcher) stepRuns(ctx context.Context) {
	for {
		ref, shutdown := w.steps.Get()
		if shutdown {
			return
		}
		w.mu.Lock()
		t := w.trackers[ref]
		w.mu.Unlock()
		if t != nil && ctx.Err() == nil && t.wakeUp(ctx) {
			w.forget(ref)
			t.stop()
		}
		w.steps.Done(ref)
	}
}

// stopTrackers stops every tracker once no step runs any more (the watcher stops).
func (w *Watcher) stopTrackers() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, t := range w.trackers {
		t.stop()
	}
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
