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
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// A reusable lease's resume (reuse.go: its life): the host's resume request makes a retained or
// suspended lease live again for its agent's next run.

// handleResume resumes a reusable lease of the subject's company for its agent's next run.
//
// The refusals are the release's: another company's run, or a run with no lease, finds no
// record (lease_not_found); a lease name that is not the run's is invalid. A lease that is gone
// (destroyed, collected, failed, its pod ended on its own) is lease_not_found too: the plugin
// answers the host so that it acquires afresh (docs/reuse.md, the host's rules §3). The lease moves
// first (lease.Resume), then its pod is made ready: a redelivered resume finds the lease
// resuming (or created) and the pod it made, and makes no second one.
func (d *Dispatcher) handleResume(ctx context.Context, m jetstream.Msg) error {
	start := time.Now()
	req, err := d.opts.Subjects.DecodeResume(m.Subject(), m.Data())
	if err != nil {
		return err
	}
	ref := events.Ref(req.CompanyID, req.RunID)
	log := d.log.With().Str(events.LogKeyRunID, req.RunID).Str(events.LogKeyTenant, req.CompanyID).Logger()
	rec, _, err := d.records.Get(ctx, ref)
	if errors.Is(err, lease.ErrNotFound) {
		return events.Terminalf(events.CodeLeaseNotFound, "runId", "company %s has no lease for run %s", req.CompanyID, req.RunID)
	}
	if err != nil {
		return err
	}
	if rec.WorkloadName != req.ProviderLeaseID {
		return events.InvalidRequest("providerLeaseId", "is not the lease of run %s", req.RunID)
	}
	if err := d.resumeAgent(ctx, rec); err != nil {
		return err
	}
	rec, err = d.records.Modify(ctx, ref, lease.Resume(d.opts.Now()))
	switch {
	case errors.Is(err, lease.ErrNotReusable):
		return events.InvalidRequest("providerLeaseId", "lease %s is not reusable (its acquire did not ask for reuseLease)", rec.WorkloadName)
	case errors.Is(err, lease.ErrEnded), errors.Is(err, lease.ErrFailed), errors.Is(err, lease.ErrFinished):
		d.freeAgent(ctx, log, rec.CompanyID, rec.AgentID, rec.RunID) // ended since resumeAgent took it
		return events.Terminalf(events.CodeLeaseNotFound, "providerLeaseId", "lease %s is gone (%s); acquire a new one", rec.WorkloadName, rec.State)
	case err != nil:
		return err
	}
	w, err := d.workload(rec)
	if err != nil {
		return err
	}
	rctx, cancel := resumeContext(ctx, d.records, ref, d.opts.ReleaseTimeout)
	resumed, err := w.Resume(rctx, rec.Namespace, rec.WorkloadName, rec.VolumeClaim)
	cancel()
	if err != nil {
		if now, _, gerr := d.records.Get(ctx, ref); gerr == nil && now.State.Ended() {
			return d.abandonResume(ctx, log, w, now)
		}
		return k8s.Meaning(k8s.OpCreate, err)
	}
	generation := rec.Generation
	rec, err = d.records.Modify(ctx, ref, lease.Resumed(generation))
	switch {
	case errors.Is(err, lease.ErrEnded):
		return d.abandonResume(ctx, log, w, rec)
	case errors.Is(err, lease.ErrSuspended):
		// Suspended again while the pod came up: a redelivery resumes it once more.
		return fmt.Errorf("resuming lease %s: it was suspended meanwhile", rec.WorkloadName)
	case err != nil:
		return err
	}
	// Where this resume found the lease is the record's: a redelivery of a resume that made a
	// new pod, or the host's retry of it, finds the lease resuming or created already. A lease
	// never resumed (the host resumes within a run too) has the acquire's pod.
	from := rec.ResumedFrom
	if from == "" {
		from = events.ResumedFromRetained
	}
	if _, err := d.publisher.Publish(ctx, events.RunResumedEvent{
		RunID: rec.RunID, CompanyID: rec.CompanyID, ProviderLeaseID: rec.WorkloadName,
		From: from, Generation: rec.Generation, Resumes: max(rec.Resumes, 1), ResumeID: req.ResumeID,
		ExpiresAt: rec.ExpiresAt, PodIP: resumed.PodIP,
	}); err != nil {
		return fmt.Errorf("publishing resumed: %w", err)
	}
	log.Info().Str("from", string(from)).Int("generation", rec.Generation).Bool("new_pod", resumed.Made).
		Dur("took", time.Since(start)).Msg("reusable lease resumed")
	return nil
}

