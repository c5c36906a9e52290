package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// A reusable lease (an acquire with reuseLease, backend pod) serves its agent's runs one after
// another (docs/reuse.md: the host's rules, a reusable lease's life in kubeclip). Its life, every step a pkg/lease
// transition:
//
//   - the host's release keeps it: retained, its pod up for the operator's idle window
//     (Options.LeaseIdleWindow), so the agent's next run resumes it at once; a release that
//     cancels active work suspends it at once instead (its commands die with the pod);
//   - once the window is over, the sweep suspends it: the pod deleted, its volume claim and
//     Secret kept, `suspended` published;
//   - a resume (<prefix>.lease.<c>.resume) takes the agent's guard, makes a retained lease live
//     again at once, and a suspended one once a new pod on the same claim is ready, renews the
//     lease's expiry by its run deadline, then publishes `resumed` with it;
//   - a lease in use past its expiry is suspended by the sweep: its pod has no deadline of its
//     own (it serves many runs), so the sweep is what ends a run's time;
//   - a destroy, from any state, deletes pod, Secret and claim;
//   - a lease suspended for longer than the operator's maximum age (Options.LeaseMaxAge) is
//     collected by the sweep: destroyed, `released` (destroyed) published. The host never
//     destroys some leases (docs/reuse.md, the host's rules §6): this is what frees them.

// Defaults of the reusable lease options.
const (
	// DefaultLeaseIdleWindow is how long a released reusable lease keeps its pod: a heartbeat's
	// next run within it starts at once.
	DefaultLeaseIdleWindow = 5 * time.Minute
	// DefaultLeaseMaxAge is how long a suspended lease keeps its volume without a resume.
	DefaultLeaseMaxAge = 7 * 24 * time.Hour
	// DefaultLeaseSweepInterval is how often reusable leases are looked at for their window and
	// their age (also at start).
	DefaultLeaseSweepInterval = 30 * time.Second
)

// checkRecordTTL refuses a maximum age the lease records do not live for: a suspended lease's
// record is last written when it is suspended, and a record that expired before its lease was
// collected would leave the volume behind with nothing to collect it.
func (d *Dispatcher) checkRecordTTL(ctx context.Context, leases jetstream.KeyValue) error {
	var st jetstream.KeyValueStatus
	err := events.AtStartup(ctx, func(ctx context.Context) (err error) {
		st, err = leases.Status(ctx)
		return err
	})
	if err != nil {
		return fmt.Errorf("reading KV bucket %s: %w", lease.Bucket, err)
	}
	if ttl := st.TTL(); ttl > 0 && d.opts.LeaseMaxAge >= ttl {
		return fmt.Errorf("dispatch: the reusable lease maximum age %s must be below the lease records' TTL %s, or a suspended lease's record expires before it is collected", d.opts.LeaseMaxAge, ttl)
	}
	return nil
}

// handleLease routes a lease request of the dispatcher's consumer by its kind.
func (d *Dispatcher) handleLease(ctx context.Context, m jetstream.Msg) error {
	if _, kind, err := d.opts.Subjects.ParseLeaseSubject(m.Subject()); err == nil && kind == events.LeaseResume {
		return d.handleResume(ctx, m)
	}
	return d.handleRelease(ctx, m)
}

// checkReusable refuses a reusable acquire on a backend that keeps no reusable lease, before
// anything is created.
func (d *Dispatcher) checkReusable(rec lease.Record, plan lease.Plan) error {
	if !rec.Reusable {
		return nil
	}
	w, err := workload.For(plan.Config.Backend, d.workloads)
	if err != nil {
		return err
	}
	return w.Reuse()
}

// renderClaim renders a reusable lease's volume claim within the operator's bounds, under the
// name its record holds (Workload.ClaimName); the workload's Create makes it.
func (d *Dispatcher) renderClaim(rec lease.Record) (*corev1.PersistentVolumeClaim, error) {
	pvc, err := d.opts.Operator.RenderLeaseClaim(policy.LeaseClaim{
		Namespace: rec.Namespace, Name: rec.VolumeClaim,
		RunID: rec.RunID, CompanyID: rec.CompanyID, AgentID: rec.AgentID,
	})
	if err != nil {
		return nil, events.Terminal(events.CodeInvalidConfig, policy.LeaseClaimSizeField, err)
	}
	return pvc, nil
}

// releaseReusable is the host's release of a reusable lease (lease.Release): retained, its
// agent freed and the receipt (`released`, stopped) published; with cancelActiveWork it is
// suspended at once. A lease with nothing worth keeping is destroyed.
func (d *Dispatcher) releaseReusable(ctx context.Context, log zerolog.Logger, req events.ReleaseRequest) error {
	ref := events.Ref(req.CompanyID, req.RunID)
	var before lease.State
	rec, err := d.records.Modify(ctx, ref, func(r *lease.Record) (bool, error) {
		before = r.State
		return lease.Release(d.opts.Now(), req.CancelActiveWork)(r)
	})
	if err != nil {
		return err
	}
	switch rec.State {
	case lease.StateReleasing:
		if before == lease.StateDispatching {
			log.Info().Msg("release caught the reusable lease while its workload is created; the dispatch destroys it")
			return nil
		}
		return d.completeRelease(ctx, log, rec)
	case lease.StateDestroyed, lease.StateCollected:
		return d.answerRelease(ctx, log, rec, req.ReleaseID)
	case lease.StateRetained:
		d.freeAgent(ctx, log, rec.CompanyID, rec.AgentID, rec.RunID)
		if rec.CancelActiveWork {
			// The pod's commands are cancelled by deleting it; the volume stays for a resume.
			if err := d.suspend(ctx, log, rec, 0); err != nil {
				return err
			}
		}
	}
	return d.answerRelease(ctx, log, rec, req.ReleaseID)
}

