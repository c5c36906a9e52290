package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

const (
	// clearTimeout bounds how long clearBurst waits for a burst's pods to be gone.
	clearTimeout = 2 * time.Minute
	// clearPoll is how often it looks.
	clearPoll = time.Second
	// A burst of (f) starts once the node's CPU use over quietWindow is below quietCPU percent
	// of all cores (the kubelet and containerd have finished tearing the last burst's pods down;
	// an idle node with the pipeline uses about 5%), or after quietTimeout.
	quietCPU     = 25
	quietWindow  = time.Second
	quietTimeout = 45 * time.Second
)

// replicaPhase returns one burst of (f) with the given number of dispatchers: the burst of
// (e) again (--burst acquires published at once, round robin over --burst-companies warm
// tenants, created events per second from the first publish to the last created). The extra
// dispatchers run in process, each with its own NATS connection and Kubernetes clients (so its
// own client-side rate limit), sharing the durable consumers as replicas in separate processes
// would. Each burst gets fresh tenants and starts once the node is clear of the phases before
// it (settle) and quiet; unlike (e), no raw burst comes right before it. The bursts alternate
// (1, n, n, 1, ...); the last one adds the rows. Each burst ends its runs once measured
// (clearBurst).
func (b *bench) replicaPhase(phase string, dispatchers int) func(context.Context, *report) error {
	return func(ctx context.Context, rep *report) (err error) {
		if dispatchers > 1 {
			stop, err := b.pipe.addDispatchers(ctx, dispatchers-1)
			if err != nil {
				return err
			}
			defer func() { err = errors.Join(err, stop()) }()
		}
		companies, err := b.freshCompanies(ctx, b.s.burstCompanies)
		if err != nil {
			return err
		}
		// The new dispatchers reconcile (list every managed Job) as they start; the warm-up
		// acquires above and this pause keep that out of the burst.
		if err := sleep(ctx, burstSettle); err != nil {
			return err
		}
		if err := b.waitQuiet(ctx); err != nil {
			return err
		}
		b.stats.reset() // the breakdown of this phase is its burst's
		burst, err := b.pipelineBurst(ctx, companies)
		if err != nil {
			return err
		}
		b.logf("(f): %d dispatcher(s): %.1f acq/s", dispatchers, burst.rate)
		b.replicaBursts[dispatchers] = append(b.replicaBursts[dispatchers], burst)
		rep.Breakdown = append(rep.Breakdown, b.acquireStages(phase, burst.runs)...)
		rep.Breakdown = append(rep.Breakdown, stageRow(phase, "stage end to end: acquire published → created received", burst.lat))
		if len(b.replicaBursts[1]) == b.s.replicaRounds && len(b.replicaBursts[b.s.dispatchers]) == b.s.replicaRounds {
			b.replicaRows(rep)
		}
		return b.clearBurst(ctx, burst)
	}
}

