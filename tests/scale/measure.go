package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/runwatch"
)

// namespacePrefix starts every tenant namespace of the bench.
const namespacePrefix = "kcscale-"

// workerKinds are the workers the bench runs and measures, one process each.
var workerKinds = []string{pipelinetest.TenantWorker, pipelinetest.Dispatcher, pipelinetest.RunWatcher}

// sizeResult is one size's figures. Per-lease figures divide by Leases.
type sizeResult struct {
	Leases       int     `json:"leases"`
	Backend      string  `json:"backend"`
	Companies    int     `json:"companies"`
	LoadStart    string  `json:"loadavgStart"`
	LoadEnd      string  `json:"loadavgEnd"`
	OfferedRate  float64 `json:"offeredAcqPerSec"`
	AchievedRate float64 `json:"achievedAcqPerSec"`
	// CreatedP50Ms and CreatedP99Ms are acquire published → created received at OfferedRate.
	CreatedP50Ms float64 `json:"createdP50Ms"`
	CreatedP99Ms float64 `json:"createdP99Ms"`
	CreatedMaxMs float64 `json:"createdMaxMs"`
	// AllReadySec is the first paced publish → every lease live: a pod lease's Ready status
	// received; a Job lease's Running status and its whole log.
	AllReadySec    float64 `json:"allReadySec"`
	SaturationRate float64 `json:"saturationAcqPerSec"`
	SaturationP99  float64 `json:"saturationP99Ms"`
	// Workers: RSS at start and with every lease live; CPU per acquire during the drive; idle
	// CPU per live lease over the steady window.
	Workers map[string]workerCost `json:"workers"`
	// Consumers is the sum of every stream's consumers, with the size live (the bench's own
	// ordered consumer included).
	Consumers            int               `json:"consumers"`
	StreamBytes          map[string]uint64 `json:"streamBytes"`
	RunStreamBytesPerRun float64           `json:"runStreamBytesPerRun"`
	APIDrivePerSec       float64           `json:"apiRequestsPerSecDrive"`
	APISteadyPerSec      float64           `json:"apiRequestsPerSecSteady"`
	APIDrive             apiCounts         `json:"apiRequestsDrive"`
	APISteady            apiCounts         `json:"apiRequestsSteady"`
	// APIDriveMeanMs is each verb's mean request time during the drive, through the proxy.
	APIDriveMeanMs  map[string]float64 `json:"apiDriveMeanMs"`
	RestartReadySec map[string]float64 `json:"restartReadySec"`
	// DispatchSteps is where the dispatcher's time went per acquire of the drive (its "run
	// created" records), by step.
	DispatchSteps map[string]stepFigures `json:"dispatchSteps"`
	// ReconcileSec and ReconcileWorkloads are the restarted dispatcher's first orphan
	// reconcile pass, with every lease live; ReconcilePeakMiB is its peak RSS (VmHWM) after it.
	ReconcileSec       float64 `json:"reconcileSec"`
	ReconcileWorkloads int     `json:"reconcileWorkloads"`
	ReconcilePeakMiB   float64 `json:"reconcilePeakMiB"`
	// RunWatcherAdoptSec is a restarted run-watcher's start → every live run owned by it.
	RunWatcherAdoptSec float64 `json:"runWatcherAdoptSec"`
	ReplayEvents       int     `json:"replayEvents"`
	ReplayPerSec       float64 `json:"replayEventsPerSec"`
	Lost               int     `json:"lost"`
	Doubled            int     `json:"doubled"`
	Ended              int     `json:"ended"`
	FirstEnded         string  `json:"firstEnded,omitempty"`
	DurationSec        float64 `json:"durationSec"`
	// LogRequests is the container log requests the fleet's kubelet port answered during the
	// size (the job backend's followers, reconnects and final reads); LogStreamsLive the follow
	// streams open at the end of the steady window.
	LogRequests    int64 `json:"logRequests"`
	LogStreamsLive int64 `json:"logStreamsLive"`
	// LogWrong counts the job backend's runs (those live before the restarts) whose stored log
	// is not agentLog once and in order at the end; FirstLogWrong shows one.
	LogWrong      int    `json:"logWrong"`
	FirstLogWrong string `json:"firstLogWrong,omitempty"`
	Error         string `json:"error,omitempty"`
}

