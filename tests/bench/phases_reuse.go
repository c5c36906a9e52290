package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oklog/ulid/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// (n): a reusable lease (issue 19) through the dispatcher, one step after another, against the
// Kubernetes primitive each step rides on, in one company's tenant (its pipeline tenant; the
// raw side's objects are labelled so no worker tracks them):
//
//   - first acquire {reuseLease} published → status Running/Ready (the claim provisioned, the
//     pod on it)  vs  client-go create of the same claim (pkg/policy.RenderLeaseClaim), then of
//     the same pod on it (RenderPod) → Ready;
//   - resume of a retained lease (released, its pod live) published → `resumed`  vs  a
//     client-go GET of that pod (the resume's check rides on one);
//   - resume of a suspended lease (released with cancelActiveWork: pod deleted, claim kept)
//     published → `resumed` (a new pod Ready on the claim)  vs  client-go pod create → Ready on
//     the raw side's claim, bound by its first pod.
//
// The acquire and suspended pairs alternate which side goes first; the first lease is a
// warm-up, acquired (it makes the tenant) and destroyed, with a raw claim and pod beside it,
// unmeasured. The releases before each resume are not timed.
const (
	phaseReuse = "(n) reusable lease"
	// reuseWarmup leases come first, unmeasured.
	reuseWarmup = 1
)

// reuseSamples are the measurements of (n), both sides.
type reuseSamples struct {
	acquire, rawFresh     samples
	live, rawGet          samples
	suspended, rawOnClaim samples
}

// merge adds o's samples to s.
func (s *reuseSamples) merge(o reuseSamples) {
	s.acquire.merge(o.acquire)
	s.rawFresh.merge(o.rawFresh)
	s.live.merge(o.live)
	s.rawGet.merge(o.rawGet)
	s.suspended.merge(o.suspended)
	s.rawOnClaim.merge(o.rawOnClaim)
}

func (b *bench) reusePhase(ctx context.Context, rep *report) error {
	company := newID("reuse-")
	var all reuseSamples
	for i := range reuseWarmup + b.s.reuseLeases {
		var s reuseSamples
		err := b.reuseLease(ctx, company, i%2 == 1, i < reuseWarmup, &s)
		if i < reuseWarmup && err != nil {
			return fmt.Errorf("the warm-up lease: %w", err)
		}
		if err != nil {
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			b.logf("(n) lease %d failed: %v", i, err)
		}
		if i >= reuseWarmup {
			all.merge(s)
		}
	}
	rep.add(
		latencyRow(phaseReuse+", first acquire → ready (claim provisioned), warm tenant", all.acquire, all.rawFresh,
			"client-go create of the same claim (pkg/policy.RenderLeaseClaim), then of the same Pod on it (RenderPod; its Secret created between, untimed) → Ready seen by a watch", "", nil),
		latencyRow("(n') resume of a retained lease (pod live) → resumed", all.live, all.rawGet,
			"client-go GET of the lease's pod", "", nil),
		latencyRow("(n'') resume of a suspended lease (new pod on its claim) → resumed", all.suspended, all.rawOnClaim,
			"client-go create of the same Pod on an existing bound claim (the raw side's, bound by its first pod) → Ready seen by a watch", "", nil),
	)
	rep.note("(n) %d reusable pod leases of one company (after a warm-up lease, acquired and destroyed), each: acquired, released and resumed %d times while its pod is live, released with cancelActiveWork (suspended: pod deleted, claim kept) and resumed %d times; the releases are not timed; the storage class is the cluster's default",
		b.s.reuseLeases, b.s.reuseLiveResumes, b.s.reuseSuspendedResumes)
	return nil
}

