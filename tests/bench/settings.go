package main

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
)

const summary = `bench runs kubeclip's pipeline (embedded JetStream + tenant-worker, dispatcher, run-watcher in
process) against a Kubernetes cluster and prints p50/p99 of each stage next to the raw Kubernetes
primitive it rides on. It deletes every namespace it creates.`

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

	waitTimeout    time.Duration
	cleanupTimeout time.Duration
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
	fs.Int(&s.burst, "burst", "KUBECLIP_BENCH_BURST", 200, "(e) acquisitions published at once")
	fs.Int(&s.burstCompanies, "burst-companies", "KUBECLIP_BENCH_BURST_COMPANIES", 2, "(e) warm companies the burst is spread over (each tenant's quota admits 20 pods)")
	fs.Int(&s.rawConcurrency, "raw-concurrency", "KUBECLIP_BENCH_RAW_CONCURRENCY", 16, "(e) concurrent raw creates (the dispatcher's default concurrency)")
	fs.Duration(&s.waitTimeout, "wait-timeout", "KUBECLIP_BENCH_WAIT_TIMEOUT", 60*time.Second, "longest wait for one event")
	fs.Duration(&s.cleanupTimeout, "cleanup-timeout", "KUBECLIP_BENCH_CLEANUP_TIMEOUT", 3*time.Minute, "longest wait for the bench's namespaces to be gone")
	if err := fs.Parse(args); err != nil {
		fs.Usage(stdout, summary)
		return s, app.Usage(err)
	}
	if err := s.validate(fs); err != nil {
		return s, &app.UsageError{Err: err}
	}
	return s, nil
}

func (s settings) validate(fs *config.Set) error {
	var errs []error
	if s.kubeconfig == "" {
		errs = append(errs, fmt.Errorf("%s is required (make bench passes the local cluster's)", fs.Names("kubeconfig")))
	}
	positive := map[string]int{
		"warm-samples": s.warmSamples, "cold-samples": s.coldSamples, "log-runs": s.logRuns,
		"log-lines": s.logLines, "burst": s.burst, "burst-companies": s.burstCompanies, "raw-concurrency": s.rawConcurrency,
	}
	for name, v := range positive {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be > 0", fs.Names(name)))
		}
	}
	if s.warmup < 0 || s.logSkip < 0 || s.pace < 0 {
		errs = append(errs, fmt.Errorf("%s, %s and %s must not be negative", fs.Names("warmup"), fs.Names("log-skip"), fs.Names("pace")))
	}
	if s.logSkip >= s.logLines {
		errs = append(errs, fmt.Errorf("%s must be below %s", fs.Names("log-skip"), fs.Names("log-lines")))
	}
	if s.logInterval <= 0 || s.waitTimeout <= 0 || s.cleanupTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%s, %s and %s must be > 0", fs.Names("log-interval"), fs.Names("wait-timeout"), fs.Names("cleanup-timeout")))
	}
	return errors.Join(errs...)
}
