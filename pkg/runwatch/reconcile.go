package runwatch

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/runwatch/verdict"
)

// DefaultReconcileInterval is how often the watcher looks for runs whose workload disappeared
// while no watcher followed them (all replicas down while a Job was deleted, say).
const DefaultReconcileInterval = 5 * time.Minute

// reconcileGrace skips leases younger than this: their workload may still be on its way into
// the informer cache.
const reconcileGrace = time.Minute

// reconcileLoop runs reconcile at start and then every interval.
func (w *Watcher) reconcileLoop(ctx context.Context, stream jetstream.Stream) {
	tick := time.NewTicker(w.opts.ReconcileInterval)
	defer tick.Stop()
	for {
		w.reconcile(ctx, stream)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// reconcile gives a result to every created lease whose run has neither Job nor pod any more
// and no result yet, so Paperclip never waits forever on a run nobody can follow.
func (w *Watcher) reconcile(ctx context.Context, stream jetstream.Stream) {
	lister, err := w.leases.KV.ListKeys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return
	}
	if err != nil {
		w.log.Warn().Err(err).Msg("reconcile: listing leases failed")
		return
	}
	defer func() { _ = lister.Stop() }()
	lost := 0
	for key := range lister.Keys() {
		ref, ok := events.ParseRunKey(key)
		if !ok {
			continue
		}
		rec, _, err := w.leases.Get(ctx, ref)
		if err != nil || !awaitsResult(rec) || w.opts.Now().Sub(rec.CreatedAt) < reconcileGrace {
			continue
		}
		if job, pod := w.objects(ref, rec.Namespace); job != nil || pod != nil || w.following(ref) {
			continue // followed by its tracker, here or on another replica
		}
		if w.reportLost(ctx, stream, rec) {
			lost++
		}
	}
	if lost > 0 {
		w.log.Warn().Int("runs", lost).Msg("reconcile: published results for runs whose workload was lost")
	}
}

// awaitsResult reports whether the lease's run was created and may still lack its result:
// created, or ended by a release that deleted its workload.
func awaitsResult(rec lease.Record) bool {
	switch rec.State {
	case lease.StateCreated, lease.StateReleasing, lease.StateReleased, lease.StateDestroyed:
		return rec.WorkloadName != ""
	}
	return false
}

// reportLost publishes the result of a run whose workload is gone, with whatever its published
// log says about the agent. It reports whether it published one.
func (w *Watcher) reportLost(ctx context.Context, stream jetstream.Stream, rec lease.Record) bool {
	t := newTracker(w, stream, rec.Namespace, rec.Ref())
	defer func() {
		if t.logs != nil {
			t.logs.stop()
		}
		w.owners.release(context.WithoutCancel(ctx), rec.Ref())
	}()
	owned, err := t.own(ctx)
	if err != nil || !owned {
		return false // finished, owned by another replica, or NATS trouble: next pass
	}
	if err := t.load(ctx); err != nil {
		t.log.Warn().Err(err).Msg("reconcile: reading the run's history failed")
		return false
	}
	end := verdict.Lost(rec.State.Ended())
	t.end = &end
	if err := t.publishStatus(ctx, events.PhaseFailed, end.Reason, end.Message, nil); err != nil {
		t.log.Warn().Err(err).Msg("reconcile: publishing status failed")
		return false
	}
	if err := t.publishResult(ctx); err != nil {
		t.log.Warn().Err(err).Msg("reconcile: publishing result failed")
		return false
	}
	return true
}