// reuseLease measures one reusable lease's life, and the raw side's next to it, into s: the
// acquire, the live resumes and the suspended ones (a warm-up lease only its acquire). rawFirst
// puts the raw side of each pair first. It destroys the lease and deletes the raw claim before
// it returns.
func (b *bench) reuseLease(ctx context.Context, company string, rawFirst, warmUp bool, s *reuseSamples) (err error) {
	rawReq := b.request(company, nil)
	rawReq.Config = podConfig()
	rawPlan, err := lease.New(rawReq, time.Now(), benchOperator())
	if err != nil {
		return fmt.Errorf("planning the raw pods: %w", err)
	}
	rawClaim, err := renderRawClaim(rawPlan)
	if err != nil {
		return err
	}
	claims := b.raw.cs.CoreV1().PersistentVolumeClaims(rawClaim.Namespace)
	var l reusableLease
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.s.cleanupTimeout)
		defer cancel()
		if l.runID != "" {
			err = errors.Join(err, b.destroyReusable(cctx, l))
		}
		if derr := claims.Delete(cctx, rawClaim.Name, metav1.DeleteOptions{}); derr != nil && !apierrors.IsNotFound(derr) {
			err = errors.Join(err, fmt.Errorf("deleting PersistentVolumeClaim %s/%s: %w", rawClaim.Namespace, rawClaim.Name, derr))
		}
	}()

	acquire := func() error {
		d, acquired, err := b.acquireReusable(ctx, company)
		l = acquired // destroyed on the way out once it has a run, even when not ready
		s.acquire.add(d, err)
		return err
	}
	rawFresh := func() error {
		wctx, cancel := b.waitCtx(ctx)
		defer cancel()
		start := time.Now()
		err := createRetryingConflicts(func() error {
			_, err := claims.Create(wctx, rawClaim, metav1.CreateOptions{FieldManager: benchFieldManager})
			return err
		})
		created := time.Since(start)
		if err != nil {
			err = fmt.Errorf("creating PersistentVolumeClaim %s/%s: %w", rawClaim.Namespace, rawClaim.Name, err)
			s.rawFresh.add(0, err)
			return err
		}
		d, err := b.rawPodReady(ctx, rawPlan, b.sandboxKey, rawClaim)
		s.rawFresh.add(created+d, err)
		return err
	}
	// The raw side needs the tenant the lease's acquire makes on the warm-up.
	if err := pair(rawFirst, acquire, rawFresh); err != nil || warmUp {
		return err
	}

	for range b.s.reuseLiveResumes {
		if err := b.releaseReusable(ctx, l, false); err != nil {
			return err
		}
		d, err := b.resumeReusable(ctx, l, events.ResumedFromRetained)
		s.live.add(d, err)
		if err != nil {
			return err
		}
		wctx, cancel := b.waitCtx(ctx)
		start := time.Now()
		_, err = b.raw.cs.CoreV1().Pods(l.namespace).Get(wctx, l.name, metav1.GetOptions{})
		s.rawGet.add(time.Since(start), err)
		cancel()
		if err != nil {
			return fmt.Errorf("reading pod %s/%s: %w", l.namespace, l.name, err)
		}
	}

	for range b.s.reuseSuspendedResumes {
		resume := func() error {
			if err := b.releaseReusable(ctx, l, true); err != nil {
				return err
			}
			d, err := b.resumeReusable(ctx, l, events.ResumedFromSuspended)
			s.suspended.add(d, err)
			return err
		}
		rawOnClaim := func() error {
			d, err := b.rawPodReady(ctx, rawPlan, b.sandboxKey, rawClaim)
			s.rawOnClaim.add(d, err)
			return err
		}
		if err := pair(rawFirst, resume, rawOnClaim); err != nil {
			return err
		}
	}
	return nil
}

// pair runs first then second, or second then first when swap is set; it stops at the first
// error.
func pair(swap bool, first, second func() error) error {
	if swap {
		first, second = second, first
	}
	if err := first(); err != nil {
		return err
	}
	return second()
}

// reusableLease is a reusable lease of the bench: its run, its pod and its company.
type reusableLease struct {
	companyID, runID, name, namespace string
}

