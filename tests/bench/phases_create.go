package main

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// burstSettle is the pause between the raw burst and the pipeline's, so the API server's
// backlog from the first (the Job controller creating pods) is not all on the second.
const burstSettle = 3 * time.Second

// oneLine is the stub's env for runs that should end quickly: one assistant line, then exit.
func oneLine() map[string]string { return stubEnv(1, 0) }

// setup provisions the warm tenants (the pipeline's through a first acquire, whose result also
// proves the run-watcher is up; the raw scratch tenant by server-side apply) and warms both
// sides' connections and caches.
func (b *bench) setup(ctx context.Context, _ *report) error {
	if left, err := benchNamespaces(ctx, b.raw.cs); err == nil && len(left) > 0 {
		b.logf("%d namespace(s) of an earlier bench run are still there; they are deleted at the end", len(left))
	}
	b.warmCompany = newID("warm-")
	runID, took, err := b.acquire(ctx, b.warmCompany, oneLine())
	if err != nil {
		return fmt.Errorf("first acquire: %w", err)
	}
	b.logf("first acquire (cold tenant, cold caches) created in %s", took.Round(time.Millisecond))
	if err := b.labelTenants(ctx, b.warmCompany); err != nil {
		return err
	}
	wctx, cancel := b.waitCtx(ctx)
	defer cancel()
	if _, err := b.events.result(wctx, runID); err != nil {
		return fmt.Errorf("first run's result: %w", err)
	}

	b.rawWarmCompany = newID("rawwarm-")
	ro, err := render(b.request(b.rawWarmCompany, oneLine()))
	if err != nil {
		return err
	}
	objs, err := renderTenant(ro.plan, b.session)
	if err != nil {
		return err
	}
	if err := b.raw.apply(ctx, objs); err != nil {
		return fmt.Errorf("applying the raw scratch tenant: %w", err)
	}
	return b.raw.createRun(ctx, ro)
}

// warmPhase is (a): acquire → created for a company whose tenant exists, against creating the
// same Secret and Job in a scratch tenant.
func (b *bench) warmPhase(ctx context.Context, rep *report) error {
	pipe, raw, err := b.pairs(ctx, b.s.warmSamples, b.warmAcquire, b.rawWarm)
	if err != nil {
		return err
	}
	rep.Breakdown = append(rep.Breakdown, b.acquireStages(phaseWarm, b.warmRuns[b.s.warmup:])...)
	b.readFinalLogs(ctx, b.warmRuns[b.s.warmup:])
	rep.add(latencyRow("(a) acquire → created, warm tenant", pipe, raw,
		"client-go create Secret + create Job (same objects rendered by pkg/lease+pkg/policy) in a warm scratch tenant",
		"p99 ≤ 100 ms; p50 ≤ 1.5× raw",
		func(p50, p99, rawP50 float64) bool { return p99 <= 100 && p50 <= 1.5*rawP50 }))
	rep.note("(a), (b), (e): the raw Jobs are created suspended (spec.suspend), the only change to the rendered objects besides their managed-by label: the same create request, but no pods, so the node runs the pipeline's pods only")
	return nil
}

// coldPhase is (b): acquire → created for a brand-new company, against server-side applying a
// new scratch tenant's objects and creating the Secret and Job in it.
func (b *bench) coldPhase(ctx context.Context, rep *report) error {
	pipe, raw, err := b.pairs(ctx, b.s.coldSamples, b.coldAcquire, b.rawCold)
	if err != nil {
		return err
	}
	rep.Breakdown = append(rep.Breakdown, b.acquireStages(phaseCold, b.coldRuns[b.s.warmup:])...)
	b.readFinalLogs(ctx, b.coldRuns[b.s.warmup:])
	rep.add(latencyRow("(b) acquire → created, cold tenant", pipe, raw,
		"SSA of the tenant's 8 objects (in order, as the tenant-worker) + create Secret + create Job, new scratch tenant each",
		"none (informational)", nil))
	return nil
}

// pairs measures warm-up + n sample pairs, alternating which side goes first, pausing
// --pace between pairs, and returns both sides' samples without the warm-up ones.
func (b *bench) pairs(ctx context.Context, n int, pipeline, raw func(context.Context) (time.Duration, error)) (samples, samples, error) {
	var pipe, rawS samples
	type side struct {
		s       *samples
		measure func(context.Context) (time.Duration, error)
	}
	for i := range b.s.warmup + n {
		sides := []side{{&pipe, pipeline}, {&rawS, raw}}
		if i%2 == 1 {
			sides[0], sides[1] = sides[1], sides[0]
		}
		for _, s := range sides {
			d, err := s.measure(ctx)
			if ctx.Err() != nil {
				return pipe, rawS, context.Cause(ctx)
			}
			if err != nil {
				b.logf("sample %d failed: %v", i, err)
			}
			if i >= b.s.warmup {
				s.s.add(d, err)
			}
		}
		if err := sleep(ctx, b.s.pace); err != nil {
			return pipe, rawS, err
		}
	}
	return pipe, rawS, nil
}

