package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/pkg/dispatch"
)

const summary = `bench runs kubeclip's pipeline (embedded JetStream + tenant-worker, dispatcher, run-watcher in
process) against a Kubernetes cluster and prints p50/p99 of each stage next to the raw Kubernetes
primitive it rides on; (g) runs run-watcher processes from --bin against the same JetStream. It
deletes every namespace it creates.`

// settings are the bench's knobs; every one has a flag and an environment variable.
type settings struct {
	kubeconfig string
	out        string
	workerLog  string

	warmSamples int
	coldSamples int
	warmup      int
	pace        time.Duration

	logRuns     int
	logLines    int
	logInterval time.Duration
	logSkip     int

	burst          int
	burstCompanies int
	rawConcurrency int

	dispatchers   int
	replicaRounds int

	bin              string
	takeoverKills    int
	takeoverReplicas int
	ownershipTTL     time.Duration
	takeoverInterval time.Duration

	replayLines  int
	replayRounds int

	execCPULimit string

	pollAgents   int
	pollInterval time.Duration
	pollWindow   time.Duration
	pollInflight int
	readySamples int
	streamBytes  int
	streamRounds int

	reuseLeases           int
	reuseLiveResumes      int
	reuseSuspendedResumes int

	warmPoolMax         int
	warmPoolRate        float64
	warmPoolSamples     int
	warmPoolFillTimeout time.Duration

	brokerCalls        int
	brokerWarmup       int
	brokerFirstBytes   int
	brokerStreams      string
	brokerStreamLevels []int // brokerStreams parsed, ascending
	brokerOpeners      int

	phases string

	sandboxdImage string

	waitTimeout    time.Duration
	cleanupTimeout time.Duration
	settleTimeout  time.Duration
}