// workerCost is one worker's resource use.
type workerCost struct {
	RSSStartMiB       float64 `json:"rssStartMiB"`
	RSSLiveMiB        float64 `json:"rssLiveMiB"`
	RSSPerLeaseKiB    float64 `json:"rssPerLeaseKiB"`
	CPUPerAcquireMs   float64 `json:"cpuPerAcquireMs"`
	IdleCPUPerLeaseUs float64 `json:"idleCpuPerLeaseUsPerSec"`
}

// measureSize runs n leases of backend through fresh workers and measures them. logs is the
// fleet's kubelet log server (nil without the job backend).
func measureSize(ctx context.Context, s settings, backend string, n int, proxy *apiProxy, proxyKubeconfig string, logs *logServer, logDir string, logf func(string, ...any)) (res sizeResult, err error) {
	begin := time.Now()
	res = sizeResult{Leases: n, Backend: backend, OfferedRate: s.rate, LoadStart: loadAvg(), Workers: map[string]workerCost{}, RestartReadySec: map[string]float64{}}
	var logRequests0 int64
	if logs != nil {
		logRequests0, _ = logs.counts()
	}
	defer func() {
		res.LoadEnd, res.DurationSec = loadAvg(), round(time.Since(begin).Seconds())
		if logs != nil {
			opened, _ := logs.counts()
			res.LogRequests = opened - logRequests0
		}
		if err != nil {
			res.Error = err.Error()
		}
	}()
	companies := (n + s.perCompany - 1) / s.perCompany
	res.Companies = companies
	quota := s.perCompany + s.burst + 10
	tenancy := []string{
		"--log-level", "info", "--namespace-prefixes", namespacePrefix, "--default-runtime-class", runtimeClass,
		"--tenant-quota", fmt.Sprintf("pods=%d,requests.cpu=%d,requests.memory=%dGi,limits.cpu=%d,limits.memory=%dGi,requests.ephemeral-storage=%dGi,limits.ephemeral-storage=%dGi",
			quota, quota, quota, quota, quota, 100*quota, 100*quota),
	}
	ports := map[string]string{}
	args := map[string][]string{}
	for _, kind := range workerKinds {
		port, err := freePort()
		if err != nil {
			return res, err
		}
		ports[kind] = port
		args[kind] = []string{"--log-level", "info", "--ops-addr", "127.0.0.1:" + port}
	}
	args[pipelinetest.TenantWorker] = append(args[pipelinetest.TenantWorker], tenancy...)
	args[pipelinetest.Dispatcher] = append(args[pipelinetest.Dispatcher], tenancy...)
	if s.dispatchConcurrency > 0 {
		args[pipelinetest.Dispatcher] = append(args[pipelinetest.Dispatcher], "--concurrency", strconv.Itoa(s.dispatchConcurrency))
	}
	// The workers reach the API server through the counting proxy.
	os.Setenv(clustertest.KubeconfigEnv, proxyKubeconfig)
	env, err := pipelinetest.Setup(ctx, pipelinetest.Options{Name: "scale", Args: args})
	if err != nil {
		if env != nil {
			env.DumpLogs()
		}
		return res, err
	}
	defer func() {
		if cerr := env.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		copyLogs(env.LogDir, logDir, n)
		_ = os.RemoveAll(env.Dir)
	}()
	for _, kind := range workerKinds {
		if _, err := waitReadyz(ctx, ports[kind], time.Minute); err != nil {
			return res, fmt.Errorf("%s: %w", kind, err)
		}
	}
	start := map[string]procSample{}
	for _, kind := range workerKinds {
		if start[kind], err = readProc(env.Workers(kind)[0].Pid()); err != nil {
			return res, err
		}
	}
	r, err := watchRuns(ctx, env.JS, env.Subjects)
	if err != nil {
		return res, err
	}
	pub, err := events.NewPublisher(events.PublisherOptions{JS: env.JS, Subjects: env.Subjects})
	if err != nil {
		return res, err
	}
	companyIDs := make([]string, companies)
	for i := range companyIDs {
		companyIDs[i] = fmt.Sprintf("scale-%d-c%d", n, i)
	}
	publish := func(i int, company string) (string, error) {
		req := events.AcquireRequest{
			RunID: fmt.Sprintf("run-%d-%d", n, i), CompanyID: company, EnvironmentID: "scale",
			AgentID: fmt.Sprintf("agent-%d-%d", n, i), Config: leaseConfig(backend),
		}
		r.published(req.RunID, time.Now())
		_, err := pub.Publish(ctx, req)
		return req.RunID, err
	}

	// Each company's first acquire provisions its tenant: not counted in the latencies.
	var all, warm []string
	for i, c := range companyIDs {
		id, err := publish(i, c)
		if err != nil {
			return res, fmt.Errorf("publishing acquire: %w", err)
		}
		warm = append(warm, id)
	}
	if _, err := r.waitFor(ctx, warm, 2*time.Minute, func(t tally) bool { return t.created+t.ended == len(warm) }); err != nil {
		return res, fmt.Errorf("provisioning the tenants: %w", err)
	}
	all = append(all, warm...)
	logf("%d tenants provisioned; driving %d acquires at %.0f/s", companies, n-companies, s.rate)

	// The drive: the other n − companies acquires at the offered rate.
	cpu0 := readAll(env)
	api0, took0 := proxy.snapshot(), proxy.snapshotTook()
	driveStart := time.Now()
	var paced []string
	for i := companies; i < n; i++ {
		at := driveStart.Add(time.Duration(float64(i-companies) / s.rate * float64(time.Second)))
		if d := time.Until(at); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				return res, context.Cause(ctx)
			}
		}
		id, err := publish(i, companyIDs[i%companies])
		if err != nil {
			return res, fmt.Errorf("publishing acquire %d: %w", i, err)
		}
		paced = append(paced, id)
	}
	all = append(all, paced...)
	// A wait gives up when nothing moved for this long (waitFor): a stuck pipeline, not a slow one.
	patience := max(5*time.Minute, time.Duration(n/10)*time.Second)
	t, err := r.waitFor(ctx, paced, patience, func(t tally) bool { return t.created+t.ended == len(paced) })
	if err != nil {
		return res, fmt.Errorf("the drive: %w", err)
	}
	if len(paced) > 0 {
		res.AchievedRate = round(float64(len(paced)) / t.lastCreated.Sub(driveStart).Seconds())
	}
	res.APIDrive = proxy.snapshot().since(api0)
	res.APIDriveMeanMs = proxy.meanMs(api0, took0)
	res.APIDrivePerSec = round(float64(res.APIDrive.total()) / time.Since(driveStart).Seconds())
	cpu1 := readAll(env)
	if res.DispatchSteps, err = acquireSteps(env.Workers(pipelinetest.Dispatcher)[0].LogPath, paced); err != nil {
		return res, err
	}
	lat := r.latencies(paced)
	res.CreatedP50Ms, res.CreatedP99Ms, res.CreatedMaxMs = percentile(lat, 50), percentile(lat, 99), percentile(lat, 100)
	logf("drive: %d created, p50 %.1f ms, p99 %.1f ms; waiting for every lease live", t.created, res.CreatedP50Ms, res.CreatedP99Ms)
	// A pod lease is live once Ready (it accepts exec); a Job lease has no Ready: once Running,
	// with its whole log stored (or a wrong one, which the check below reports).
	allLive := func(t tally) bool { return t.ready+t.ended == len(all) }
	if backend == "job" {
		allLive = func(t tally) bool { return t.running+t.ended == len(all) && t.logged+t.logWrong+t.ended >= len(all) }
	}
	t, err = r.waitFor(ctx, all, patience, allLive)
	if err != nil {
		return res, fmt.Errorf("waiting for every lease live: %w", err)
	}
	res.AllReadySec = round(time.Since(driveStart).Seconds())

	// The steady window: every lease live, nothing asked of the workers.
	api1 := proxy.snapshot()
	steady0 := readAll(env)
	if err := sleep(ctx, s.steady); err != nil {
		return res, err
	}
	steady1 := readAll(env)
	if logs != nil {
		_, res.LogStreamsLive = logs.counts()
	}
	res.APISteady = proxy.snapshot().since(api1)
	res.APISteadyPerSec = round(float64(res.APISteady.total()) / s.steady.Seconds())
	for _, kind := range workerKinds {
		res.Workers[kind] = workerCost{
			RSSStartMiB:       round(float64(start[kind].rss) / (1 << 20)),
			RSSLiveMiB:        round(float64(steady1[kind].rss) / (1 << 20)),
			RSSPerLeaseKiB:    round(float64(steady1[kind].rss-start[kind].rss) / 1024 / float64(n)),
			CPUPerAcquireMs:   round(float64((cpu1[kind].cpu - cpu0[kind].cpu).Microseconds()) / 1000 / float64(max(1, len(paced)))),
			IdleCPUPerLeaseUs: round(float64((steady1[kind].cpu - steady0[kind].cpu).Microseconds()) / s.steady.Seconds() / float64(n)),
		}
	}
	if err := streamFigures(ctx, env.JS, env.Subjects, n, &res); err != nil {
		return res, err
	}
	logf("live: run-watcher %.1f MiB, dispatcher %.1f MiB; %d consumers; API %.1f req/s idle",
		res.Workers[pipelinetest.RunWatcher].RSSLiveMiB, res.Workers[pipelinetest.Dispatcher].RSSLiveMiB, res.Consumers, res.APISteadyPerSec)

	// Restarts with every lease live. A run that ended (none should) has no owner to adopt.
	live := len(all) - r.tally(all).ended
	for _, kind := range workerKinds {
		old := env.Workers(kind)[0]
		if err := old.Stop(); err != nil {
			return res, fmt.Errorf("stopping %s: %w", old.ID, err)
		}
		var adopt func() (float64, error)
		restarted := time.Now()
		w, err := env.StartWorker(kind)
		if err != nil {
			return res, err
		}
		if kind == pipelinetest.RunWatcher {
			adopt, err = watchAdoption(ctx, env.JS, w.ID, live, restarted)
			if err != nil {
				return res, err
			}
		}
		took, err := waitReadyz(ctx, ports[kind], 2*time.Minute)
		if err != nil {
			return res, fmt.Errorf("restarted %s: %w", kind, err)
		}
		res.RestartReadySec[kind] = round(took.Seconds())
		if kind == pipelinetest.Dispatcher {
			seen, took, err := reconcilePass(ctx, w.LogPath, 5*time.Minute)
			if err != nil {
				return res, err
			}
			after, err := readProc(w.Pid())
			if err != nil {
				return res, err
			}
			res.ReconcileWorkloads, res.ReconcileSec, res.ReconcilePeakMiB = seen, round(took.Seconds()), round(float64(after.hwm)/(1<<20))
			logf("dispatcher reconcile pass: %d workloads in %.2f s, peak RSS %.1f MiB", seen, took.Seconds(), res.ReconcilePeakMiB)
		}
		if adopt != nil {
			if res.RunWatcherAdoptSec, err = adopt(); err != nil {
				return res, err
			}
		}
		logf("%s restarted: ready in %.2f s", kind, took.Seconds())
	}

	// Saturation: --burst acquires at once, with every lease live.
	liveBefore := slices.Clone(all)
	var burst []string
	burstStart := time.Now()
	for i := range s.burst {
		id, err := publish(n+i, companyIDs[i%companies])
		if err != nil {
			return res, fmt.Errorf("publishing burst acquire %d: %w", i, err)
		}
		burst = append(burst, id)
	}
	t, err = r.waitFor(ctx, burst, 5*time.Minute, func(t tally) bool { return t.created+t.ended == len(burst) })
	if err != nil {
		return res, fmt.Errorf("the burst: %w", err)
	}
	res.SaturationRate = round(float64(t.created) / t.lastCreated.Sub(burstStart).Seconds())
	res.SaturationP99 = percentile(r.latencies(burst), 99)
	all = append(all, burst...)

	if res.ReplayEvents, res.ReplayPerSec, err = replay(ctx, env.JS, env.Subjects); err != nil {
		return res, err
	}
	final := r.tally(all)
	res.Lost, res.Doubled, res.Ended, res.FirstEnded = len(all)-final.created-final.ended, final.doubled, final.ended, final.firstEnded
	if backend == "job" {
		// The runs that were live through the restarts: each log once and in order (the
		// restarted run-watcher resumed every follower without repeating a line), none missing.
		lt := r.tally(liveBefore)
		res.LogWrong, res.FirstLogWrong = len(liveBefore)-lt.ended-lt.logged, lt.firstLogWrong
	}
	logf("%d %s leases: lost %d, doubled %d, ended %d, wrong logs %d; replay %.0f events/s", n, backend, res.Lost, res.Doubled, res.Ended, res.LogWrong, res.ReplayPerSec)
	return res, nil
}

