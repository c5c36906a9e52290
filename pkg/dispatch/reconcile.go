package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// OrphanPolicy says what happens to a workload (a Job, a bare Pod, a Sandbox) labelled as
// kubeclip's that has no lease at all: the lease bucket was lost, someone created it by hand,
// or another kubeclip installation (with its own NATS) shares the cluster. A workload whose
// lease was released or destroyed (a release that failed half-way) is certainly this
// installation's and is always deleted.
type OrphanPolicy string

// Orphan policies.
const (
	// OrphanDelete deletes the orphaned workload (and so its pod and Secret) and logs it.
	OrphanDelete OrphanPolicy = "delete"
	// OrphanReport only logs it, every reconcile pass, for an operator to decide. The default:
	// deleting another installation's runs would be far worse than leaving a stray one.
	OrphanReport OrphanPolicy = "report"
)

// Valid reports whether p is a known policy.
func (p OrphanPolicy) Valid() bool { return p == OrphanDelete || p == OrphanReport }

// DefaultReconcileInterval is how often the dispatcher looks for orphaned workloads; the first
// pass runs at start.
const DefaultReconcileInterval = 5 * time.Minute

// orphanGrace leaves alone workloads younger than this: a release may be deleting them now.
const orphanGrace = time.Minute

func (d *Dispatcher) reconcileLoop(ctx context.Context) {
	tick := time.NewTicker(d.opts.ReconcileInterval)
	defer tick.Stop()
	for {
		if err := d.reconcile(ctx); err != nil && ctx.Err() == nil {
			d.log.Warn().Err(err).Msg("reconcile: looking for orphaned workloads failed")
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// reconcile finds the workloads kubeclip manages, of every backend (Jobs, bare Pods,
// Sandboxes), that have no live lease and applies the orphan policy to them, a page of their
// metadata at a time (workload.Workload.List), so the pass's memory does not grow with the
// cluster. A backend whose list fails does not keep the others from their pass; a lease that
// cannot be read or a workload that cannot be deleted ends it.
func (d *Dispatcher) reconcile(ctx context.Context) error {
	start, seen := d.opts.Now(), 0
	var errs []error
	for _, w := range workload.All(d.workloads) {
		var stop error
		err := w.List(ctx, d.opts.ReconcilePageSize, func(obj *metav1.PartialObjectMetadata) error {
			seen++
			stop = d.reconcileWorkload(ctx, w, obj)
			return stop
		})
		if stop != nil {
			return stop
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	d.log.Info().Int("workloads", seen).Dur("took", d.opts.Now().Sub(start)).Msg("reconcile: pass done")
	return errors.Join(errs...)
}

// reconcileWorkload applies the orphan policy to one workload whose lease is gone, ended or
// failed, or names another workload; only the incarnation that was looked at is deleted.
func (d *Dispatcher) reconcileWorkload(ctx context.Context, w workload.Workload, obj metav1.Object) error {
	if obj.GetDeletionTimestamp() != nil || d.opts.Now().Sub(obj.GetCreationTimestamp().Time) < orphanGrace {
		return nil
	}
	runID := obj.GetLabels()[policy.LabelRunID]
	rec, _, err := d.records.Get(ctx, events.Ref(obj.GetLabels()[policy.LabelCompanyID], runID))
	var why string
	action := OrphanDelete
	switch {
	case errors.Is(err, lease.ErrNotFound):
		why, action = "it has no lease", d.opts.OrphanPolicy
	case err != nil:
		return err
	case rec.State.Ended(), rec.State == lease.StateFailed:
		why = "its lease was " + string(rec.State)
	case rec.WorkloadName != obj.GetName() || rec.Namespace != obj.GetNamespace():
		why = "its lease names workload " + rec.Namespace + "/" + rec.WorkloadName
	default:
		return nil
	}
	log := d.log.With().Str(events.LogKeyRunID, runID).Str(events.LogKeyNamespace, obj.GetNamespace()).Str("workload", obj.GetName()).Str("kind", w.Kind()).Logger()
	if action == OrphanReport {
		log.Warn().Str("why", why).Msg("reconcile: orphaned workload left running (orphan policy report)")
		return nil
	}
	// Only the workload looked at: not a new one that took its name meanwhile.
	if err := w.Discard(ctx, obj.GetNamespace(), obj.GetName(), obj.GetUID()); err != nil {
		return fmt.Errorf("deleting orphaned workload: %w", err)
	}
	log.Warn().Str("why", why).Msg("reconcile: deleted orphaned workload")
	return nil
}
