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

// failureCleanupTimeout bounds deleting what a failed dispatch created before `failed` is
// reported; what is left is reconciliation's.
const failureCleanupTimeout = 30 * time.Second

// handleDispatch creates the run's workload and Secret and publishes `created`.
//
// The lease record decides what happens, with compare-and-set at each step (pkg/lease): a
// dispatch of a lease that failed, finished or ended does nothing; the workload name is fixed
// by the dispatch transition, so a redelivery reuses it; and `created` goes out only if the
// lease could move to created. A release that came while the workload was being made leaves
// the lease releasing, and this handler, which holds the only dispatch, completes it: the
// run ends in exactly one coherent outcome.
func (d *Dispatcher) handleDispatch(ctx context.Context, m jetstream.Msg) error {
	took := newStepTimer(d.opts.Now, queuedAt(m, time.Time{}))
	req, err := events.DecodeDispatch(m.Subject(), m.Data())
	if err != nil {
		return err
	}
	ref := events.Ref(req.CompanyID, req.RunID)
	log := d.log.With().Str(events.LogKeyRunID, req.RunID).Str(events.LogKeyTenant, req.CompanyID).Logger()
	plan, err := lease.New(req.AcquireRequest, d.opts.Now(), d.opts.Operator)
	if err != nil {
		return err
	}
	if plan.Namespace != req.Namespace {
		return events.Terminalf(events.CodeInternal, "namespace", "the tenant-worker chose namespace %s, the dispatcher %s", req.Namespace, plan.Namespace)
	}
	// Defence in depth: the tenant-worker claimed the namespace for this company before it
	// handed the lease over; a run never goes into a namespace another company owns.
	owner, _, _, err := lease.ReadTenant(ctx, d.tenants, plan.Namespace)
	if err != nil {
		return err
	}
	if owner.CompanyID != req.CompanyID {
		return events.Terminalf(events.CodeNamespaceNotAllowed, "namespace", "namespace %s is not this company's tenant", plan.Namespace)
	}
	rec, _, err := d.records.Get(ctx, ref)
	if errors.Is(err, lease.ErrNotFound) {
		return events.Terminalf(events.CodeInternal, "", "run %s has no lease record; the tenant-worker writes one before it dispatches", req.RunID)
	}
	// A dispatch redelivered after its run was created counts nowhere again (warm pools).
	createdBefore := rec.State == lease.StateCreated
	if err != nil {
		return err
	}
	switch {
	case rec.State == lease.StateReleasing && rec.WorkloadName != "":
		return d.completeRelease(ctx, log, rec) // redelivered after a release caught it mid-way
	case !rec.State.Live():
		log.Info().Str("state", string(rec.State)).Msg("lease is no longer live; dropping its dispatch")
		return nil
	}
	// A redelivery of a created run: its lease may not say finished yet (that update is best
	// effort), so ask the run stream; a dispatch redelivered after its run's result would run
	// the agent a second time.
	if rec.State == lease.StateCreated {
		if over, err := events.ResultPublished(ctx, d.runs, d.opts.Subjects, ref); err != nil || over {
			return err
		}
	}

	if err := d.checkReusable(rec, plan); err != nil {
		return err
	}
	took.done(stepCheck)
	if held, err := d.holdAgent(ctx, log, m, plan); !held || err != nil {
		return err
	}
	took.done(stepGuard)
	name := policy.WorkloadName(d.opts.NewID())
	var warmPod *corev1.Pod
	if rec.State == lease.StateRequested && d.warmEligible(plan, rec) {
		if warmPod, err = d.claimWarm(ctx, m, plan); err != nil {
			return err
		}
		if warmPod != nil {
			name = warmPod.Name
		}
		took.done(stepClaim)
	}
	var claim string
	if rec.Reusable {
		w, err := workload.For(plan.Config.Backend, d.workloads)
		if err != nil {
			return err
		}
		claim = w.ClaimName(name)
	}
	rec, err = d.records.Modify(ctx, ref, lease.Dispatch(lease.Workload{
		Namespace: plan.Namespace, Name: name, SecretName: policy.SecretName(name),
		Backend: string(plan.Config.Backend), VolumeClaim: claim, ExpiresAt: plan.ExpiresAt(),
		RunDeadline: plan.RunDeadline(), Warm: warmPod != nil,
	}))
	ended := errors.Is(err, lease.ErrEnded) || errors.Is(err, lease.ErrFailed) || errors.Is(err, lease.ErrFinished)
	if warmPod != nil && (ended || (err == nil && rec.WorkloadName != warmPod.Name)) {
		// The lease did not take the pod this attempt claimed: nothing else may have it. (After
		// any other error the record may have taken it: a redelivery finds it, boundTo.)
		if eerr := workload.EvictWarmPod(ctx, d.opts.Clientset, warmPod); eerr != nil {
			log.Warn().Err(eerr).Msg("evicting a warm pod the lease did not take failed; the orphan pass will")
		}
	}
	if ended {
		// Released (or failed) before anything was created: nothing to undo but the guard.
		d.freeAgent(ctx, log, req.CompanyID, req.AgentID, req.RunID)
		log.Info().Str("state", string(rec.State)).Msg("lease ended before its workload was created")
		return nil
	}
	if err != nil {
		return err
	}
	took.done(stepRecord)
	created, run, err := d.create(ctx, log, plan, rec, warmPod)
	if err != nil {
		return err
	}
	took.done(stepCreate)
	rec, err = d.records.Modify(ctx, ref, lease.Created)
	if errors.Is(err, lease.ErrEnded) {
		return d.completeRelease(ctx, log, rec)
	}
	if err != nil {
		return err
	}
	took.done(stepCreated)
	ack, err := d.publisher.Publish(ctx, created)
	if err != nil {
		return fmt.Errorf("publishing created: %w", err)
	}
	took.done(stepPublish)
	if d.opts.RunObserver != nil && !ack.Duplicate {
		// Timed once: a redelivery's publish is a duplicate.
		d.opts.RunObserver.RunCreated(d.opts.Now().Sub(rec.CreatedAt))
	}
	// A Secret the workload does not own yet (a redelivery found it; a reusable lease's, which
	// its claim owns) is adopted after `created` goes out: the pod starts without it, and
	// Paperclip hears one API round trip sooner. A warm pod's is created only now: its sandboxd
	// got the keys with the bind. A failure is retried through the whole (idempotent) handler.
	if err := run.AdoptSecret(ctx); err != nil {
		return err
	}
	took.done(stepAdopt)
	log.Info().Str(events.LogKeyNamespace, created.Namespace).Str("workload", created.WorkloadName).Bool("warm", rec.Warm).Dict(logKeyTookMs, took.dict()).Msg("run created")
	if d.warmEligible(plan, rec) && !createdBefore {
		d.afterWarmAcquire(ctx, log, plan, rec)
	}
	return nil
}

