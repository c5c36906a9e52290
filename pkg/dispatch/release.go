package dispatch

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// handleRelease carries out a release or destroy: it deletes the workload, waits until its pod
// is gone, and only then publishes `released`.
func (d *Dispatcher) handleRelease(ctx context.Context, m jetstream.Msg) error {
	req, err := d.opts.Subjects.DecodeRelease(m.Subject(), m.Data())
	if err != nil {
		return err
	}
	log := d.log.With().Str(events.LogKeyRunID, req.RunID).Str(events.LogKeyTenant, req.CompanyID).Logger()
	state := lease.StateReleased
	evState := events.ReleaseStopped
	if req.Destroy {
		state, evState = lease.StateDestroyed, events.ReleaseDestroyed
	}

	rec, _, err := d.records.Get(ctx, req.RunID)
	if errors.Is(err, lease.ErrNotFound) {
		// Released before it was dispatched (its acquire may still be waiting for the agent):
		// record the end so the acquire is dropped when it comes, and confirm at once.
		rec, _, err = d.records.Create(ctx, lease.Record{
			RunID: req.RunID, CompanyID: req.CompanyID, State: state, CreatedAt: d.opts.Now().UTC(),
		})
	}
	if err != nil {
		return err
	}
	if rec.WorkloadName != "" && rec.WorkloadName != req.ProviderLeaseID {
		return events.InvalidRequest("providerLeaseId", "run %s's lease is %s, not %s", req.RunID, rec.WorkloadName, req.ProviderLeaseID)
	}

	if rec.WorkloadName != "" {
		rctx, cancel := context.WithTimeout(ctx, d.opts.ReleaseTimeout)
		defer cancel()
		if err := d.deleteWorkload(rctx, rec); err != nil {
			return err
		}
		if req.Destroy {
			if err := k8s.DeleteSecret(rctx, d.opts.Clientset, rec.Namespace, rec.SecretName); err != nil {
				return err
			}
		}
	}
	if _, err := d.records.Modify(ctx, req.RunID, func(r *lease.Record) bool {
		if r.State.Ended() && (!req.Destroy || r.State == lease.StateDestroyed) {
			return false
		}
		r.State = state
		return true
	}); err != nil {
		return err // retried: the deletes above are idempotent
	}
	d.agents.free(ctx, log, req.CompanyID, rec.AgentID, req.RunID)
	if _, err := d.publisher.Publish(ctx, events.RunReleasedEvent{
		RunID: req.RunID, CompanyID: req.CompanyID, ProviderLeaseID: req.ProviderLeaseID, State: evState,
	}); err != nil {
		return fmt.Errorf("publishing released: %w", err)
	}
	log.Info().Str("state", string(evState)).Msg("lease released")
	return nil
}

// deleteWorkload deletes the run's workload and returns once its pod is gone.
func (d *Dispatcher) deleteWorkload(ctx context.Context, rec lease.Record) error {
	opts := k8s.RunDeleteOptions{}
	if policy.Backend(rec.Backend) == policy.BackendJob {
		return d.classifyDelete(k8s.DeleteRun(ctx, d.opts.Clientset, rec.Namespace, rec.WorkloadName, opts))
	}
	pods := metav1.ListOptions{FieldSelector: "metadata.name=" + rec.WorkloadName}
	err := k8s.DeleteWorkloadRun(ctx, d.opts.Clientset, d.opts.Dynamic, policy.SandboxGVR(""), rec.Namespace, rec.WorkloadName, pods, opts)
	return d.classifyDelete(err)
}

func (d *Dispatcher) classifyDelete(err error) error {
	if err != nil && k8s.IsPermanent(err) && !apierrors.IsNotFound(err) {
		return events.Terminal(events.CodeInternal, "", err)
	}
	return err
}

// handleResult frees the agent of a run that ended, so the agent's next acquire starts, and
// deletes a Job that failed before it finished (an image that cannot be pulled, an
// unschedulable pod) so it stops holding the tenant's quota.
func (d *Dispatcher) handleResult(ctx context.Context, m jetstream.Msg) error {
	ev, err := d.opts.Subjects.DecodeRunEvent(m.Subject(), m.Data())
	if err != nil {
		return err
	}
	res, ok := ev.(events.RunResultEvent)
	if !ok {
		return nil
	}
	log := d.log.With().Str(events.LogKeyRunID, res.RunID).Str(events.LogKeyTenant, res.CompanyID).Logger()
	rec, _, err := d.records.Get(ctx, res.RunID)
	if errors.Is(err, lease.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if res.Outcome == events.OutcomeFailed && res.ExitCode == nil && policy.Backend(rec.Backend) == policy.BackendJob {
		// The agent never ran to an exit: its Job is still active and would hold its pod (and
		// quota) until the deadline.
		prop := metav1.DeletePropagationBackground
		err := d.opts.Clientset.BatchV1().Jobs(rec.Namespace).Delete(ctx, rec.WorkloadName, metav1.DeleteOptions{PropagationPolicy: &prop})
		if err != nil && !apierrors.IsNotFound(err) {
			return d.classifyDelete(err)
		}
	}
	d.agents.free(ctx, log, res.CompanyID, rec.AgentID, res.RunID)
	// Reconciliation and redelivered dispatches skip finished leases; a lost update only costs
	// them a look at the run stream.
	if _, err := d.records.Modify(ctx, res.RunID, func(r *lease.Record) bool {
		if r.State != lease.StateCreated && r.State != lease.StateDispatching {
			return false
		}
		r.State = lease.StateFinished
		return true
	}); err != nil {
		log.Debug().Err(err).Msg("marking the lease finished failed")
	}
	return nil
}
