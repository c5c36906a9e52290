package runwatch

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/runwatch/verdict"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// DefaultReconcileInterval is how often the watcher looks for runs whose workload disappeared
// while no watcher followed them (all replicas down while a Job was deleted, say).
const DefaultReconcileInterval = 5 * time.Minute

// reconcileGrace skips leases younger than this: their workload may still be on its way into
// the informer cache.
const reconcileGrace = time.Minute

// reconcileLoop runs reconcile at start and then every interval.
func (w *Watcher) reconcileLoop(ctx context.Context, d *deps) {
	tick := time.NewTicker(w.opts.ReconcileInterval)
	defer tick.Stop()
	for {
		w.reconcile(ctx, d)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// reconcile gives a result to every created lease whose run has neither Job nor pod any more,
// nor its workload (a Sandbox waiting for its pod), and no result yet, so Paperclip never waits
// forever on a run nobody can follow.
func (w *Watcher) reconcile(ctx context.Context, d *deps) {
	lister, err := d.leases.KV.ListKeys(ctx)
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
		rec, _, err := d.leases.Get(ctx, ref)
		if err != nil || !awaitsResult(rec) || w.opts.Now().Sub(rec.CreatedAt) < reconcileGrace {
			continue
		}
		if !d.cluster.gone(ref, rec.Namespace) || w.following(ref) {
			continue // followed by its tracker, here or on another replica
		}
		if present, err := workloadExists(ctx, d, rec); err != nil || present {
			if err != nil {
				w.log.Warn().Err(err).Str(events.LogKeyRunID, ref.RunID).Str(events.LogKeyTenant, ref.CompanyID).Msg("reconcile: looking for the run's workload failed")
			}
			continue // its tracker starts when its pods appear
		}
		if reportLost(ctx, d, rec) {
			lost++
		}
	}
	if lost > 0 {
		w.log.Warn().Int("runs", lost).Msg("reconcile: published results for runs whose workload was lost")
	}
}

// workloadExists asks the lease's workload whether it is still in the cluster although the
// informers hold none of the run's Jobs and pods: a Sandbox's pod comes from its controller.
// A lease naming a backend no workload implements has nothing anyone could follow: lost.
func workloadExists(ctx context.Context, d *deps, rec lease.Record) (bool, error) {
	wl, err := workload.For(policy.Backend(rec.Backend), d.workloads)
	if err != nil {
		return false, nil //nolint:nilerr // no workload kubeclip knows: the run is lost
	}
	return wl.Exists(ctx, rec.Namespace, rec.WorkloadName)
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

// reportLost publishes the end of a run whose workload is gone: a failed status and its
// result, with whatever its published log says about the agent. It claims the run first, so
// it never races a replica that follows it. It reports whether it published a result.
func reportLost(ctx context.Context, d *deps, rec lease.Record) bool {
	ref := rec.Ref()
	log := d.log.With().Str(events.LogKeyRunID, ref.RunID).Str(events.LogKeyTenant, ref.CompanyID).Logger()
	if finished, err := resultPublished(ctx, d.stream, d.opts.Subjects, ref); err != nil || finished {
		return false // finished, or NATS trouble: next pass
	}
	if owned, err := d.owners.claim(ctx, ref); err != nil || !owned {
		return false // owned by another replica, or NATS trouble: next pass
	}
	defer d.owners.release(context.WithoutCancel(ctx), ref)
	status := newStatusLine()
	if err := status.load(ctx, d.stream, d.opts.Subjects, ref); err != nil {
		log.Warn().Err(err).Msg("reconcile: reading the run's history failed")
		return false
	}
	j, err := loadJournal(ctx, ref, d.journalOptions(log))
	if err != nil {
		log.Warn().Err(err).Msg("reconcile: reading the run's history failed")
		return false
	}
	defer j.stop()
	end := verdict.Lost(rec.State.Ended())
	if policy.Backend(rec.Backend).ExecCapable() && rec.Ending != "" {
		// An exec-capable lease's release is its end, followed or not (verdict.Released).
		r, err := releaseOfRecord(ctx, d, rec)
		if err != nil {
			log.Warn().Err(err).Msg("reconcile: reading the run's history failed")
			return false
		}
		end = verdict.Released(r)
	}
	if err := status.publish(ctx, d.pub, ref, end.Phase(), end.Reason, end.Message, "", ""); err != nil {
		log.Warn().Err(err).Msg("reconcile: publishing status failed")
		return false
	}
	if err := endRun(ctx, d, log, ref, end, resultAgent(end, policy.Backend(rec.Backend), j)); err != nil {
		log.Warn().Err(err).Msg("reconcile: publishing result failed")
		return false
	}
	return true
}
