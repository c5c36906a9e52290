package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// handleLease routes a lease request of the dispatcher's consumer by its kind.
func (d *Dispatcher) handleLease(ctx context.Context, m jetstream.Msg) error {
	if _, kind, err := d.opts.Subjects.ParseLeaseSubject(m.Subject()); err == nil && kind == events.LeaseResume {
		return d.handleResume(ctx, m)
	}
	return d.handleRelease(ctx, m)
}

// handleRelease carries out a release or destroy: it deletes the workload, waits until its pod
// is gone, and only then publishes `released`.
//
// The run is the one of the subject's company: a release for another company's run, or for a
// run with no lease, finds no record and is answered without changing anything (answerUnknown).
// A lease caught while its dispatch is creating the workload is left releasing: the dispatch,
// which sees that when it tries to mark the lease created, deletes what it made and publishes
// `released` itself, so the pod is gone before `released` whoever finishes first.
func (d *Dispatcher) handleRelease(ctx context.Context, m jetstream.Msg) error {
	req, err := d.opts.Subjects.DecodeRelease(m.Subject(), m.Data())
	if err != nil {
		return err
	}
	ref := events.Ref(req.CompanyID, req.RunID)
	log := d.log.With().Str(events.LogKeyRunID, req.RunID).Str(events.LogKeyTenant, req.CompanyID).Logger()
	rec, _, err := d.records.Get(ctx, ref)
	if errors.Is(err, lease.ErrNotFound) {
		return d.answerUnknown(ctx, log, req)
	}
	if err != nil {
		return err
	}
	if req.ProviderLeaseID != "" && rec.WorkloadName != "" && rec.WorkloadName != req.ProviderLeaseID {
		return events.InvalidRequest("providerLeaseId", "run %s's lease is %s, not %s", req.RunID, rec.WorkloadName, req.ProviderLeaseID)
	}
	if rec.Reusable && !req.Destroy {
		return d.releaseReusable(ctx, log, req)
	}
	var before lease.State
	rec, err = d.records.Modify(ctx, ref, func(r *lease.Record) (bool, error) {
		before = r.State
		return lease.BeginRelease(req.Kind(), req.CancelActiveWork)(r)
	})
	if err != nil {
		return err
	}
	if before == lease.StateDispatching {
		log.Info().Msg("release caught the run while its workload is created; the dispatch completes it")
		return nil
	}
	if rec.State == lease.StateDestroyed || (rec.State == lease.StateReleased && !req.Destroy) {
		return d.publishReleased(ctx, log, rec) // a repeated request: confirm again
	}
	return d.completeRelease(ctx, log, rec)
}

// completeRelease ends a releasing lease: the workload (and on destroy its Secret) is deleted,
// its pod waited for, the lease marked released, the agent freed and `released` published.
// Every step is idempotent, so a retry, or the dispatch and the release handler both calling
// it, ends the same way.
func (d *Dispatcher) completeRelease(ctx context.Context, log zerolog.Logger, rec lease.Record) error {
	if rec.WorkloadName != "" {
		rctx, cancel := context.WithTimeout(ctx, d.opts.ReleaseTimeout)
		defer cancel()
		if err := d.deleteRun(rctx, rec, rec.Ending == events.LeaseDestroy); err != nil {
			return err
		}
	}
	rec, err := d.records.Modify(ctx, rec.Ref(), lease.Released)
	if err != nil {
		return err // retried: the deletes above are idempotent
	}
	d.freeAgent(ctx, log, rec.CompanyID, rec.AgentID, rec.RunID)
	return d.publishReleased(ctx, log, rec)
}

func (d *Dispatcher) publishReleased(ctx context.Context, log zerolog.Logger, rec lease.Record) error {
	return d.answerRelease(ctx, log, rec, "")
}

// answerRelease publishes `released` as the answer to the release that named itself releaseID
// (a reusable lease's; "" for any other).
func (d *Dispatcher) answerRelease(ctx context.Context, log zerolog.Logger, rec lease.Record, releaseID string) error {
	state := events.ReleaseStopped
	if rec.State == lease.StateDestroyed || rec.State == lease.StateCollected {
		state = events.ReleaseDestroyed
	}
	if _, err := d.publisher.Publish(ctx, events.RunReleasedEvent{
		RunID: rec.RunID, CompanyID: rec.CompanyID, ProviderLeaseID: rec.WorkloadName, State: state, ReleaseID: releaseID,
	}); err != nil {
		return fmt.Errorf("publishing released: %w", err)
	}
	log.Info().Str("state", string(state)).Msg("lease released")
	return nil
}

