// Command scale measures how kubeclip's costs grow with the number of live leases: 1,000, 3,000
// and 10,000 concurrent leases (by default) of each --backends (pod, job) through the real worker
// binaries, on a fleet of fake nodes that kwok (sigs.k8s.io/kwok, hack/kwok) simulates on the
// local cluster's real API server. kwok moves each pod Pending → Running (Ready, with an IP) and
// keeps it there (a Job's pod too: hack/kwok/stages.yaml); nothing runs in it, so the bench
// measures kubeclip's bookkeeping (acquire → created, watches, ownership, streams), not agents or
// exec. A Job lease's container log, which the run-watcher follows through the API server and
// the node's kubelet port, comes from the bench's logServer: a few lines, then a stream held open.
//
// For each size, against a fresh JetStream server and fresh workers:
//   - acquire published → created received, p50/p99, at --rate acquires/s offered (the first
//     acquire of each company, which provisions its tenant, is not counted);
//   - acquisitions/s at saturation: --burst more acquires published at once, with the size live;
//   - each worker's RSS and CPU per live lease (/proc of its process: RSS growth over its
//     start, CPU during the drive per acquire and during a --steady window with every lease live);
//   - NATS consumers (every stream's count) and stream bytes per run;
//   - the API server requests the workers made (a counting proxy between them and the API
//     server), per second during the drive and the steady window;
//   - start-up after a restart with the size live: each worker SIGTERMed and started again, time
//     to /readyz (its caches synced), and for the run-watcher to own every live run again;
//   - replay: the whole run stream read by one ordered consumer, events/s;
//   - nothing lost or doubled: every lease created once, none failed or ended.
//
// The table goes to stdout and, with the plot (scale.svg) and JSON (scale.json), to --out.
// Every tenant namespace starts with "kcscale-"; they, the fake nodes and the RuntimeClass are
// deleted after each size and at the end. Run it with `make bench-scale`.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubeclip/kubeclip/internal/pipelinetest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

// settings are the bench's flags.
type settings struct {
	kubeconfig, kwok, stages, out string
	sizes                         []int
	backends                      []string
	// clusterPKI holds the cluster's CA (ca.crt, ca.key), which issues the API proxy's and the
	// log server's certificates.
	clusterPKI string
	rate       float64
	perCompany int
	burst      int
	steady     time.Duration
	// dispatchConcurrency is the dispatcher's --concurrency; 0 leaves the binary's default.
	dispatchConcurrency int
	// previous is a scale.json of an earlier run whose sizes are reported before this run's.
	previous string
}

