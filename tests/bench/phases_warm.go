package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// (o): how long a Paperclip acquire takes until the lease runs commands when its company has a
// pool of warm pods (issue 17), under a sustained load: --warm-pool-samples acquires of one
// company offered open loop at --warm-pool-rate (each published on schedule, whatever the
// earlier ones are doing), each timed from just before its publish to its created event, its
// status Running/Ready and the exit of a first `true` (daemon route), then destroyed. Beside
// them, the raw pod create → Ready of (k) on the same node.
//
// The warm pools are the dispatcher's: for this phase the in-process dispatcher gives way to a
// dispatcher process (--bin) started with --warm-pool-max and the phase's company pinned to
// that minimum, so the pool is full before the load starts. One warm-up acquire (cold: it
// seeds the pool with its pod shape) comes first; then the phase waits until the pool's pods
// are Ready (--warm-pool-fill-timeout). A pool that never fills, or a dispatcher that refuses
// the flags, is reported (rows NOT MET, a note saying why), not a failed bench.
const (
	phaseWarmPool = "(o) warm pool"
	// warmGoal is issue 17's.
	warmGoal = "p50 ≤ 50 ms, p99 ≤ 200 ms at 45/s (agent-sandbox warm pool: 92 / 376 ms at 45/s)"
	// warmDispatcherReadyTimeout bounds the dispatcher process's start until /readyz answers.
	warmDispatcherReadyTimeout = 30 * time.Second
	// poolPoll is how often the pool's pods are listed while it fills.
	poolPoll = 250 * time.Millisecond
)

// warmMet is warmGoal.
func warmMet(p50, p99, _ float64) bool { return p50 <= 50 && p99 <= 200 }

func (b *bench) warmPoolPhase(ctx context.Context, rep *report, key []byte) (err error) {
	company := newID("warm-")
	ns, err := b.tenantNamespace(company)
	if err != nil {
		return err
	}
	// The raw side first, on a node without the pool's pods.
	raw, err := b.rawPodSamples(ctx, key, b.s.readySamples)
	if err != nil {
		return err
	}

	if err := b.pipe.stopWorkers(componentDispatcher); err != nil {
		return err
	}
	defer func() {
		if rerr := b.pipe.restartDispatcher(ctx); rerr != nil {
			err = errors.Join(err, fmt.Errorf("restarting the in-process dispatcher: %w", rerr))
		}
	}()
	wd, err := b.startWarmDispatcher(ctx, key, company)
	if wd != nil {
		// Once every lease is released (timePodLease waits for each released): the dispatcher
		// answers the releases.
		defer func() { err = errors.Join(err, wd.close()) }()
	}
	var notRun *warmNotRun
	if errors.As(err, &notRun) {
		rep.add(warmRows(nil, raw, b.s.warmPoolRate, 0)...)
		rep.note("(o) not measured: %s", notRun.why)
		return nil
	}
	if err != nil {
		return err
	}
	stopExec, err := b.startExecWorkers(ctx, execsvc.RouteDaemon, key, 1)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, stopExec()) }()
	c, err := b.execClient(ctx)
	if err != nil {
		return err
	}

	seed, err := b.timePodLease(ctx, c, company)
	if err != nil {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		rep.add(warmRows(nil, raw, b.s.warmPoolRate, 0)...)
		rep.note("(o) not measured: the warm-up acquire, which seeds the pool, failed: %v", err)
		return nil
	}
	if err := b.labelTenants(ctx, company); err != nil {
		return err
	}
	b.logf("(o) warm-up acquire (warm %t): ready in %s; waiting for %d warm pods Ready in %s", seed.warm, seed.ready.Round(time.Millisecond), b.s.warmPoolMax, ns)
	fill, err := b.waitPool(ctx, ns, b.s.warmPoolMax)
	if err != nil {
		return err
	}
	if fill.ready == 0 {
		rep.add(warmRows(nil, raw, b.s.warmPoolRate, 0)...)
		rep.note("(o) not measured: no warm pod of %s was Ready %s after the warm-up acquire (%d warm pod(s) seen); the dispatcher's /metrics: %s",
			ns, b.s.warmPoolFillTimeout, fill.total, wd.metrics(ctx))
		return nil
	}
	b.logf("(o) %d of %d warm pods Ready after %s; offering %d acquires at %g/s", fill.ready, b.s.warmPoolMax, fill.took.Round(time.Millisecond), b.s.warmPoolSamples, b.s.warmPoolRate)

	results := make([]warmResult, b.s.warmPoolSamples)
	published := openLoop(ctx, b.s.warmPoolSamples, b.s.warmPoolRate, func(i int) {
		lt, err := b.timePodLease(ctx, c, company)
		results[i] = warmResult{leaseTimes: lt, err: err}
	})
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	failed, firstErr := 0, error(nil)
	for i, r := range results {
		if r.err != nil {
			b.logf("(o) acquire %d failed: %v", i, r.err)
			failed++
			firstErr = cmp.Or(firstErr, r.err)
		}
	}
	if failed > 0 {
		rep.note("(o) %d of %d acquires did not reach every stage; the first: %v", failed, len(results), firstErr)
	}
	achieved := achievedRate(published)
	rep.add(warmRows(results, raw, b.s.warmPoolRate, achieved)...)
	rep.note("(o) one company, --warm-pool-max %d and --warm-pool-min pinning it to that (dispatcher process from --bin); %d of %d warm pods Ready %s after the warm-up acquire (cold, ready in %s); %d acquires offered open loop at %g/s, achieved %.1f/s (first to last publish); each lease destroyed once measured",
		b.s.warmPoolMax, fill.ready, b.s.warmPoolMax, fill.took.Round(time.Millisecond), seed.ready.Round(time.Millisecond), b.s.warmPoolSamples, b.s.warmPoolRate, achieved)
	rep.note("(o) the dispatcher's /metrics after the load: %s", wd.metrics(ctx))
	rep.note("(o) a pool refills at the pace of a pod start (2 to 3 s here): to serve every acquire at %g/s it would hold about %.0f pods (the rate × 3 s, the dispatcher's refill estimate), the node fits about 20; past the pool's %d pods the acquires are misses (the cold path), so the hits-only rows are what a warm acquire costs under this load",
		b.s.warmPoolRate, 3*b.s.warmPoolRate, b.s.warmPoolMax)
	return nil
}