// answerUnknown answers a release or destroy of a run the subject's company has no lease for
// (never acquired, another company's, its record expired): `released` destroyed, unknown, naming
// the lease the request named, and nothing else is done: no record is written or read beyond
// the company's own key, so another company's lease of the same run or lease id is not touched.
// Paperclip's host releases every lease its own restart stranded and keeps a lease it got no
// receipt for pending cleanup: destroyed again on each sweep, five times, then left for an
// operator (heartbeat.js sweepPendingCleanupLeases). A receipt that nothing is there ends that.
// Repeating it is harmless (the same message id: JetStream keeps the first, which answers the
// repeat too). A request that names no lease is refused as before, lease_not_found naming runId:
// a receipt names the lease it is for, and such a request names none.
func (d *Dispatcher) answerUnknown(ctx context.Context, log zerolog.Logger, req events.ReleaseRequest) error {
	if req.ProviderLeaseID == "" {
		return events.Terminalf(events.CodeLeaseNotFound, "runId", "company %s has no lease for run %s", req.CompanyID, req.RunID)
	}
	if _, err := d.publisher.Publish(ctx, events.RunReleasedEvent{
		RunID: req.RunID, CompanyID: req.CompanyID, ProviderLeaseID: req.ProviderLeaseID,
		State: events.ReleaseDestroyed, ReleaseID: req.ReleaseID, Unknown: true,
	}); err != nil {
		return fmt.Errorf("publishing released: %w", err)
	}
	log.Info().Str("request", string(req.Kind())).Msg("release of a lease the company does not have: answered that nothing is there")
	return nil
}

// deleteRun deletes the run's workload and returns once its pod is gone; withSecret deletes its
// Secret too (a destroy, or a dispatch that failed and must leave nothing behind).
//
// An exec-capable pod gets the release's time to let its running commands finish (sandboxd
// refuses new ones on SIGTERM and waits for the rest), or a second when the release cancels
// active work; a Job's agent gets DefaultPodGracePeriod to flush its last lines.
func (d *Dispatcher) deleteRun(ctx context.Context, rec lease.Record, withSecret bool) error {
	w, err := d.workload(rec)
	if err != nil {
		return err
	}
	if err := w.Delete(ctx, rec.Namespace, rec.WorkloadName, d.podDeleteOptions(w, rec)); err != nil {
		return k8s.Meaning(k8s.OpDelete, err)
	}
	if !withSecret {
		return nil
	}
	if err := k8s.DeleteSecret(ctx, d.opts.Clientset, rec.Namespace, rec.SecretName); err != nil {
		return k8s.Meaning(k8s.OpDelete, err)
	}
	if rec.VolumeClaim != "" {
		// A reusable lease's volume: only a destroy or a collection (withSecret) ends it.
		return k8s.Meaning(k8s.OpDelete, workload.DeleteClaim(ctx, d.opts.Clientset, rec.Namespace, rec.VolumeClaim))
	}
	return nil
}

// podDeleteOptions is how the lease's pod is deleted: see deleteRun.
func (d *Dispatcher) podDeleteOptions(w workload.Workload, rec lease.Record) k8s.RunDeleteOptions {
	opts := k8s.RunDeleteOptions{}
	if w.Backend().ExecCapable() {
		opts.PodGracePeriod = d.opts.ReleaseTimeout - releaseMargin
		if rec.CancelActiveWork {
			opts.PodGracePeriod = time.Second
		}
	}
	return opts
}

// releaseMargin is what a release keeps of its timeout for itself after the pod's grace period:
// deleting, waiting for the kubelet to report the pod gone, recording the lease released.
const releaseMargin = 10 * time.Second

// handleResult frees the agent of a run that ended, so the agent's next acquire starts, and
// deletes a workload that failed before it finished (an image that cannot be pulled, an
// unschedulable pod) so it stops holding the tenant's quota.
func (d *Dispatcher) handleResult(ctx context.Context, m jetstream.Msg) error {
	res, ours, err := events.DecodeStored[events.RunResultEvent](d.opts.Subjects, m.Subject(), m.Headers(), m.Data())
	if err != nil || !ours {
		return err // nil: not kubeclip's result (events.DecodeStored)
	}
	ref := events.Ref(res.CompanyID, res.RunID)
	log := d.log.With().Str(events.LogKeyRunID, res.RunID).Str(events.LogKeyTenant, res.CompanyID).Logger()
	rec, _, err := d.records.Get(ctx, ref)
	if errors.Is(err, lease.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	// A reusable lease's released result is its first pod's end at a suspend or destroy, which
	// moved the record and freed the agent themselves; read late, after a resume made the lease
	// live again, it must neither finish the lease nor free the agent the resume holds.
	if rec.Reusable && res.Outcome == events.OutcomeReleased {
		return nil
	}
	// A reusable lease's pod is the lease's release, sweep and resume's: a result its pod's end
	// published (a suspend deletes it) must not delete the pod a resume made since.
	if res.Outcome == events.OutcomeFailed && res.ExitCode == nil && rec.WorkloadName != "" && !rec.Reusable {
		// The agent never ran to an exit (an image that cannot be pulled, a quota refusal): its
		// workload is still there and would hold the tenant's quota until the deadline.
		w, err := d.workload(rec)
		if err != nil {
			return err
		}
		if err := w.Discard(ctx, rec.Namespace, rec.WorkloadName, ""); err != nil {
			return k8s.Meaning(k8s.OpDelete, err)
		}
	}
	d.freeAgent(ctx, log, res.CompanyID, rec.AgentID, res.RunID)
	// Reconciliation and redelivered dispatches skip finished leases; a lost update only costs
	// them a look at the run stream.
	if _, err := d.records.Modify(ctx, ref, lease.Finish); err != nil {
		log.Debug().Err(err).Msg("marking the lease finished failed")
	}
	return nil
}

// reportFailure publishes the run's failed event for a release or destroy that will not be
// retried; nothing changed.
func (d *Dispatcher) reportFailure(ctx context.Context, m jetstream.Msg, te *events.TerminalError) error {
	return events.PublishFailure(ctx, d.publisher, d.log, m, te)
}