// leaseConfig is every lease's config: a lease of backend (pod: exec-capable; job: the agent's
// own container, whose log the run-watcher follows) of the stub image (never run: kwok only
// pretends) with the e2e tests' resources.
func leaseConfig(backend string) json.RawMessage {
	data, _ := json.Marshal(map[string]any{
		"namespacePrefix": namespacePrefix, "backend": backend, "podActivityDeadlineSec": 3600,
		"adapters": []any{map[string]any{"adapterType": "claude_local", "runtimeImage": "kubeclip.local/agent-stub:dev"}},
		"defaultResources": map[string]any{
			"requests": map[string]string{"cpu": "100m", "memory": "128Mi"},
			"limits":   map[string]string{"cpu": "500m", "memory": "256Mi"},
		},
	})
	return data
}

func readAll(env *pipelinetest.Env) map[string]procSample {
	out := map[string]procSample{}
	for _, kind := range workerKinds {
		if ws := env.Workers(kind); len(ws) > 0 {
			out[kind], _ = readProc(ws[0].Pid())
		}
	}
	return out
}

// streamFigures fills in the consumers and stream bytes.
func streamFigures(ctx context.Context, js jetstream.JetStream, s events.Subjects, n int, res *sizeResult) error {
	res.StreamBytes = map[string]uint64{}
	lister := js.ListStreams(ctx)
	for info := range lister.Info() {
		res.Consumers += info.State.Consumers
		res.StreamBytes[info.Config.Name] = info.State.Bytes
		if info.Config.Name == s.RunStream() {
			res.RunStreamBytesPerRun = round(float64(info.State.Bytes) / float64(n))
		}
	}
	return lister.Err()
}