func parseSettings(args []string, stderr io.Writer) (settings, error) {
	var s settings
	fs := flag.NewFlagSet("scale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&s.kubeconfig, "kubeconfig", "", "kubeconfig of the cluster (required)")
	fs.StringVar(&s.kwok, "kwok", "", "kwok controller binary (hack/kwok/kwok.sh build prints it; required)")
	fs.StringVar(&s.stages, "stages", "hack/kwok/stages.yaml", "kwok's stage configuration")
	fs.StringVar(&s.out, "out", "bin/scale", "directory of the table, plot, JSON and logs")
	sizes := fs.String("sizes", "1000,3000,10000", "comma-separated numbers of concurrent leases, one run each")
	backends := fs.String("backends", "pod", "comma-separated lease backends (pod, job): every size runs for each, in this order")
	fs.StringVar(&s.clusterPKI, "cluster-pki", "", "directory of the cluster's CA (ca.crt, ca.key), which issues the API proxy's and the log server's certificates (required)")
	fs.Float64Var(&s.rate, "rate", 100, "offered acquires per second")
	fs.IntVar(&s.perCompany, "leases-per-company", 100, "live leases per company (each company is one tenant namespace)")
	fs.IntVar(&s.burst, "burst", 500, "acquires published at once, with the size live, for the saturation rate")
	fs.DurationVar(&s.steady, "steady", 30*time.Second, "window with every lease live over which idle CPU and API requests are measured")
	fs.IntVar(&s.dispatchConcurrency, "dispatch-concurrency", 0, "the dispatcher's --concurrency (0: the binary's default)")
	fs.StringVar(&s.previous, "previous", "", "scale.json of an earlier run: its sizes are reported first, beside this run's")
	if err := fs.Parse(args); err != nil {
		return s, err
	}
	if s.kubeconfig == "" || s.kwok == "" || s.clusterPKI == "" {
		return s, errors.New("--kubeconfig, --kwok and --cluster-pki are required")
	}
	for f := range strings.SplitSeq(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return s, fmt.Errorf("--sizes: %q is not a positive number", f)
		}
		s.sizes = append(s.sizes, n)
	}
	for f := range strings.SplitSeq(*backends, ",") {
		b := strings.TrimSpace(f)
		if b != "pod" && b != "job" {
			return s, fmt.Errorf("--backends: %q is neither pod nor job", f)
		}
		if slices.Contains(s.backends, b) {
			return s, fmt.Errorf("--backends: %q twice", b)
		}
		s.backends = append(s.backends, b)
	}
	if s.rate <= 0 || s.perCompany < 1 || s.burst < 1 || s.steady <= 0 {
		return s, errors.New("--rate, --leases-per-company, --burst and --steady must be positive")
	}
	return s, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	s, err := parseSettings(args, stderr)
	if err != nil {
		return err
	}
	// Two runs at once would delete each other's tenants and fake nodes (the names are fixed):
	// the second waits for the first.
	unlock, err := lockBench(newLogf(stderr))
	if err != nil {
		return err
	}
	defer unlock()
	// Thousands of leases load the API server that make bench and make test measure and run
	// on: take the cluster capacity lock exclusively, as make bench does.
	unlockCluster, err := pipelinetest.LockCluster(true)
	if err != nil {
		return err
	}
	defer unlockCluster()
	logDir := filepath.Join(s.out, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", s.kubeconfig)
	if err != nil {
		return fmt.Errorf("loading %s: %w", s.kubeconfig, err)
	}
	cfg.QPS, cfg.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	logf := newLogf(stderr)
	// A run that was killed leaves its tenants and nodes: remove them before measuring.
	if err := deleteTenants(ctx, cs, logf); err != nil {
		return err
	}
	proxy, err := startAPIProxy(cfg, s.clusterPKI)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, proxy.close()) }()
	proxyKubeconfig, err := proxy.writeKubeconfig(s.out)
	if err != nil {
		return err
	}
	largest := 0
	for _, n := range s.sizes {
		largest = max(largest, n+s.burst+1)
	}
	nodes := (largest + podsPerNode - 1) / podsPerNode
	var logs *logServer
	kubeletPort := ""
	if slices.Contains(s.backends, "job") {
		if err := checkOpenFileLimit(largest); err != nil {
			return err
		}
		if logs, err = startLogServer(s.clusterPKI); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, logs.close()) }()
		kubeletPort = logs.port()
	}
	logf("starting kwok with %d fake nodes of %d pods", nodes, podsPerNode)
	fl, err := startFleet(ctx, cs, s.kwok, s.stages, s.kubeconfig, logDir, nodes, kubeletPort)
	if err != nil {
		return err
	}
	defer func() {
		cctx := context.WithoutCancel(ctx)
		err = errors.Join(err, deleteTenants(cctx, cs, logf), fl.stop(cctx))
		logf("fleet removed")
	}()

	var results []sizeResult
	if s.previous != "" {
		data, err := os.ReadFile(s.previous)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(data, &results); err != nil {
			return fmt.Errorf("reading %s: %w", s.previous, err)
		}
	}
	for _, backend := range s.backends {
		for _, n := range s.sizes {
			logf("== %d %s leases", n, backend)
			res, err := measureSize(ctx, s, backend, n, proxy, proxyKubeconfig, logs, logDir, logf)
			results = append(results, res)
			if werr := writeReport(stdout, s.out, results); werr != nil {
				return errors.Join(err, werr)
			}
			if err != nil {
				return fmt.Errorf("%d %s leases: %w", n, backend, err)
			}
			if err := deleteTenants(ctx, cs, logf); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkOpenFileLimit fails early when this process may not hold a connection per live Job lease
// and some: the log server holds one per follow stream (the API server speaks HTTP/1.1 to a
// kubelet, one connection per request), leases of them at the largest size.
func checkOpenFileLimit(leases int) error {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return fmt.Errorf("reading the open-file limit: %w", err)
	}
	// The Go runtime raised the soft limit to the hard one at start.
	if need := uint64(leases) + 2000; lim.Cur < need {
		return fmt.Errorf("the open-file limit is %d; the job backend's log server needs about %d at %d leases (ulimit -n)", lim.Cur, need, leases)
	}
	return nil
}

// lockBench takes the bench's own machine-wide lock (a file lock, released when the process
// dies), saying so when it has to wait.
func lockBench(logf func(string, ...any)) (func(), error) {
	path := filepath.Join(os.TempDir(), "kubeclip-bench-scale.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, fmt.Errorf("opening the bench lock %s: %w", path, err)
	}
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		logf("another bench-scale holds %s; waiting for it", path)
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
	}
	return func() { f.Close() }, nil
}

func newLogf(stderr io.Writer) func(string, ...any) {
	return func(format string, a ...any) {
		fmt.Fprintf(stderr, "%s scale: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, a...))
	}
}