// acquire publishes an acquire for a fresh agent of companyID and waits for its created event.
// It returns the run id and the time from just before publishing to receiving created.
func (b *bench) acquire(ctx context.Context, companyID string, env map[string]string) (string, time.Duration, error) {
	req := b.request(companyID, env)
	start := time.Now()
	b.published[req.RunID] = start
	if _, err := b.pub.Publish(ctx, req); err != nil {
		return req.RunID, 0, fmt.Errorf("publishing acquire: %w", err)
	}
	wctx, cancel := b.waitCtx(ctx)
	defer cancel()
	at, err := b.events.created(wctx, req.RunID)
	return req.RunID, at.Sub(start), err
}

func (b *bench) warmAcquire(ctx context.Context) (time.Duration, error) {
	runID, d, err := b.acquire(ctx, b.warmCompany, oneLine())
	b.warmRuns = append(b.warmRuns, runID)
	return d, err
}

func (b *bench) coldAcquire(ctx context.Context) (time.Duration, error) {
	company := newID("cold-")
	runID, d, err := b.acquire(ctx, company, oneLine())
	b.coldRuns = append(b.coldRuns, runID)
	if err != nil {
		return d, err
	}
	return d, b.labelTenants(ctx, company) // after the timed part
}

func (b *bench) rawWarm(ctx context.Context) (time.Duration, error) {
	ro, err := render(b.request(b.rawWarmCompany, oneLine()))
	if err != nil {
		return 0, err
	}
	start := time.Now()
	err = b.raw.createRun(ctx, ro)
	return time.Since(start), err
}

func (b *bench) rawCold(ctx context.Context) (time.Duration, error) {
	ro, err := render(b.request(newID("rawcold-"), oneLine()))
	if err != nil {
		return 0, err
	}
	objs, err := renderTenant(ro.plan, b.session)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := b.raw.apply(ctx, objs); err != nil {
		return time.Since(start), err
	}
	err = b.raw.createRun(ctx, ro)
	return time.Since(start), err
}

// burstPhase is (e): --burst acquisitions published as fast as possible over --burst-companies
// warm tenants, created events per second from the first publish to the last created; against
// as many raw Secret + Job creates, --raw-concurrency at a time, first to last.
func (b *bench) burstPhase(ctx context.Context, rep *report) error {
	companies, err := b.burstCompanies(ctx)
	if err != nil {
		return err
	}
	rawRate, rawLat, err := b.rawBurst(ctx)
	if err != nil {
		return err
	}
	if err := sleep(ctx, burstSettle); err != nil {
		return err
	}
	burst, err := b.pipelineBurst(ctx, companies)
	if err != nil {
		return err
	}
	b.burstRuns, b.rawBurstRate = burst.runs, rawRate
	pipeRate, pipeLat := burst.rate, burst.lat
	met := pipeRate >= burstTarget
	rep.add(row{
		Metric: fmt.Sprintf("(e) sustained acquisitions (%d at once)", b.s.burst), N: len(pipeLat.d), Unit: "acq/s",
		P50: round2(pipeRate), RawN: len(rawLat.d), RawP50: round2(rawRate), Ratio: ratio(pipeRate, rawRate),
		Raw:    fmt.Sprintf("%d client-go Secret + Job creates, %d at a time, in one warm scratch tenant: creates/s", b.s.burst, b.s.rawConcurrency),
		Target: fmt.Sprintf("≥ %d acq/s", burstTarget), Met: &met, Errors: pipeLat.errs + rawLat.errs,
	})
	rep.Breakdown = append(rep.Breakdown, b.acquireStages(phaseBurst, b.burstRuns)...)
	rep.add(latencyRow("(e') acquire → created, during the burst", pipeLat, rawLat,
		"one Secret + Job create pair during the raw burst", "none (informational)", nil))
	rep.note("(e): rate = created events / (first publish → last created event); raw = creates / (first → last). The raw client is not rate-limited client-side; the workers have the binaries' --kube-qps %v / --kube-burst %d",
		b.pipe.common.KubeQPS, b.pipe.common.KubeBurst)
	shielded := ""
	if burst.pods*5 < len(burst.runs) {
		shielded = fmt.Sprintf(": right after the raw burst's %d suspended Jobs the Job controller is still busy and creates the pipeline's pods late, so (e) measures the pipeline without the load of its own pods starting on this node ((f) has no raw burst in front of its bursts)", b.s.burst)
	}
	rep.note("(e): node CPU during the pipeline's burst %.0f%% busy (per process, %% of one core: %s); %d of its %d pods had been created before its last created event%s",
		burst.cpu, burst.procs, burst.pods, len(burst.runs), shielded)
	return b.clearBurst(ctx, burst)
}