// acquireReusable acquires a reusable pod lease for a fresh agent of company and returns the
// time from just before the acquire's publish to its status Running/Ready event.
func (b *bench) acquireReusable(ctx context.Context, company string) (time.Duration, reusableLease, error) {
	req := b.request(company, nil)
	req.Config = podConfig()
	req.ReuseLease = true
	wctx, cancel := b.waitCtx(ctx)
	defer cancel()
	start := time.Now()
	if _, err := b.pub.Publish(wctx, req); err != nil {
		return 0, reusableLease{}, fmt.Errorf("publishing acquire: %w", err)
	}
	ev, err := b.events.createdEvent(wctx, req.RunID)
	if err != nil {
		return 0, reusableLease{}, err
	}
	l := reusableLease{companyID: req.CompanyID, runID: req.RunID, name: ev.lease, namespace: ev.namespace}
	if err := b.labelTenants(ctx, company); err != nil {
		return 0, l, err
	}
	readyAt, err := b.events.ready(wctx, req.RunID)
	if err != nil {
		return 0, l, err
	}
	return readyAt.Sub(start), l, nil
}

// releaseReusable releases the lease as the host does after a run (its pod kept), or with
// cancelActiveWork (suspended at once: the pod deleted and gone before the answer), and waits
// for its answer.
func (b *bench) releaseReusable(ctx context.Context, l reusableLease, cancelActiveWork bool) error {
	req := events.ReleaseRequest{
		RunID: l.runID, CompanyID: l.companyID, ProviderLeaseID: l.name,
		CancelActiveWork: cancelActiveWork, ReleaseID: newID("release-"),
	}
	wctx, cancel := b.waitCtx(ctx)
	defer cancel()
	if _, err := b.pub.Publish(wctx, req); err != nil {
		return fmt.Errorf("publishing the release of lease %s: %w", l.name, err)
	}
	_, err := b.events.answer(wctx, answerKey{l.runID, events.KindReleased, req.ReleaseID})
	return err
}

// resumeReusable resumes the lease and returns the time from just before the resume's publish
// to its resumed answer, which must say the resume found the lease in state want.
func (b *bench) resumeReusable(ctx context.Context, l reusableLease, want events.ResumedFrom) (time.Duration, error) {
	req := events.ResumeRequest{RunID: l.runID, CompanyID: l.companyID, ProviderLeaseID: l.name, ResumeID: newID("resume-")}
	wctx, cancel := b.waitCtx(ctx)
	defer cancel()
	start := time.Now()
	if _, err := b.pub.Publish(wctx, req); err != nil {
		return 0, fmt.Errorf("publishing the resume of lease %s: %w", l.name, err)
	}
	a, err := b.events.answer(wctx, answerKey{l.runID, events.KindResumed, req.ResumeID})
	if err != nil {
		return 0, err
	}
	if a.from != want {
		return 0, fmt.Errorf("lease %s resumed from %q, want %q", l.name, a.from, want)
	}
	return a.at.Sub(start), nil
}

// destroyReusable destroys the lease (pod, Secret and claim) and waits for its answer.
func (b *bench) destroyReusable(ctx context.Context, l reusableLease) error {
	req := events.ReleaseRequest{RunID: l.runID, CompanyID: l.companyID, ProviderLeaseID: l.name, CancelActiveWork: true, Destroy: true}
	if _, err := b.pub.Publish(ctx, req); err != nil {
		return fmt.Errorf("publishing the destroy of lease %s: %w", l.name, err)
	}
	// A destroy's released names no release.
	_, err := b.events.answer(ctx, answerKey{l.runID, events.KindReleased, ""})
	return err
}

// renderRawClaim renders a claim of plan's tenant as the dispatcher renders a reusable lease's
// (the operator's class and default size), not kubeclip's (rawManagedBy).
func renderRawClaim(plan lease.Plan) (*corev1.PersistentVolumeClaim, error) {
	pvc, err := benchOperator().RenderLeaseClaim(policy.LeaseClaim{
		Namespace: plan.Namespace, Name: policy.LeaseClaimName(policy.WorkloadName(ulid.Make())),
		RunID: plan.Request.RunID, CompanyID: plan.Request.CompanyID, AgentID: plan.Request.AgentID,
	})
	if err != nil {
		return nil, fmt.Errorf("rendering the raw claim: %w", err)
	}
	pvc.Labels[policy.LabelManagedBy] = rawManagedBy
	return pvc, nil
}