// warmResult is one acquire of the load.
type warmResult struct {
	leaseTimes
	err error
}

// warmRows are (o)'s rows: every acquire, then hits and misses apart, beside the raw pod
// create → Ready; the hit rate; the offered and achieved rate. Each stage counts the acquires
// that reached it, and as failed those that did not; hit or miss is known once created came.
// Without results (the phase could not run) the goal's row is there, NOT MET, with no samples.
func warmRows(results []warmResult, raw samples, offered, achieved float64) []row {
	const rawWhat = "client-go create of the same Pod (pkg/policy.RenderPod, its Secret created first, untimed) in a tenant namespace of the bench's → Ready condition seen by a watch, as (k)"
	var ready, firstExec, created, hitReady, hitExec, missReady, missExec samples
	hits, answered := 0, 0
	for _, r := range results {
		created.add(stage(r.created, r.err))
		firstExec.add(stage(r.firstExec, r.err))
		ready.add(stage(r.ready, r.err))
		if r.created == 0 {
			continue
		}
		answered++
		stageReady, stageExec := &missReady, &missExec
		if r.warm {
			hits++
			stageReady, stageExec = &hitReady, &hitExec
		}
		stageReady.add(stage(r.ready, r.err))
		stageExec.add(stage(r.firstExec, r.err))
	}
	rows := []row{
		latencyRow(phaseWarmPool+": acquire → ready (status Running/Ready), every acquire", ready, raw, rawWhat, warmGoal, warmMet),
		latencyRow("(o) warm pool: acquire → first exec of `true` exited (daemon route), every acquire", firstExec, raw, rawWhat, warmGoal, warmMet),
		latencyRow("(o') warm pool: acquire → created, every acquire", created, samples{}, "", "", nil),
		latencyRow("(o') warm pool: acquire → ready, hits only", hitReady, raw, rawWhat, "", nil),
		latencyRow("(o') warm pool: acquire → first exec exited, hits only", hitExec, raw, rawWhat, "", nil),
		latencyRow("(o') warm pool: acquire → ready, misses only (cold path under the same load)", missReady, raw, rawWhat, "", nil),
		latencyRow("(o') warm pool: acquire → first exec exited, misses only", missExec, raw, rawWhat, "", nil),
		{Metric: "(o') warm pool: hit rate (created events saying warm, of the acquires answered)", N: answered, Unit: "%", P50: percent(hits, answered), Errors: created.errs},
		{Metric: fmt.Sprintf("(o') warm pool: achieved acquire rate, %g/s offered open loop", offered), N: len(results), Unit: "acq/s", P50: positive(achieved)},
	}
	// The goal rows: an acquire that never got there is slower than any p99 (the largest of
	// fewer than 100), and no samples is not a goal met.
	for i := range 2 {
		if rows[i].Met == nil || rows[i].Errors > 0 {
			notMet := false
			rows[i].Met = &notMet
		}
	}
	return rows
}

// stage is a stage's sample: its time when the acquire reached it, else the acquire's error.
func stage(d time.Duration, err error) (time.Duration, error) {
	if d > 0 {
		return d, nil
	}
	if err == nil {
		err = errors.New("stage not reached")
	}
	return 0, err
}