// suspend suspends a retained lease whose idle window (idle) is over, one in use past its
// expiry (its agent freed once the pod is gone), or one whose suspend was interrupted: its pod
// deleted and waited for, the lease suspended, `suspended` published. A lease resumed meanwhile
// is left alone.
func (d *Dispatcher) suspend(ctx context.Context, log zerolog.Logger, rec lease.Record, idle time.Duration) error {
	var inUse bool // a lease suspended past its expiry: its run held the agent
	rec, err := d.records.Modify(ctx, rec.Ref(), func(r *lease.Record) (bool, error) {
		inUse = r.State == lease.StateCreated
		return lease.BeginSuspend(d.opts.Now(), idle)(r)
	})
	if errors.Is(err, lease.ErrInUse) || errors.Is(err, lease.ErrNotDue) || errors.Is(err, lease.ErrEnded) {
		return nil
	}
	if err != nil {
		return err
	}
	if rec.State == lease.StateSuspended {
		return nil
	}
	w, err := d.workload(rec)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, d.opts.ReleaseTimeout)
	defer cancel()
	if err := w.Suspend(sctx, rec.Namespace, rec.WorkloadName, d.podDeleteOptions(w, rec)); err != nil {
		return k8s.Meaning(k8s.OpDelete, err)
	}
	rec, err = d.records.Modify(ctx, rec.Ref(), lease.Suspended(d.opts.Now(), rec.Generation))
	if errors.Is(err, lease.ErrInUse) || errors.Is(err, lease.ErrEnded) {
		return nil // resumed or destroyed meanwhile: that generation's pod is the resume's
	}
	if err != nil {
		return err
	}
	if inUse {
		d.freeAgent(ctx, log, rec.CompanyID, rec.AgentID, rec.RunID)
	}
	if _, err := d.publisher.Publish(ctx, events.RunSuspendedEvent{
		RunID: rec.RunID, CompanyID: rec.CompanyID, ProviderLeaseID: rec.WorkloadName,
		Generation: rec.Generation, VolumeClaim: rec.VolumeClaim,
	}); err != nil {
		return fmt.Errorf("publishing suspended: %w", err)
	}
	log.Info().Int("generation", rec.Generation).Msg("reusable lease suspended: pod deleted, volume kept")
	return nil
}

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

// sweepLeasesLoop looks at every reusable lease each LeaseSweepInterval (and at start).
func (d *Dispatcher) sweepLeasesLoop(ctx context.Context) {
	tick := time.NewTicker(d.opts.LeaseSweepInterval)
	defer tick.Stop()
	for {
		if err := d.sweepLeases(ctx); err != nil && ctx.Err() == nil {
			d.log.Warn().Err(err).Msg("sweeping reusable leases failed")
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// sweepLeases suspends the retained leases whose idle window is over, collects the suspended
// ones past the maximum age, and finishes what an interrupted suspend or collection left. Every
// step is a compare-and-set transition, so dispatcher replicas sweeping at once agree.
func (d *Dispatcher) sweepLeases(ctx context.Context) error {
	keys, err := d.records.KV.ListKeys(ctx)
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing lease records: %w", err)
	}
	defer func() { _ = keys.Stop() }()
	var errs []error
	for key := range keys.Keys() {
		ref, ok := events.ParseRunKey(key)
		if !ok {
			continue
		}
		rec, _, err := d.records.Get(ctx, ref)
		if err != nil {
			if !errors.Is(err, lease.ErrNotFound) {
				errs = append(errs, err)
			}
			continue
		}
		if !rec.Reusable {
			continue
		}
		if err := d.sweepLease(ctx, rec); err != nil {
			errs = append(errs, fmt.Errorf("lease of run %s: %w", ref.RunID, err))
		}
	}
	return errors.Join(errs...)
}

func (d *Dispatcher) sweepLease(ctx context.Context, rec lease.Record) error {
	log := d.log.With().Str(events.LogKeyRunID, rec.RunID).Str(events.LogKeyTenant, rec.CompanyID).Logger()
	now := d.opts.Now()
	switch {
	case rec.State == lease.StateRetained && rec.RetainedAt != nil && !now.Before(rec.RetainedAt.Add(d.opts.LeaseIdleWindow)),
		rec.State == lease.StateSuspending:
		return d.suspend(ctx, log, rec, d.opts.LeaseIdleWindow)
	case rec.State == lease.StateCreated && rec.Expired(now):
		// Its run's time is up: what a pod's activeDeadlineSeconds does to any other lease,
		// the volume kept (a reusable lease's pod has no deadline: policy.RunSpec.VolumeClaim).
		log.Info().Time("expires_at", *rec.ExpiresAt).Msg("suspending a reusable lease in use past its expiry")
		return d.suspend(ctx, log, rec, d.opts.LeaseIdleWindow)
	case rec.State == lease.StateSuspended && rec.SuspendedAt != nil && !now.Before(rec.SuspendedAt.Add(d.opts.LeaseMaxAge)):
		rec, err := d.records.Modify(ctx, rec.Ref(), lease.Collect(now, d.opts.LeaseMaxAge))
		if errors.Is(err, lease.ErrInUse) || errors.Is(err, lease.ErrNotDue) || errors.Is(err, lease.ErrEnded) {
			return nil
		}
		if err != nil {
			return err
		}
		log.Info().Dur("max_age", d.opts.LeaseMaxAge).Msg("collecting a reusable lease suspended past the maximum age")
		return d.completeRelease(ctx, log, rec)
	case rec.State == lease.StateReleasing && rec.Collected:
		return d.completeRelease(ctx, log, rec)
	}
	return nil
}