func parseSettings(args []string, lookupEnv config.LookupEnv, stdout io.Writer) (settings, error) {
	var s settings
	fs := config.New("bench", lookupEnv)
	fs.String(&s.kubeconfig, "kubeconfig", "KUBECLIP_KUBECONFIG", "", "kubeconfig of the cluster to run against (required)")
	fs.String(&s.out, "out", "KUBECLIP_BENCH_OUT", "bench-results.json", "where the results table is written as JSON")
	fs.String(&s.workerLog, "worker-log", "KUBECLIP_BENCH_WORKER_LOG", "", "file for the workers' logs (info level); empty keeps them in a temporary file removed at exit")
	fs.Int(&s.warmSamples, "warm-samples", "KUBECLIP_BENCH_WARM_SAMPLES", 100, "(a) warm-tenant acquisitions measured, and as many raw creates")
	fs.Int(&s.coldSamples, "cold-samples", "KUBECLIP_BENCH_COLD_SAMPLES", 60, "(b) cold-tenant acquisitions measured, and as many raw tenant applies")
	fs.Int(&s.warmup, "warmup", "KUBECLIP_BENCH_WARMUP", 3, "samples of (a) and (b) discarded first (connections, caches)")
	fs.Duration(&s.pace, "pace", "KUBECLIP_BENCH_PACE", 250*time.Millisecond, "pause between two sample pairs of (a) and (b), so the pods they start do not swamp the node")
	fs.Int(&s.logRuns, "log-runs", "KUBECLIP_BENCH_LOG_RUNS", 4, "(d) concurrent runs printing lines")
	fs.Int(&s.logLines, "log-lines", "KUBECLIP_BENCH_LOG_LINES", 30, "(d) lines each run prints")
	fs.Duration(&s.logInterval, "log-interval", "KUBECLIP_BENCH_LOG_INTERVAL", 200*time.Millisecond, "(d) pause between two lines")
	fs.Int(&s.logSkip, "log-skip", "KUBECLIP_BENCH_LOG_SKIP", 5, "(d) first lines of each run not measured (both streams are still attaching)")
	fs.Int(&s.burst, "burst", "KUBECLIP_BENCH_BURST", 200, "(e), (f) acquisitions published at once in a burst")
	fs.Int(&s.burstCompanies, "burst-companies", "KUBECLIP_BENCH_BURST_COMPANIES", 2, "(e), (f) warm companies a burst is spread over (each tenant's quota admits 20 pods)")
	fs.Int(&s.rawConcurrency, "raw-concurrency", "KUBECLIP_BENCH_RAW_CONCURRENCY", 16, "(e) concurrent raw creates (the dispatcher's default concurrency)")
	fs.Int(&s.dispatchers, "dispatchers", "KUBECLIP_BENCH_DISPATCHERS", 3, "(f) dispatcher replicas of the second burst (the first has one), each with its own NATS connection and Kubernetes clients")
	fs.Int(&s.replicaRounds, "replica-rounds", "KUBECLIP_BENCH_REPLICA_ROUNDS", 2, "(f) bursts of each kind, alternating (1, n, n, 1, ...); the mean rate is reported")
	fs.String(&s.bin, "bin", "KUBECLIP_BIN", "bin", "(g) directory of the worker binaries (make bench builds them there); without a run-watcher in it they are built into a temporary directory")
	fs.Int(&s.takeoverKills, "takeover-kills", "KUBECLIP_BENCH_TAKEOVER_KILLS", 20, "(g) SIGKILLs of the run-watcher process owning a streaming run")
	fs.Int(&s.takeoverReplicas, "takeover-replicas", "KUBECLIP_BENCH_TAKEOVER_REPLICAS", 3, "(g) run-watcher processes (a replacement is started after each kill)")
	fs.Duration(&s.ownershipTTL, "ownership-ttl", "KUBECLIP_BENCH_OWNERSHIP_TTL", 3*time.Second, "(g) the run-watcher processes' --ownership-ttl; the target is takeover p99 ≤ twice it")
	fs.Duration(&s.takeoverInterval, "takeover-interval", "KUBECLIP_BENCH_TAKEOVER_INTERVAL", 100*time.Millisecond, "(g) pause between two lines of the streaming runs")
	fs.Int(&s.replayLines, "replay-lines", "KUBECLIP_BENCH_REPLAY_LINES", 100_000, "(h) log lines of each synthetic run replayed")
	fs.Int(&s.replayRounds, "replay-rounds", "KUBECLIP_BENCH_REPLAY_ROUNDS", 3, "(h) replays of each synthetic run (and as many raw reads); the median is reported")
	fs.String(&s.execCPULimit, "exec-cpu-limit", "KUBECLIP_BENCH_EXEC_CPU_LIMIT", "500m", "(i) the exec pod's CPU limit (its config's defaultResources.limits.cpu, as the other pod leases' 500m): 300 back-to-back execs of `true` use about half a core in the pod")
	fs.Int(&s.pollAgents, "poll-agents", "KUBECLIP_BENCH_POLL_AGENTS", 50, "(j) agents polling like Paperclip's bridge, each on a pod lease of its own company as far as the node's free CPU admits them (the rest share those round-robin)")
	fs.Duration(&s.pollInterval, "poll-interval", "KUBECLIP_BENCH_POLL_INTERVAL", 116*time.Millisecond, "(j) an agent's bridge poll cadence, start to start (Paperclip's, contract §3.3)")
	fs.Duration(&s.pollWindow, "poll-window", "KUBECLIP_BENCH_POLL_WINDOW", 15*time.Second, "(j) length of each measured window (raw, daemon and kube-exec route; at the cadence and saturating)")
	fs.Int(&s.pollInflight, "poll-inflight", "KUBECLIP_BENCH_POLL_INFLIGHT", 4, "(j) polls in flight per lease, back to back, in the saturating windows")
	fs.Int(&s.readySamples, "ready-samples", "KUBECLIP_BENCH_READY_SAMPLES", 6, "(k) cold pod leases measured, and as many raw pod creates (one warm-up pair more); (o) raw pod creates measured beside the warm pool")
	fs.Int(&s.streamBytes, "stream-bytes", "KUBECLIP_BENCH_STREAM_BYTES", 64<<20, "(l) bytes sent through stdin, and received from stdout, per transfer")
	fs.Int(&s.streamRounds, "stream-rounds", "KUBECLIP_BENCH_STREAM_ROUNDS", 3, "(l) transfers each way per route (and raw); the median is reported")
	fs.Int(&s.reuseLeases, "reuse-leases", "KUBECLIP_BENCH_REUSE_LEASES", 2, "(n) reusable leases acquired (after a warm-up lease), each measured through its resumes, and as many raw fresh claims")
	fs.Int(&s.reuseLiveResumes, "reuse-live-resumes", "KUBECLIP_BENCH_REUSE_LIVE_RESUMES", 10, "(n) releases and resumes of each lease while its pod is live, and as many raw GETs of the pod")
	fs.Int(&s.reuseSuspendedResumes, "reuse-suspended-resumes", "KUBECLIP_BENCH_REUSE_SUSPENDED_RESUMES", 2, "(n) suspensions (release with cancelActiveWork) and resumes of each lease, and as many raw pod creates on a bound claim")
	fs.Int(&s.warmPoolMax, "warm-pool-max", "KUBECLIP_BENCH_WARM_POOL_MAX", 12, "(o) the warm dispatcher's --warm-pool-max, and its pinned --warm-pool-min for the phase's company: the warm pods the pool holds (the local node fits about 20 pods)")
	fs.Float(&s.warmPoolRate, "warm-pool-rate", "KUBECLIP_BENCH_WARM_POOL_RATE", 45, "(o) acquires offered per second, open loop (each on schedule, whatever the earlier ones are doing)")
	fs.Int(&s.warmPoolSamples, "warm-pool-samples", "KUBECLIP_BENCH_WARM_POOL_SAMPLES", 60, "(o) acquires offered at --warm-pool-rate once the pool is full, each measured and released")
	fs.Duration(&s.warmPoolFillTimeout, "warm-pool-fill-timeout", "KUBECLIP_BENCH_WARM_POOL_FILL_TIMEOUT", 3*time.Minute, "(o) longest wait for the pool's warm pods to be Ready after the warm-up acquire; with none Ready then, the phase reports why and measures nothing")
	fs.Int(&s.brokerCalls, "broker-calls", "KUBECLIP_BENCH_BROKER_CALLS", 2000, "(p) model calls measured through the credential broker, and as many straight to the upstream, interleaved")
	fs.Int(&s.brokerWarmup, "broker-warmup", "KUBECLIP_BENCH_BROKER_WARMUP", 200, "(p), (p') calls of each route made first and not measured (connections, leaf certificates, caches)")
	fs.Int(&s.brokerFirstBytes, "broker-first-bytes", "KUBECLIP_BENCH_BROKER_FIRST_BYTES", 1000, "(p') streamed calls measured to their first byte through the broker, and as many direct")
	fs.String(&s.brokerStreams, "broker-streams", "KUBECLIP_BENCH_BROKER_STREAMS", "250,500,1000", "(p'') concurrent open SSE streams through the one broker process at which its memory is read, ascending")
	fs.Int(&s.brokerOpeners, "broker-openers", "KUBECLIP_BENCH_BROKER_OPENERS", 32, "(p'') streams being opened at once (TLS handshake to first event)")
	fs.String(&s.phases, "phases", "KUBECLIP_BENCH_PHASES", "all", "phases to run, as letters (\"g,h\" or \"gh\"); set-up always runs but for (p) alone, which needs no cluster; (c) measures the runs of (a), (b) and (d)")
	fs.String(&s.sandboxdImage, "sandboxd-image", "KUBECLIP_SANDBOXD_IMAGE", dispatch.DefaultSandboxdImage, "the dispatcher's sandboxd image, as cmd/dispatcher's flag (a build of this checkout for the exec phases)")
	fs.Duration(&s.waitTimeout, "wait-timeout", "KUBECLIP_BENCH_WAIT_TIMEOUT", 60*time.Second, "longest wait for one event")
	fs.Duration(&s.cleanupTimeout, "cleanup-timeout", "KUBECLIP_BENCH_CLEANUP_TIMEOUT", 3*time.Minute, "longest wait for the bench's namespaces to be gone")
	fs.Duration(&s.settleTimeout, "settle-timeout", "KUBECLIP_BENCH_SETTLE_TIMEOUT", 4*time.Minute, "longest wait, before each phase, for the runs of the phases before it to end and their pods and namespaces to be gone (the bench stops, naming what is left, when it runs out)")
	if err := fs.Parse(args); err != nil {
		fs.Usage(stdout, summary)
		return s, app.Usage(err)
	}
	if err := s.validate(fs); err != nil {
		return s, &app.UsageError{Err: err}
	}
	s.brokerStreamLevels, _ = parseLevels(s.brokerStreams)
	return s, nil
}