// percent is part of whole in percent, one decimal; nil when whole is 0.
func percent(part, whole int) *float64 {
	if whole == 0 {
		return nil
	}
	return round1(100 * float64(part) / float64(whole))
}

// positive is v rounded to one decimal, nil when not positive.
func positive(v float64) *float64 {
	if v <= 0 {
		return nil
	}
	return round1(v)
}

func round1(v float64) *float64 {
	r := math.Round(10*v) / 10
	return &r
}

// openLoop calls fn(i) for i in [0, n), each in its own goroutine at start + i/rate, however
// long the earlier calls take (open loop: the offered rate does not bend to the system's), and
// returns when every call has returned, with the time each call started. When ctx ends, no
// further call starts.
func openLoop(ctx context.Context, n int, rate float64, fn func(i int)) []time.Time {
	started := make([]time.Time, 0, n)
	var wg sync.WaitGroup
	begin := time.Now()
	for i := range n {
		if sleep(ctx, time.Until(begin.Add(offset(i, rate)))) != nil {
			break
		}
		started = append(started, time.Now())
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(i)
		}()
	}
	wg.Wait()
	return started
}

// offset is when the i-th call of an open loop at rate per second is due.
func offset(i int, rate float64) time.Duration {
	return time.Duration(float64(i) / rate * float64(time.Second))
}

// achievedRate is the calls per second from the first start to the last; 0 with fewer than
// two.
func achievedRate(started []time.Time) float64 {
	if len(started) < 2 {
		return 0
	}
	span := started[len(started)-1].Sub(started[0])
	if span <= 0 {
		return 0
	}
	return float64(len(started)-1) / span.Seconds()
}

// rawPodSamples times n raw pod creates → Ready (rawPodReady) in a tenant namespace the bench
// applies first, one warm-up more.
func (b *bench) rawPodSamples(ctx context.Context, key []byte, n int) (samples, error) {
	req := b.request(newID("rawwarm-"), nil)
	req.Config = podConfig()
	plan, err := lease.New(req, time.Now(), benchOperator())
	if err != nil {
		return samples{}, fmt.Errorf("planning the raw pods: %w", err)
	}
	objs, err := renderTenant(plan, b.session)
	if err != nil {
		return samples{}, err
	}
	if err := b.raw.apply(ctx, objs); err != nil {
		return samples{}, fmt.Errorf("applying the raw pods' tenant: %w", err)
	}
	var raw samples
	for i := range readyWarmup + n {
		d, err := b.rawPodReady(ctx, plan, key, nil)
		if ctx.Err() != nil {
			return raw, context.Cause(ctx)
		}
		if err != nil {
			b.logf("(o) raw sample %d failed: %v", i, err)
		}
		if i >= readyWarmup {
			raw.add(d, err)
		}
	}
	return raw, nil
}

// poolFill is what waitPool saw last.
type poolFill struct {
	total, ready int
	took         time.Duration
}

// waitPool waits until want unbound warm pods in namespace are Ready, or
// --warm-pool-fill-timeout passed, and returns what it saw last.
func (b *bench) waitPool(ctx context.Context, namespace string, want int) (poolFill, error) {
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, b.s.warmPoolFillTimeout)
	defer cancel()
	t := time.NewTicker(poolPoll)
	defer t.Stop()
	var fill poolFill
	for {
		list, err := b.raw.cs.CoreV1().Pods(namespace).List(wctx, metav1.ListOptions{LabelSelector: policy.LabelWarmPool})
		if err == nil {
			fill.total, fill.ready = unboundWarmPods(list.Items)
			fill.took = time.Since(start)
			if fill.ready >= want {
				return fill, nil
			}
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return fill, context.Cause(ctx)
			}
			return fill, nil
		case <-t.C:
		}
	}
}

// unboundWarmPods counts the warm pods among pods that no lease has bound (no run-id label)
// and that are not being deleted, and how many of them are Ready.
func unboundWarmPods(pods []corev1.Pod) (total, ready int) {
	for i := range pods {
		p := &pods[i]
		if !isUnboundWarmPod(p) || p.DeletionTimestamp != nil {
			continue
		}
		total++
		if podIsReady(p) {
			ready++
		}
	}
	return total, ready
}

// isUnboundWarmPod reports whether p is a warm pod waiting for a lease: idle, so settle may
// delete it like a stopped pod.
func isUnboundWarmPod(p *corev1.Pod) bool {
	_, warm := p.Labels[policy.LabelWarmPool]
	_, bound := p.Labels[policy.LabelRunID]
	return warm && !bound
}

// warmNotRun is why (o) could not measure: reported, not a failed bench.
type warmNotRun struct{ why string }