// create makes the run's workload and Secret under the name its lease record fixed,
// idempotently, and returns the created event and the workload, whose Secret adoption is done
// once the event is published. A warm lease's workload is the warm pod it claimed (warmPod,
// nil on a redelivery: read again), bound instead of created.
func (d *Dispatcher) create(ctx context.Context, log zerolog.Logger, plan lease.Plan, rec lease.Record, warmPod *corev1.Pod) (events.RunCreatedEvent, workload.Created, error) {
	req := plan.Request
	spec := plan.RunSpec(rec.WorkloadName)
	spec.SandboxdImage, spec.ExpiresAt = d.opts.SandboxdImage, rec.ExpiresAt
	w, err := d.workload(rec)
	if err != nil {
		return events.RunCreatedEvent{}, workload.Created{}, err
	}
	if w.Backend().ExecCapable() && d.opts.SandboxKey == nil {
		return events.RunCreatedEvent{}, workload.Created{}, events.Terminalf(events.CodeBackendUnavailable, "config.backend",
			"backend %q needs this kubeclip installation's sandbox key, which its operator has not set up; use backend %q", w.Backend(), policy.BackendJob)
	}
	secret, err := d.renderSecret(ctx, plan, spec, w)
	if err != nil {
		return events.RunCreatedEvent{}, workload.Created{}, err
	}
	spec.SecretEnvKeys = policy.SecretEnvKeys(secret)
	if rec.VolumeClaim != "" {
		if spec.VolumeClaim, err = d.renderClaim(rec); err != nil {
			return events.RunCreatedEvent{}, workload.Created{}, err
		}
	}

	var run workload.Created
	switch {
	case rec.Warm:
		run, err = d.startWarm(ctx, rec, secret, warmPod)
	default:
		run, err = w.Create(ctx, spec, secret)
		if _, quota := k8s.QuotaRefusal(err); quota && d.warm != nil {
			run, err = d.createEvictingWarm(ctx, log, w, spec, secret, err)
		}
	}
	if err != nil {
		return events.RunCreatedEvent{}, workload.Created{}, k8s.Meaning(k8s.OpCreate, err)
	}

	if !plan.Grant.Empty() {
		obj, err := policy.RenderScopedEgress(spec, plan.Grant, run.Owner)
		if err != nil {
			return events.RunCreatedEvent{}, workload.Created{}, events.Terminal(events.CodeInternal, "executionWorkspaceSettings.networkEgress", err)
		}
		if err := d.opts.Applier.Apply(ctx, obj); err != nil {
			return events.RunCreatedEvent{}, workload.Created{}, k8s.Meaning(k8s.OpCreate, err)
		}
	}

	if run.Existed {
		log.Info().Msg("workload already existed; republishing created")
	}
	phase := events.PhasePending
	if rec.Warm {
		phase = events.PhaseRunning // a warm pod is Running and Ready when it is claimed
	}
	return events.RunCreatedEvent{
		RunID: req.RunID, CompanyID: req.CompanyID,
		ProviderLeaseID: rec.WorkloadName, Namespace: rec.Namespace,
		WorkloadName: rec.WorkloadName, SecretName: rec.SecretName, Backend: rec.Backend,
		Phase: phase, ExpiresAt: rec.ExpiresAt, Warm: rec.Warm,
	}, run, nil
}