// parseLevels reads a comma-separated list of positive counts in ascending order.
func parseLevels(list string) ([]int, error) {
	var levels []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a count > 0", strings.TrimSpace(f))
		}
		if len(levels) > 0 && n <= levels[len(levels)-1] {
			return nil, fmt.Errorf("%d does not follow %d in ascending order", n, levels[len(levels)-1])
		}
		levels = append(levels, n)
	}
	return levels, nil
}

func (s settings) validate(fs *config.Set) error {
	var errs []error
	if s.kubeconfig == "" && s.needsCluster() {
		errs = append(errs, fmt.Errorf("%s is required (make bench passes the local cluster's)", fs.Names("kubeconfig")))
	}
	positive := map[string]int{
		"warm-samples": s.warmSamples, "cold-samples": s.coldSamples, "log-runs": s.logRuns,
		"log-lines": s.logLines, "burst": s.burst, "burst-companies": s.burstCompanies, "raw-concurrency": s.rawConcurrency,
		"replica-rounds": s.replicaRounds, "takeover-kills": s.takeoverKills, "replay-lines": s.replayLines, "replay-rounds": s.replayRounds,
		"poll-agents": s.pollAgents, "poll-inflight": s.pollInflight, "ready-samples": s.readySamples,
		"stream-bytes": s.streamBytes, "stream-rounds": s.streamRounds, "reuse-leases": s.reuseLeases,
		"reuse-live-resumes": s.reuseLiveResumes, "reuse-suspended-resumes": s.reuseSuspendedResumes,
		"warm-pool-max": s.warmPoolMax, "warm-pool-samples": s.warmPoolSamples,
		"broker-calls": s.brokerCalls, "broker-first-bytes": s.brokerFirstBytes, "broker-openers": s.brokerOpeners,
	}
	for name, v := range positive {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be > 0", fs.Names(name)))
		}
	}
	if s.brokerWarmup < 0 {
		errs = append(errs, fmt.Errorf("%s must not be negative", fs.Names("broker-warmup")))
	}
	if _, err := parseLevels(s.brokerStreams); err != nil {
		errs = append(errs, fmt.Errorf("%s takes stream counts in ascending order (250,500,1000): %w", fs.Names("broker-streams"), err))
	}
	if s.warmup < 0 || s.logSkip < 0 || s.pace < 0 {
		errs = append(errs, fmt.Errorf("%s, %s and %s must not be negative", fs.Names("warmup"), fs.Names("log-skip"), fs.Names("pace")))
	}
	if s.logSkip >= s.logLines {
		errs = append(errs, fmt.Errorf("%s must be below %s", fs.Names("log-skip"), fs.Names("log-lines")))
	}
	if s.logInterval <= 0 || s.waitTimeout <= 0 || s.cleanupTimeout <= 0 || s.settleTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%s, %s, %s and %s must be > 0", fs.Names("log-interval"), fs.Names("wait-timeout"), fs.Names("cleanup-timeout"), fs.Names("settle-timeout")))
	}
	if s.dispatchers < 2 {
		errs = append(errs, fmt.Errorf("%s must be at least 2 (compared with one)", fs.Names("dispatchers")))
	}
	if s.takeoverReplicas < 2 {
		errs = append(errs, fmt.Errorf("%s must be at least 2 (one is killed, another takes over)", fs.Names("takeover-replicas")))
	}
	if s.ownershipTTL < time.Second || s.takeoverInterval <= 0 {
		errs = append(errs, fmt.Errorf("%s must be at least 1s and %s > 0", fs.Names("ownership-ttl"), fs.Names("takeover-interval")))
	}
	if s.pollInterval <= 0 || s.pollWindow < time.Second {
		errs = append(errs, fmt.Errorf("%s must be > 0 and %s at least 1s", fs.Names("poll-interval"), fs.Names("poll-window")))
	}
	if s.warmPoolRate <= 0 || s.warmPoolFillTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%s and %s must be > 0", fs.Names("warm-pool-rate"), fs.Names("warm-pool-fill-timeout")))
	}
	if q, err := resource.ParseQuantity(s.execCPULimit); err != nil || q.Sign() <= 0 {
		errs = append(errs, fmt.Errorf("%s must be a CPU quantity > 0 (500m, 2)", fs.Names("exec-cpu-limit")))
	}
	if strings.Trim(s.phases, "abcdefghijklmnop, ") != "" && s.phases != "all" {
		errs = append(errs, fmt.Errorf("%s takes phase letters a to p, or all", fs.Names("phases")))
	}
	return errors.Join(errs...)
}

// runs reports whether phase (its name starts with its letter: "(g) takeover") is selected.
// The set-up runs always.
func (s settings) runs(phase string) bool {
	if s.phases == "all" || !strings.HasPrefix(phase, "(") {
		return true
	}
	return strings.Contains(s.phases, label(phase))
}

// clusterFree are the phases that need neither the cluster nor the pipeline: (p) runs the
// broker, its NATS and its upstream on this machine.
const clusterFree = "p"

// needsCluster reports whether a selected phase needs the cluster (and so the set-up, the
// pipeline and the cluster lock).
func (s settings) needsCluster() bool {
	return s.phases == "all" || strings.Trim(s.phases, clusterFree+", ") != ""
}