func (e *warmNotRun) Error() string { return e.why }

// warmDispatcher is (o)'s dispatcher process.
type warmDispatcher struct {
	env     *pipelinetest.Env
	opsAddr string
}

// startWarmDispatcher starts a dispatcher process from --bin on the bench's JetStream server,
// with the bench's sandbox key, sandboxd image and namespace prefix, warm pools of at most
// --warm-pool-max pods, company's pinned to that, and /metrics on a loopback port; and waits
// until it is ready. A process that exits first (flags it does not know, say) is a
// *warmNotRun naming its last log line.
func (b *bench) startWarmDispatcher(ctx context.Context, key []byte, company string) (*warmDispatcher, error) {
	env, err := pipelinetest.Attach(pipelinetest.Options{Name: "bench-warm"}, b.pipe.nats, b.binDir(), b.s.kubeconfig)
	if err != nil {
		if env != nil {
			err = errors.Join(err, env.Close())
		}
		return nil, fmt.Errorf("(o) attaching the dispatcher process: %w", err)
	}
	wd := &warmDispatcher{env: env}
	env.SandboxKeyFile = filepath.Join(env.Dir, "sandbox.key")
	if err := os.WriteFile(env.SandboxKeyFile, []byte(hex.EncodeToString(key)), 0o600); err != nil {
		return wd, fmt.Errorf("writing the sandbox key: %w", err)
	}
	if wd.opsAddr, err = freeLoopbackAddr(); err != nil {
		return wd, err
	}
	pool := strconv.Itoa(b.s.warmPoolMax)
	w, err := env.StartWorker(pipelinetest.Dispatcher,
		"--namespace-prefixes", namespacePrefix, "--sandboxd-image", b.s.sandboxdImage, "--ops-addr", wd.opsAddr,
		"--warm-pool-max", pool, "--warm-pool-min", company+"="+pool)
	if err != nil {
		return wd, err
	}
	wctx, cancel := context.WithTimeout(ctx, warmDispatcherReadyTimeout)
	defer cancel()
	t := time.NewTicker(poolPoll)
	defer t.Stop()
	for {
		if wd.get(wctx, "/readyz", io.Discard) == nil {
			b.logf("(o) dispatcher process ready (warm pools of %s pods; log %s)", pool, w.LogPath)
			return wd, nil
		}
		if w.Exited() {
			return wd, &warmNotRun{why: fmt.Sprintf("the dispatcher process (%s) exited at start: %s", env.Bin, lastLine(w.LogPath))}
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return wd, context.Cause(ctx)
			}
			return wd, fmt.Errorf("the dispatcher process was not ready within %s (log %s)", warmDispatcherReadyTimeout, w.LogPath)
		case <-t.C:
		}
	}
}

// close stops the dispatcher process and removes its directory (kept with
// KUBECLIP_KEEP_LOGS set, for the dispatcher's log: its took_ms per acquire).
func (wd *warmDispatcher) close() error {
	err := wd.env.Close()
	if os.Getenv(pipelinetest.KeepLogsEnv) != "" {
		return err
	}
	if rerr := os.RemoveAll(wd.env.Dir); rerr != nil {
		err = errors.Join(err, rerr)
	}
	return err
}

// get GETs path from the process's ops server into w; a status other than 200 is an error.
func (wd *warmDispatcher) get(ctx context.Context, path string, w io.Writer) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+wd.opsAddr+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

// warmMetricNames are the dispatcher's warm pool series the report quotes.
var warmMetricNames = []string{"kubeclip_warm_acquires_total", "kubeclip_warm_pods", "kubeclip_warm_pool_pods", "kubeclip_warm_pool_acquires"}

// metrics is the dispatcher's warm pool series, as its /metrics has them, or why not.
func (wd *warmDispatcher) metrics(ctx context.Context) string {
	var body strings.Builder
	if err := wd.get(ctx, "/metrics", &body); err != nil {
		return "unavailable (" + err.Error() + ")"
	}
	return warmSeries(body.String())
}

// warmSeries picks the warm pool series out of a Prometheus text exposition, "none" without.
func warmSeries(exposition string) string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(exposition))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		for _, name := range warmMetricNames {
			if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, "{") || strings.HasPrefix(rest, " ")) {
				out = append(out, line)
			}
		}
	}
	if len(out) == 0 {
		return "no " + strings.Join(warmMetricNames, " or ") + " series"
	}
	return strings.Join(out, ", ")
}

// freeLoopbackAddr is a loopback address with a port free a moment ago.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("finding a free port: %w", err)
	}
	addr := l.Addr().String()
	return addr, l.Close()
}

// lastLine is the last non-empty line of the file at path (a process's log), or why not.
func lastLine(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	return lines[len(lines)-1]
}
