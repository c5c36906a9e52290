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

// acquire is one delivery of a dispatch as handleDispatch carries it through its steps: what
// each step learned that a later one needs.
type acquire struct {
	m    jetstream.Msg
	req  events.DispatchRequest
	ref  events.RunRef
	log  zerolog.Logger
	plan lease.Plan
	// rec is the lease record as the last step read or wrote it.
	rec lease.Record
	// createdBefore: a dispatch redelivered after its run was created counts nowhere again
	// (warm pools).
	createdBefore bool
	// warmPod is the warm pod this attempt claimed (claimWarm); nil when it claimed none.
	warmPod *corev1.Pod
	took    *stepTimer
}

// handleDispatch creates the run's workload and Secret and publishes `created`.
//
// The lease record decides what happens, with compare-and-set at each step (pkg/lease): a
// dispatch of a lease that failed, finished or ended does nothing; the workload name is fixed
// by the dispatch transition, so a redelivery reuses it; and `created` goes out only if the
// lease could move to created. A release that came while the workload was being made leaves
// the lease releasing, and this handler, which holds the only dispatch, completes it: the
// run ends in exactly one coherent outcome.
func (d *Dispatcher) handleDispatch(ctx context.Context, m jetstream.Msg) error {
	a, err := d.readAcquire(ctx, m)
	if err != nil {
		return err
	}
	if live, err := d.readLease(ctx, a); !live || err != nil {
		return err
	}
	if err := d.checkReusable(a.rec, a.plan); err != nil {
		return err
	}
	a.took.done(stepCheck)
	if held, err := d.holdAgent(ctx, a.log, m, a.plan); !held || err != nil {
		return err
	}
	a.took.done(stepGuard)
	if recorded, err := d.recordWorkload(ctx, a); !recorded || err != nil {
		return err
	}
	a.took.done(stepRecord)
	created, run, err := d.create(ctx, a.log, a.plan, a.rec, a.warmPod)
	if err != nil {
		return err
	}
	a.took.done(stepCreate)
	if marked, err := d.markCreated(ctx, a); !marked || err != nil {
		return err
	}
	a.took.done(stepCreated)
	if err := d.publishCreated(ctx, a, created); err != nil {
		return err
	}
	a.took.done(stepPublish)
	// A Secret the workload does not own yet (a redelivery found it; a reusable lease's, which
	// its claim owns) is adopted after `created` goes out: the pod starts without it, and
	// Paperclip hears one API round trip sooner. A warm pod's is created only now: its sandboxd
	// got the keys with the bind. A failure is retried through the whole (idempotent) handler.
	if err := run.AdoptSecret(ctx); err != nil {
		return err
	}
	a.took.done(stepAdopt)
	a.log.Info().Str(events.LogKeyNamespace, created.Namespace).Str("workload", created.WorkloadName).Bool("warm", a.rec.Warm).Dict(logKeyTookMs, a.took.dict()).Msg("run created")
	if d.warmEligible(a.plan, a.rec) && !a.createdBefore {
		d.afterWarmAcquire(ctx, a.log, a.plan, a.rec)
	}
	return nil
}

// readAcquire decodes the dispatch and the plan the tenant-worker decided for it (taken as it
// is: the dispatcher derives no plan, lease.Decode), and checks that the namespace the
// tenant-worker chose is this company's.
func (d *Dispatcher) readAcquire(ctx context.Context, m jetstream.Msg) (*acquire, error) {
	took := newStepTimer(d.opts.Now, queuedAt(m, time.Time{}))
	req, err := events.DecodeDispatch(m.Subject(), m.Data())
	if err != nil {
		return nil, err
	}
	a := &acquire{
		m: m, req: req, ref: events.Ref(req.CompanyID, req.RunID), took: took,
		log: d.log.With().Str(events.LogKeyRunID, req.RunID).Str(events.LogKeyTenant, req.CompanyID).Logger(),
	}
	if a.plan, err = lease.Decode(req.AcquireRequest, req.Plan, d.opts.Now(), d.opts.Operator); err != nil {
		return nil, err
	}
	if a.plan.Namespace != req.Namespace {
		return nil, events.Terminalf(events.CodeInternal, "namespace", "the dispatch names namespace %s and its plan %s", req.Namespace, a.plan.Namespace)
	}
	// Defence in depth: the tenant-worker claimed the namespace for this company before it
	// handed the lease over; a run never goes into a namespace another company owns.
	owner, _, _, err := lease.ReadTenant(ctx, d.tenants, a.plan.Namespace)
	if err != nil {
		return nil, err
	}
	if owner.CompanyID != req.CompanyID {
		return nil, events.Terminalf(events.CodeNamespaceNotAllowed, "namespace", "namespace %s is not this company's tenant", a.plan.Namespace)
	}
	return a, nil
}

