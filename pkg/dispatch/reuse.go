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
//   - a resume (<prefix>.lease.<c>.resume; resume.go) takes the agent's guard, makes a
//     retained lease live again at once, and a suspended one once a new pod on the same claim
//     is ready, renews the lease's expiry by its run deadline, then publishes `resumed` with it;
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
