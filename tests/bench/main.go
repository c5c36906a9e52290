// Command bench measures kubeclip's pipeline against the local cluster and reports, side by
// side from the same run, the raw Kubernetes primitive each measurement rides on:
//
//	(a) acquire published → `created` received, warm tenant   vs  create Secret + Job
//	(b) acquire published → `created` received, cold tenant   vs  SSA tenant + create Secret + Job
//	(c) pod's container terminated (own pod informer) → `result` received
//	(d) log line read by an own GetLogs follow stream → the line's `log` event received
//	(e) sustained acquisitions/s, publish N at once → last `created`  vs  N concurrent raw creates
//	(f) the burst of (e) with 1 and with 3 dispatchers                   vs  each other (the speed-up)
//	(g) SIGKILL of the run-watcher process owning a streaming run → its next log event stored
//	    (run-watcher processes from ./bin)                                vs  the owner's KV key expiry
//	(h) replay of a 100k-line run with events.Follow, decoding included  vs  a bare ordered consumer
//	(i) exec of `true` in a pod lease through NATS, daemon and kube-exec routes  vs  a client-go exec
//	(j) 50 agents polling like Paperclip's bridge (a short command every 116 ms each) on up to 50
//	    pod leases, then saturating; achieved execs/s, latency and the API server's CPU, both
//	    routes                                                           vs  client-go execs, same pollers
//	(k) acquire → ready to exec (status Ready; first exec), cold tenant  vs  client-go pod create → Ready
//	(l) 64 MiB through stdin and out of stdout, both routes              vs  client-go exec streams
//	(m) native sync in and out (sandboxd untar/tar) of 1, 50, 500 MiB    vs  the host's base64 route, and `cat`
//	(n) a reusable lease: first acquire → ready (claim provisioned)       vs  client-go claim + pod create → Ready
//	    resume of a retained lease (pod live) → resumed                   vs  client-go GET of its pod
//	    resume of a suspended lease (new pod on its claim) → resumed      vs  client-go pod create → Ready on a bound claim
//	(o) acquire → ready to exec (status Ready; first exec) at 45/s open loop, one company with a
//	    full warm pool (a dispatcher process with --warm-pool-max); hits and misses apart, the
//	    hit rate                                                         vs  client-go pod create → Ready
//	(p) a model call (JSON POST /v1/messages) through the credential broker (the credential-broker
//	    binary from --bin as its own process, its grant cache on NATS)  vs  straight to the same
//	    local TLS upstream; a streamed call's first byte, both routes; then 250/500/1,000 open
//	    SSE streams through the one broker: its RSS and heap per stream. It needs no cluster:
//	    `--phases p` (KUBECLIP_BENCH_PHASES=p) runs it alone, without the pipeline.
//
// The pipeline is the real one, in process: an embedded JetStream server and the tenant-worker,
// dispatcher and run-watcher, each with its own NATS connection and Kubernetes client (so its
// own client-side rate limit) and the binaries' default settings; (f) adds dispatchers the same
// way, (g) replaces the run-watcher by processes joining the embedded server over TCP, and (o)
// the dispatcher by a process started with warm pools.
// Times are the bench's receive times (monotonic clock; (g) compares the wall clock with the
// stream's store times, same machine); the run events are read with one JetStream ordered
// consumer, as a Paperclip consumer would. Every namespace it creates starts with "kcbench-"
// and carries the label bench.kubeclip.io/session; all are deleted at the end.
//
// Run it with `make bench` (go run ./tests/bench --kubeconfig PATH); the table goes to stdout
// and, as JSON, to --out (default ./bench-results.json), with one SVG picture per phase beside it
// (bench-results-a.svg, …): each row's distribution, kubeclip beside its raw primitive.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/internal/pipelinetest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr)
	if code := app.ExitCode(err); code != 0 {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(code)
	}
}

func run(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout, stderr io.Writer) error {
	s, err := parseSettings(args, lookupEnv, stdout)
	if err != nil {
		return err
	}
	if !s.needsCluster() {
		b := newLocalBench(s, stderr)
		report, runErr := b.measure(ctx)
		return errors.Join(runErr, report.write(stdout, s.out))
	}
	// The bursts fill the node: take the cluster capacity lock exclusively, as suites that fill
	// it do, so no other suite's pods sit unschedulable meanwhile (and none skew the figures).
	fmt.Fprintf(stderr, "%s bench: taking the cluster capacity lock (waits for running suites)\n", time.Now().Format("15:04:05.000"))
	unlock, err := pipelinetest.LockCluster(true)
	if err != nil {
		return err
	}
	defer unlock()
	b, err := newBench(ctx, s, stderr)
	if err != nil {
		return err
	}
	report, runErr := b.measure(ctx)
	closeErr := b.close(ctx)
	if report != nil {
		if err := report.write(stdout, s.out); err != nil {
			return errors.Join(runErr, closeErr, err)
		}
	}
	return errors.Join(runErr, closeErr)
}