// readLease reads the lease record into a and reports whether the dispatch goes on: a lease a
// release caught mid-way is released now, one that is no longer live, or whose run already
// published its result, is left as it is.
func (d *Dispatcher) readLease(ctx context.Context, a *acquire) (live bool, err error) {
	a.rec, _, err = d.records.Get(ctx, a.ref)
	if errors.Is(err, lease.ErrNotFound) {
		return false, events.Terminalf(events.CodeInternal, "", "run %s has no lease record; the tenant-worker writes one before it dispatches", a.req.RunID)
	}
	a.createdBefore = a.rec.State == lease.StateCreated
	if err != nil {
		return false, err
	}
	switch {
	case a.rec.State == lease.StateReleasing && a.rec.WorkloadName != "":
		return false, d.completeRelease(ctx, a.log, a.rec) // redelivered after a release caught it mid-way
	case !a.rec.State.Live():
		a.log.Info().Str("state", string(a.rec.State)).Msg("lease is no longer live; dropping its dispatch")
		return false, nil
	}
	// A redelivery of a created run: its lease may not say finished yet (that update is best
	// effort), so ask the run stream; a dispatch redelivered after its run's result would run
	// the agent a second time.
	if a.rec.State == lease.StateCreated {
		if over, err := events.ResultPublished(ctx, d.runs, d.opts.Subjects, a.ref); err != nil || over {
			return false, err
		}
	}
	return true, nil
}

// recordWorkload fixes the run's workload in its lease record (lease.Dispatch): a new name, or
// the warm pod it claims, and a reusable lease's claim. It reports whether the dispatch goes
// on: a lease that ended before anything was created frees its agent and stops here.
func (d *Dispatcher) recordWorkload(ctx context.Context, a *acquire) (recorded bool, err error) {
	name := policy.WorkloadName(d.opts.NewID())
	if a.rec.State == lease.StateRequested && d.warmEligible(a.plan, a.rec) {
		if a.warmPod, err = d.claimWarm(ctx, a.m, a.plan); err != nil {
			return false, err
		}
		if a.warmPod != nil {
			name = a.warmPod.Name
		}
		a.took.done(stepClaim)
	}
	var claim string
	if a.rec.Reusable {
		w, err := workload.For(a.plan.Config.Backend, d.workloads)
		if err != nil {
			return false, err
		}
		claim = w.ClaimName(name)
	}
	a.rec, err = d.records.Modify(ctx, a.ref, lease.Dispatch(lease.Workload{
		Namespace: a.plan.Namespace, Name: name, SecretName: policy.SecretName(name),
		Backend: string(a.plan.Config.Backend), VolumeClaim: claim, ExpiresAt: a.plan.ExpiresAt(),
		RunDeadline: a.plan.RunDeadline(), Warm: a.warmPod != nil,
	}))
	ended := errors.Is(err, lease.ErrEnded) || errors.Is(err, lease.ErrFailed) || errors.Is(err, lease.ErrFinished)
	if a.warmPod != nil && (ended || (err == nil && a.rec.WorkloadName != a.warmPod.Name)) {
		// The lease did not take the pod this attempt claimed: nothing else may have it. (After
		// any other error the record may have taken it: a redelivery finds it, boundTo.)
		if eerr := workload.EvictWarmPod(ctx, d.opts.Clientset, a.warmPod); eerr != nil {
			a.log.Warn().Err(eerr).Msg("evicting a warm pod the lease did not take failed; the orphan pass will")
		}
	}
	if ended {
		// Released (or failed) before anything was created: nothing to undo but the guard.
		d.freeAgent(ctx, a.log, a.req.CompanyID, a.req.AgentID, a.req.RunID)
		a.log.Info().Str("state", string(a.rec.State)).Msg("lease ended before its workload was created")
		return false, nil
	}
	return err == nil, err
}

// markCreated moves the lease to created and reports whether `created` may go out: a release
// that came while the workload was being made is completed instead.
func (d *Dispatcher) markCreated(ctx context.Context, a *acquire) (marked bool, err error) {
	a.rec, err = d.records.Modify(ctx, a.ref, lease.Created)
	if errors.Is(err, lease.ErrEnded) {
		return false, d.completeRelease(ctx, a.log, a.rec)
	}
	return err == nil, err
}

// publishCreated publishes `created` and times the lease's first publish of it.
func (d *Dispatcher) publishCreated(ctx context.Context, a *acquire, created events.RunCreatedEvent) error {
	ack, err := d.publisher.Publish(ctx, created)
	if err != nil {
		return fmt.Errorf("publishing created: %w", err)
	}
	if d.opts.RunObserver != nil && !ack.Duplicate {
		// Timed once: a redelivery's publish is a duplicate.
		d.opts.RunObserver.RunCreated(d.opts.Now().Sub(a.rec.CreatedAt))
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