// watchAdoption follows the ownership bucket from now; the returned wait blocks until n runs
// are owned by replica and returns the time from since.
func watchAdoption(ctx context.Context, js jetstream.JetStream, replica string, n int, since time.Time) (func() (float64, error), error) {
	kv, err := js.KeyValue(ctx, runwatch.OwnershipBucket)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	w, err := kv.WatchAll(wctx)
	if err != nil {
		cancel()
		return nil, err
	}
	return func() (float64, error) {
		defer cancel()
		defer func() { _ = w.Stop() }()
		owner := map[string]string{}
		owned := 0
		for e := range w.Updates() {
			if e == nil {
				continue // the end of the initial values
			}
			was := owner[e.Key()] == replica
			if e.Operation() == jetstream.KeyValuePut {
				owner[e.Key()] = string(e.Value())
			} else {
				delete(owner, e.Key())
			}
			now := owner[e.Key()] == replica
			switch {
			case now && !was:
				owned++
			case was && !now:
				owned--
			}
			if owned >= n {
				return round(time.Since(since).Seconds()), nil
			}
		}
		return 0, fmt.Errorf("the restarted run-watcher owned %d of %d runs after 5 minutes", owned, n)
	}, nil
}

// replay reads the whole run stream with one ordered consumer and returns events and events/s.
func replay(ctx context.Context, js jetstream.JetStream, s events.Subjects) (int, float64, error) {
	stream, err := js.Stream(ctx, s.RunStream())
	if err != nil {
		return 0, 0, err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, 0, err
	}
	total := info.State.Msgs
	cons, err := js.OrderedConsumer(ctx, s.RunStream(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{s.RunAll()}})
	if err != nil {
		return 0, 0, err
	}
	it, err := cons.Messages()
	if err != nil {
		return 0, 0, err
	}
	defer it.Stop()
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	n := 0
	for uint64(n) < total {
		m, err := it.Next(jetstream.NextContext(rctx))
		if err != nil {
			return n, 0, fmt.Errorf("replay stopped after %d of %d events: %w", n, total, err)
		}
		if _, err := s.DecodeRunEvent(m.Subject(), m.Data()); err != nil {
			return n, 0, fmt.Errorf("replay: decoding %s: %w", m.Subject(), err)
		}
		n++
	}
	return n, round(float64(n) / time.Since(start).Seconds()), nil
}