// reportDispatchFailure ends an acquire that failed for good: the lease is marked failed, what
// the dispatch created is deleted and the agent freed (both best effort: reconciliation deletes
// the workload of a failed lease, the guard's TTL frees the agent), then `failed` goes out. A
// lease that a release caught meanwhile is released instead, and no failure is reported.
func (d *Dispatcher) reportDispatchFailure(ctx context.Context, m jetstream.Msg, te *events.TerminalError) error {
	ref, _ := events.FailureRef(m)
	if ref.Validate() != nil {
		return events.PublishFailure(ctx, d.publisher, d.log, m, te)
	}
	log := d.log.With().Str(events.LogKeyRunID, ref.RunID).Str(events.LogKeyTenant, ref.CompanyID).Logger()
	if err := lease.RecordFailure(ctx, d.records, m, te.Code, d.opts.Now()); err != nil {
		return err
	}
	rec, _, err := d.records.Get(ctx, ref)
	if err != nil {
		return err
	}
	switch rec.State {
	case lease.StateReleasing:
		return d.completeRelease(ctx, log, rec)
	case lease.StateFailed:
	default:
		// A redelivered dispatch failed after an earlier delivery created the run: the run
		// stands, and nothing is reported.
		log.Warn().Err(te).Str("state", string(rec.State)).Msg("dispatch failed after its run was created; the run stands")
		return nil
	}
	if rec.WorkloadName != "" {
		cctx, cancel := context.WithTimeout(ctx, failureCleanupTimeout)
		err := d.deleteRun(cctx, rec, true)
		cancel()
		if err != nil {
			log.Warn().Err(err).Msg("deleting what the failed dispatch created failed; reconciliation will")
		}
	}
	d.freeAgent(ctx, log, ref.CompanyID, rec.AgentID, ref.RunID)
	return events.PublishFailure(ctx, d.publisher, d.log, m, te)
}
