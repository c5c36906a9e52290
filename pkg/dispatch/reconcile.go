package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// OrphanPolicy says what happens to a Job labelled as kubeclip's that has no lease at all: the
// lease bucket was lost, someone created it by hand, or another kubeclip installation (with its
// own NATS) shares the cluster. A Job whose lease was released or destroyed (a release that
// failed half-way) is certainly this installation's and is always deleted.
type OrphanPolicy string

// Orphan policies.
const (
	// OrphanDelete deletes the orphan's Job (and so its pod and Secret) and logs it.
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

// reconcile finds the Jobs kubeclip manages that have no live lease and applies the orphan
// policy to them. It returns how many it found.
func (d *Dispatcher) reconcile(ctx context.Context) error {
	jobs, err := d.opts.Clientset.BatchV1().Jobs(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: policy.ManagedBySelector})
	if err != nil {
		return fmt.Errorf("listing Jobs: %w", err)
	}
	for i := range jobs.Items {
		job := &jobs.Items[i]
		runID := job.Labels[policy.LabelRunID]
		ref := events.Ref(job.Labels[policy.LabelCompanyID], runID)
		if job.DeletionTimestamp != nil || d.opts.Now().Sub(job.CreationTimestamp.Time) < orphanGrace {
			continue
		}
		rec, _, err := d.records.Get(ctx, ref)
		var why string
		action := OrphanDelete
		switch {
		case errors.Is(err, lease.ErrNotFound):
			why, action = "it has no lease", d.opts.OrphanPolicy
		case err != nil:
			return err
		case rec.State.Ended(), rec.State == lease.StateFailed:
			why = "its lease was " + string(rec.State)
		case rec.WorkloadName != job.Name || rec.Namespace != job.Namespace:
			why = "its lease names workload " + rec.Namespace + "/" + rec.WorkloadName
		default:
			continue
		}
		log := d.log.With().Str(events.LogKeyRunID, runID).Str(events.LogKeyNamespace, job.Namespace).Str("workload", job.Name).Logger()
		if action == OrphanReport {
			log.Warn().Str("why", why).Msg("reconcile: orphaned workload left running (orphan policy report)")
			continue
		}
		prop := metav1.DeletePropagationBackground
		err = d.opts.Clientset.BatchV1().Jobs(job.Namespace).Delete(ctx, job.Name, metav1.DeleteOptions{
			PropagationPolicy: &prop,
			// Only the Job we looked at: not a new one that took its name meanwhile.
			Preconditions: &metav1.Preconditions{UID: &job.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting orphaned Job %s/%s: %w", job.Namespace, job.Name, err)
		}
		log.Warn().Str("why", why).Msg("reconcile: deleted orphaned workload")
	}
	return nil
}