// replicaPhases are (f)'s bursts in order: per round one with 1 dispatcher and one with
// --dispatchers, the order alternating so drift over the rounds hits both alike.
func (b *bench) replicaPhases() []phase {
	var out []phase
	n := b.s.dispatchers
	for r := range b.s.replicaRounds {
		order := []int{1, n}
		if r%2 == 1 {
			order = []int{n, 1}
		}
		for _, d := range order {
			name := fmt.Sprintf("(f) burst %d, %d dispatcher%s", len(out)+1, d, plural(d))
			out = append(out, phase{name, b.replicaPhase(name, d)})
		}
	}
	return out
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// replicaRows adds (f)'s rows: each configuration's mean rate over the rounds. One dispatcher
// is compared with (e)'s raw creates; more with one, so p50/raw is the replicas' speed-up.
func (b *bench) replicaRows(rep *report) {
	n := b.s.dispatchers
	one, many := b.replicaBursts[1], b.replicaBursts[n]
	rowOf := func(d int, bursts []burstResult) row {
		rate, lat := meanRate(bursts)
		met := rate >= burstTarget
		return row{
			Metric: fmt.Sprintf("(f) acquisitions/s, %d dispatcher%s (%d at once, mean of %d bursts)", d, plural(d), b.s.burst, len(bursts)),
			N:      len(lat.d), Unit: "acq/s", P50: round2(rate),
			Target: fmt.Sprintf("≥ %d acq/s", burstTarget), Met: &met, Errors: lat.errs,
			dist: distOf(lat, samples{}),
		}
	}
	r1 := rowOf(1, one)
	if b.rawBurstRate > 0 {
		r1.RawN, r1.RawP50, r1.Ratio = b.s.burst, round2(b.rawBurstRate), ratio(*r1.P50, b.rawBurstRate)
		r1.Raw = fmt.Sprintf("(e)'s raw burst: %d client-go Secret + Job creates, %d at a time: creates/s", b.s.burst, b.s.rawConcurrency)
	}
	rn := rowOf(n, many)
	rn.Metric = "(f') " + strings.TrimPrefix(rn.Metric, "(f) ")
	rn.RawN, rn.RawP50, rn.Ratio = r1.N, r1.P50, ratio(*rn.P50, *r1.P50)
	rn.Raw = "the 1-dispatcher bursts, row (f): p50/raw is the speed-up of the replicas"
	rep.add(r1, rn)
	rep.note("%s", b.scalingNote(one, many, n))
}

// meanRate is the mean rate of bursts and their latencies together.
func meanRate(bursts []burstResult) (float64, samples) {
	var sum float64
	var lat samples
	for _, br := range bursts {
		sum += br.rate
		lat.d = append(lat.d, br.lat.d...)
		lat.errs += br.lat.errs
		if lat.firstErr == nil {
			lat.firstErr = br.lat.firstErr
		}
	}
	if len(bursts) == 0 {
		return 0, lat
	}
	return sum / float64(len(bursts)), lat
}

// scalingNote says what changed between the one-dispatcher bursts and those with n: when the
// replicas do not speed the burst up, the stages show where the time went instead.
func (b *bench) scalingNote(one, many []burstResult, n int) string {
	var oneRuns, manyRuns []string
	var onePost, manyPost samples
	for _, br := range one {
		oneRuns = append(oneRuns, br.runs...)
		onePost.d = append(onePost.d, br.postJobs.d...)
	}
	for _, br := range many {
		manyRuns = append(manyRuns, br.runs...)
		manyPost.d = append(manyPost.d, br.postJobs.d...)
	}
	oneStages, manyStages := b.acquireStages("", oneRuns), b.acquireStages("", manyRuns)
	var parts []string
	for i, st := range oneStages {
		if i >= len(manyStages) || st.P50 == nil || manyStages[i].P50 == nil || strings.Contains(st.What, "delivery") {
			continue
		}
		what := strings.TrimPrefix(st.What, "stage ")
		if w, _, ok := strings.Cut(what, ":"); ok {
			what = w
		}
		parts = append(parts, fmt.Sprintf("%s p50 %.0f → %.0f ms", what, *st.P50, *manyStages[i].P50))
	}
	if p1, pn := onePost.p50(), manyPost.p50(); p1 != nil && pn != nil {
		parts = append(parts, fmt.Sprintf("the dispatchers' POST jobs p50 %.0f → %.0f ms", *p1, *pn))
	}
	perBurst := func(bursts []burstResult, f func(burstResult) string) string {
		out := make([]string, len(bursts))
		for i, br := range bursts {
			out[i] = f(br)
		}
		return strings.Join(out, ", ")
	}
	parts = append(parts,
		fmt.Sprintf("node CPU during the bursts %s%% → %s%% busy",
			perBurst(one, func(br burstResult) string { return fmt.Sprintf("%.0f", br.cpu) }),
			perBurst(many, func(br burstResult) string { return fmt.Sprintf("%.0f", br.cpu) })),
		fmt.Sprintf("pods of the burst created before its last created event %s → %s",
			perBurst(one, func(br burstResult) string { return fmt.Sprint(br.pods) }),
			perBurst(many, func(br burstResult) string { return fmt.Sprint(br.pods) })),
		fmt.Sprintf("CPU per process during each burst, %% of one core (2 cores in all): with 1 dispatcher [%s], with %d [%s]",
			procsPerBurst(one), n, procsPerBurst(many)))
	r1, _ := meanRate(one)
	rn, _ := meanRate(many)
	speedup := 0.0
	if r1 > 0 {
		speedup = rn / r1
	}
	verdict := fmt.Sprintf("%d dispatchers ran up to %d handlers at once instead of %d and created %.2f× as fast (acq/s per burst: %s with 1, %s with %d)",
		n, n*dispatcherConcurrency, dispatcherConcurrency, speedup,
		perBurst(one, func(br burstResult) string { return fmt.Sprintf("%.1f", br.rate) }),
		perBurst(many, func(br burstResult) string { return fmt.Sprintf("%.1f", br.rate) }), n)
	if speedup < float64(n)/2 {
		slower := "longer"
		if p1, pn := onePost.p50(), manyPost.p50(); p1 != nil && pn != nil && *p1 > 0 {
			slower = fmt.Sprintf("%.1f× as long (POST jobs p50)", *pn / *p1)
		}
		verdict += fmt.Sprintf(", far from the %d× of independent dispatchers: the dispatcher is not the bottleneck. The API server, etcd, the controllers, the scheduler and the kubelet share this node's 2 cores (busy throughout the bursts); with up to %d× the requests in flight each took %s, so the server's throughput, not the number of handlers, sets the rate", n, n, slower)
	}
	return fmt.Sprintf("(f): %s (%s)", verdict, strings.Join(parts, "; "))
}

// procsPerBurst is each burst's CPU per process, the bursts apart.
func procsPerBurst(bursts []burstResult) string {
	out := make([]string, len(bursts))
	for i, br := range bursts {
		out[i] = br.procs
	}
	return strings.Join(out, "] [")
}

// waitQuiet waits until the node's CPU use over quietWindow is below quietCPU percent or
// quietTimeout passed; either way the measurement goes ahead, and the log says which.
func (b *bench) waitQuiet(ctx context.Context) error {
	start := time.Now()
	for {
		before := readCPU()
		if err := sleep(ctx, quietWindow); err != nil {
			return err
		}
		busy := nodeBusy(before, readCPU())
		switch waited := time.Since(start).Round(100 * time.Millisecond); {
		case busy < 0:
			return nil // no /proc/stat: nothing to wait for
		case busy < quietCPU:
			b.logf("node quiet (CPU %.0f%% busy) after %s", busy, waited)
			return nil
		case time.Since(start) >= quietTimeout:
			b.logf("node still busy (CPU %.0f%%) after %s: measuring anyway", busy, waited)
			return nil
		}
	}
}

// freshCompanies makes n new companies warm, one acquire each.
func (b *bench) freshCompanies(ctx context.Context, n int) ([]string, error) {
	companies := make([]string, 0, n)
	for range n {
		c := newID("burst-")
		if _, _, err := b.acquire(ctx, c, oneLine()); err != nil {
			return nil, fmt.Errorf("warming company %s: %w", c, err)
		}
		if err := b.labelTenants(ctx, c); err != nil {
			return nil, err
		}
		companies = append(companies, c)
	}
	return companies, nil
}

// clearBurst removes what a burst leaves on the node once it is measured: its hundreds of Jobs
// are still starting pods a tenant quota's worth at a time, for minutes. It deletes the Jobs
// and their pods (grace 0: a pod runs a one-line stub, nothing to shut down), waits until the
// pods are gone and the run-watcher has published a result for each run (cancelled,
// JobDeleted, for those that had not ended). Waits that run out are logged, not fatal: the
// next phase's settle waits for the rest, bounded, and names what is left.
func (b *bench) clearBurst(ctx context.Context, burst burstResult) error {
	start := time.Now()
	var namespaces []string
	for _, c := range burst.companies {
		ns, err := b.tenantNamespace(c)
		if err != nil {
			return err
		}
		namespaces = append(namespaces, ns)
	}
	runs := burst.runs
	prop := metav1.DeletePropagationBackground
	zero := int64(0)
	selector := metav1.ListOptions{LabelSelector: policy.ManagedBySelector}
	for _, ns := range namespaces {
		err := b.raw.cs.BatchV1().Jobs(ns).DeleteCollection(ctx, metav1.DeleteOptions{PropagationPolicy: &prop}, selector)
		if err != nil {
			return fmt.Errorf("deleting the Jobs of the burst in %s: %w", ns, err)
		}
		err = b.raw.cs.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, selector)
		if err != nil {
			return fmt.Errorf("deleting the pods of the burst in %s: %w", ns, err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, clearTimeout)
	defer cancel()
	left, err := b.podsLeft(wctx, namespaces)
	if err != nil {
		return err
	}
	missing := 0
	for _, id := range runs {
		if _, err := b.events.waitFor(wctx, id, func(r *runEvents) bool { return !r.result.IsZero() || r.failed != "" }); err != nil {
			missing++
		}
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	b.logf("cleared the burst (%d runs in %d namespaces) in %s: %d pod(s) left, %d run(s) without a result",
		len(runs), len(namespaces), time.Since(start).Round(100*time.Millisecond), left, missing)
	return nil
}

// podsLeft waits until no managed pod is left in namespaces or ctx ends, and returns how many
// are left.
func (b *bench) podsLeft(ctx context.Context, namespaces []string) (int, error) {
	for {
		left := 0
		for _, ns := range namespaces {
			pods, err := b.raw.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: policy.ManagedBySelector})
			if err != nil {
				if ctx.Err() != nil {
					return left, nil
				}
				return left, fmt.Errorf("listing the pods in %s: %w", ns, err)
			}
			left += len(pods.Items)
		}
		if left == 0 {
			return 0, nil
		}
		select {
		case <-ctx.Done():
			return left, nil
		case <-time.After(clearPoll):
		}
	}
}
