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

// reconcile finds the workloads kubeclip manages (Jobs, and the bare Pods of backend pod) that
// have no live lease and applies the orphan policy to them.
func (d *Dispatcher) reconcile(ctx context.Context) error {
	jobs, err := d.opts.Clientset.BatchV1().Jobs(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: policy.ManagedBySelector})
	if err != nil {
		return fmt.Errorf("listing Jobs: %w", err)
	}
	prop := metav1.DeletePropagationBackground
	for i := range jobs.Items {
		job := &jobs.Items[i]
		err := d.reconcileWorkload(ctx, job, "Job", func(opts metav1.DeleteOptions) error {
			opts.PropagationPolicy = &prop
			return d.opts.Clientset.BatchV1().Jobs(job.Namespace).Delete(ctx, job.Name, opts)
		})
		if err != nil {
			return err
		}
	}
	pods, err := d.opts.Clientset.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: policy.ManagedBySelector})
	if err != nil {
		return fmt.Errorf("listing Pods: %w", err)
	}
	for i := range pods.Items {
		pod := &pods.Items[i]
		if metav1.GetControllerOf(pod) != nil {
			continue // a Job's or a Sandbox's: they are reconciled through their owner
		}
		err := d.reconcileWorkload(ctx, pod, "Pod", func(opts metav1.DeleteOptions) error {
			return d.opts.Clientset.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, opts)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// reconcileWorkload applies the orphan policy to one workload whose lease is gone, ended or
// failed, or names another workload; del deletes it (only the incarnation that was looked at).
func (d *Dispatcher) reconcileWorkload(ctx context.Context, obj metav1.Object, kind string, del func(metav1.DeleteOptions) error) error {
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
	log := d.log.With().Str(events.LogKeyRunID, runID).Str(events.LogKeyNamespace, obj.GetNamespace()).Str("workload", obj.GetName()).Str("kind", kind).Logger()
	if action == OrphanReport {
		log.Warn().Str("why", why).Msg("reconcile: orphaned workload left running (orphan policy report)")
		return nil
	}
	uid := obj.GetUID()
	// Only the workload looked at: not a new one that took its name meanwhile.
	err = del(metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting orphaned %s %s/%s: %w", kind, obj.GetNamespace(), obj.GetName(), err)
	}
	log.Warn().Str("why", why).Msg("reconcile: deleted orphaned workload")
	return nil
}