// waitReadyz polls a worker's /readyz until it answers 200 and returns how long that took.
func waitReadyz(ctx context.Context, port string, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	client := &http.Client{Timeout: time.Second}
	for {
		resp, err := client.Get("http://127.0.0.1:" + port + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(start), nil
			}
		}
		if time.Since(start) > timeout {
			if err != nil {
				return 0, fmt.Errorf("not ready after %s (last: %w)", timeout, err)
			}
			return 0, fmt.Errorf("not ready after %s", timeout)
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	_, port, err := net.SplitHostPort(ln.Addr().String())
	return port, err
}

// deleteTenants deletes every bench tenant namespace and waits until they are gone. Their Jobs
// go first (or the Job controller makes new pods for them), then their pods, at once and with no
// grace period: nothing runs in them, and kwok's pod-delete stage finalizes a gracefully deleted
// pod at about 15 pods/s on this machine (1,000 took 70 s).
func deleteTenants(ctx context.Context, cs kubernetes.Interface, logf func(string, ...any)) error {
	deadline := time.Now().Add(15 * time.Minute)
	announced := false
	for {
		list, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			return fmt.Errorf("listing namespaces: %w", err)
		}
		var left []string
		for _, ns := range list.Items {
			if strings.HasPrefix(ns.Name, namespacePrefix) {
				left = append(left, ns.Name)
				if ns.DeletionTimestamp == nil {
					err := cs.BatchV1().Jobs(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{PropagationPolicy: ptr(metav1.DeletePropagationBackground)}, metav1.ListOptions{})
					if err != nil && !apierrors.IsNotFound(err) {
						return fmt.Errorf("deleting the Jobs of %s: %w", ns.Name, err)
					}
					err = cs.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}, metav1.ListOptions{})
					if err != nil && !apierrors.IsNotFound(err) {
						return fmt.Errorf("deleting the pods of %s: %w", ns.Name, err)
					}
					if err := cs.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
						return fmt.Errorf("deleting namespace %s: %w", ns.Name, err)
					}
				}
			}
		}
		if len(left) == 0 {
			return nil
		}
		if !announced {
			logf("deleting %d tenant namespace(s): %s", len(left), strings.Join(left, ", "))
			announced = true
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("tenant namespaces still there after 15 minutes: %s", strings.Join(left, ", "))
		}
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
}

// copyLogs keeps the workers' logs of size n in dir.
func copyLogs(from, dir string, n int) {
	entries, _ := os.ReadDir(from)
	for _, e := range entries {
		if data, err := os.ReadFile(from + "/" + e.Name()); err == nil {
			_ = os.WriteFile(fmt.Sprintf("%s/%d-%s", dir, n, e.Name()), data, 0o644)
		}
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// percentile is the p-th percentile (nearest rank) of ms, 0 for none.
func percentile(ms []float64, p float64) float64 {
	if len(ms) == 0 {
		return 0
	}
	s := slices.Clone(ms)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return round(s[min(max(i, 0), len(s)-1)])
}

func round(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }

func ptr[T any](v T) *T { return &v }