// resumeAgent takes the agent's guard for a reusable lease the host resumes: the lease runs its
// agent again, so it holds the agent as its dispatch did (a release, or a suspend of a lease
// whose expiry is over, frees it), for its run deadline plus agentGuardMargin. While another
// run holds the agent the resume is refused with agent_busy and the lease left as it was: the
// plugin makes the host retry the resume rather than destroy a lease that is only waiting
// (docs/reuse.md, A resumed lease's expiry). A lease that cannot be resumed (ended, not reusable) takes
// nothing: its resume is refused next.
func (d *Dispatcher) resumeAgent(ctx context.Context, rec lease.Record) error {
	resumable := rec.State.Kept() || rec.State == lease.StateResuming || rec.State == lease.StateCreated
	if rec.AgentID == "" || !rec.Reusable || !resumable {
		return nil
	}
	deadline := time.Duration(rec.RunDeadlineSec) * time.Second
	if deadline <= 0 {
		deadline = policy.DefaultPodActivityDeadlineSec * time.Second
	}
	holder, err := d.agents.take(ctx, rec.CompanyID, rec.AgentID, rec.RunID, deadline+agentGuardMargin)
	if err != nil {
		return err
	}
	if holder != rec.RunID {
		return events.Terminalf(events.CodeAgentBusy, "agentId",
			"agent %s is running run %s; one run per agent at a time: lease %s is kept, resume it once that run ends", rec.AgentID, holder, rec.WorkloadName)
	}
	return nil
}

// resumeEndPoll is how often a resume waiting for its pod reads its lease's record for a destroy:
// a destroyed lease's resume is answered within about this long after the destroy began, and a
// resume reads its record only a few times (a pod is ready in seconds): cheaper than a KV watch's
// consumer per resume.
const resumeEndPoll = 500 * time.Millisecond

// resumeContext bounds a resume of the lease ref by timeout (the release timeout) and ends it
// early once the lease's record says it ended: a destroy (or a collection) began while the resume made its
// pod ready. Without it the resume waited the whole release timeout for a pod the destroy had
// deleted, or for one it made itself after the destroy deleted the old one, on a claim and
// Secret being deleted, which never starts (tests/failover TestResumeRacesDestroyAndSweep), and
// that pod stayed behind. The returned cancel must be called; it waits for the poll to stop.
func resumeContext(ctx context.Context, records lease.Records, ref events.RunRef, timeout time.Duration) (context.Context, context.CancelFunc) {
	rctx, cancelTimeout := context.WithTimeout(ctx, timeout)
	rctx, cancel := context.WithCancelCause(rctx)
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(resumeEndPoll)
		defer tick.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-tick.C:
			}
			if rec, _, err := records.Get(rctx, ref); err == nil && rec.State.Ended() {
				cancel(fmt.Errorf("lease %s ended (%s) during its resume", rec.WorkloadName, rec.State))
				return
			}
		}
	}()
	return rctx, func() {
		cancel(context.Canceled)
		<-stopped
		cancelTimeout()
	}
}

// abandonResume ends a resume whose lease (rec) ended meanwhile (a destroy or a collection
// began while its pod came up): the pod it may have made is deleted, since the destroy may have
// deleted the old one before the resume made it, and the resume answers lease_not_found, so the
// plugin tells the host to acquire afresh.
func (d *Dispatcher) abandonResume(ctx context.Context, log zerolog.Logger, w workload.Workload, rec lease.Record) error {
	dctx, cancel := context.WithTimeout(ctx, d.opts.ReleaseTimeout)
	defer cancel()
	if err := w.Suspend(dctx, rec.Namespace, rec.WorkloadName, k8s.RunDeleteOptions{PodGracePeriod: time.Second}); err != nil {
		log.Warn().Err(err).Msg("deleting the pod of a lease destroyed during its resume failed; reconciliation will")
	}
	return events.Terminalf(events.CodeLeaseNotFound, "providerLeaseId", "lease %s was destroyed during its resume; acquire a new one", rec.WorkloadName)
}