// burstCompanies returns the warm company and --burst-companies − 1 more, made warm by one
// acquire each.
func (b *bench) burstCompanies(ctx context.Context) ([]string, error) {
	companies := []string{b.warmCompany}
	for range b.s.burstCompanies - 1 {
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

// rawBurst creates --burst rendered Secret + Job pairs with --raw-concurrency workers and
// returns the pairs per second (first create to last) and each pair's latency.
func (b *bench) rawBurst(ctx context.Context) (float64, samples, error) {
	runs := make(chan rendered, b.s.burst)
	for range b.s.burst {
		ro, err := render(b.request(b.rawWarmCompany, oneLine()))
		if err != nil {
			return 0, samples{}, err
		}
		runs <- ro
	}
	close(runs)
	var mu sync.Mutex
	var lat samples
	var wg sync.WaitGroup
	start := time.Now()
	for range b.s.rawConcurrency {
		wg.Go(func() {
			for ro := range runs {
				t := time.Now()
				err := b.raw.createRun(ctx, ro)
				mu.Lock()
				lat.add(time.Since(t), err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := context.Cause(ctx); err != nil {
		return 0, lat, err
	}
	if lat.errs > 0 {
		b.logf("raw burst: %d create(s) failed, first: %v", lat.errs, lat.firstErr)
	}
	return float64(len(lat.d)) / elapsed.Seconds(), lat, nil
}

// burstTarget is the sustained acquisitions per second (e) and (f) aim at: the anchors' target
// per cluster (agent-sandbox sustains 45 claims/s without API priority-and-fairness saturation).
const burstTarget = 50

// burstResult is one pipeline burst: its companies and runs, created events per second from
// the first publish to the last created, and each run's publish → created latency.
type burstResult struct {
	companies []string
	runs      []string
	rate      float64
	lat       samples
	// cpu is the node's CPU use from the first publish to the last created event, in percent
	// of all cores (-1: unknown).
	cpu float64
	// pods is how many of the burst's pods existed before its last created event: the load
	// of starting them competes with the burst on a single node.
	pods int
	// postJobs are the dispatchers' POST jobs requests during the burst.
	postJobs samples
	// procs is the CPU of the bench and of the node's processes during the burst, in percent
	// of one core each (procShares).
	procs string
}

// pipelineBurst publishes --burst acquires for fresh agents, round robin over companies, one
// after the other as fast as the stream acknowledges them, then waits for every created (or
// failed) event.
func (b *bench) pipelineBurst(ctx context.Context, companies []string) (burstResult, error) {
	res := burstResult{companies: companies, runs: make([]string, 0, b.s.burst)}
	cpuBefore, procsBefore := readCPU(), readNodeCPU()
	start := time.Now()
	for i := range b.s.burst {
		req := b.request(companies[i%len(companies)], oneLine())
		b.published[req.RunID] = time.Now()
		if _, err := b.pub.Publish(ctx, req); err != nil {
			return res, fmt.Errorf("publishing acquire %d: %w", i, err)
		}
		res.runs = append(res.runs, req.RunID)
	}
	b.logf("burst: %d acquires published in %s", b.s.burst, time.Since(start).Round(time.Millisecond))
	wctx, cancel := b.waitCtx(ctx)
	defer cancel()
	last, created, failed, err := b.events.countCreated(wctx, res.runs)
	if err != nil {
		return res, err
	}
	res.cpu, res.procs = nodeBusy(cpuBefore, readCPU()), procShares(procsBefore, readNodeCPU())
	res.pods = b.pods.seenBefore(res.runs, last)
	res.postJobs = b.stats.combined("API", componentDispatcher, "POST jobs")
	for _, id := range res.runs {
		ev := b.events.snapshot(id)
		if ev.created.IsZero() {
			res.lat.add(0, fmt.Errorf("run %s: %s", id, ev.failed))
			continue
		}
		res.lat.add(ev.created.Sub(b.published[id]), nil)
	}
	if failed > 0 {
		b.logf("burst: %d acquire(s) failed, first: %v", failed, res.lat.firstErr)
	}
	if created > 0 {
		res.rate = float64(created) / last.Sub(start).Seconds()
	}
	return res, nil
}
