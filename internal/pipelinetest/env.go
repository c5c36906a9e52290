// Package pipelinetest runs the whole kubeclip pipeline for the end-to-end and failover suites:
// the real worker binaries as processes (any number of replicas of each, stopped with SIGTERM
// or killed with SIGKILL), an embedded JetStream server that can be stopped and restarted on the
// same port and store, and the local cluster through internal/clustertest. Tests drive runs the
// way Paperclip does: they publish lease requests and read the run events back.
//
// A suite calls Main from its TestMain; tests use the Env it returns.
package pipelinetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/inbox"
	"github.com/kubeclip/kubeclip/pkg/runwatch"
)

// The worker binaries.
const (
	TenantWorker = "tenant-worker"
	Dispatcher   = "dispatcher"
	RunWatcher   = "run-watcher"
	// ExecWorker serves exec (docs/exec.md). Suites start it with Options.ExecWorkers, or
	// StartWorker(ExecWorker); it shares the dispatcher's sandbox key file.
	ExecWorker = "exec-worker"
	// CLI is the kubeclip command-line tool (not a worker).
	CLI = "kubeclip"
)

// KeepLogsEnv names the variable that, when set, keeps the suite's directory (worker logs,
// JetStream store) after a passing run too; a failing run always keeps it.
const KeepLogsEnv = "KUBECLIP_KEEP_LOGS"

// Kinds lists the worker binaries in the order they are started.
func Kinds() []string { return []string{TenantWorker, Dispatcher, RunWatcher} }

// Options shapes the pipeline a suite runs.
type Options struct {
	// Name prefixes the temporary directory and messages ("e2e", "failover").
	Name string
	// Replicas is how many processes of each worker run (default 1).
	Replicas int
	// AgentBusyTimeout is the dispatchers' --agent-busy-timeout (0: the binary's default).
	AgentBusyTimeout time.Duration
	// OwnershipTTL is the run-watchers' --ownership-ttl (0: the binary's default).
	OwnershipTTL time.Duration
	// Args adds flags per worker kind.
	Args map[string][]string
	// Env adds environment variables (K=V) per worker kind.
	Env map[string][]string
	// ClusterLock takes the cluster capacity lock shared (see LockCluster) for the whole suite.
	ClusterLock bool
	// ExecWorkers is how many exec-worker processes Setup starts after the other workers
	// (default none: only suites that exec need them).
	ExecWorkers int
	// NATSProcess runs the JetStream server as the pinned nats-server binary in a process of its
	// own (StartNATSProcess), as production runs it, instead of inside the test process, where
	// it is built with the race detector and shares the CPUs and garbage collector of the
	// suite's clients: for a suite that measures latency through the server.
	NATSProcess bool
	// Broker, when set, is the suite's credential broker (NewBroker): Setup starts it once
	// the workers made the streams, and the suite's directory keeps its log. Its files are
	// removed with the suite's.
	Broker *Broker
	// BrokerPods wires every tenant pod to a credential broker (zero: no broker wiring).
	BrokerPods BrokerPods
}

// Env is a running pipeline: JetStream, the workers, and a client connection.
type Env struct {
	opts       Options
	Bin        string
	Dir        string
	LogDir     string
	Kubeconfig string
	NATS       *NATS
	NC         *nats.Conn
	JS         jetstream.JetStream
	Subjects   events.Subjects
	// SandboxKey is the installation's sandbox master key, in the file SandboxKeyFile the
	// dispatcher (and exec-worker) read: tests derive a lease's sandboxd seed from it.
	SandboxKey     []byte
	SandboxKeyFile string

	workers workerSet
	// natsURL is where the workers connect: NATS's URL, or the caller's servers (AttachURL).
	natsURL string
	// attached: the server is the caller's (Attach), so Close leaves it running.
	attached bool
}

// Main sets the pipeline up, runs the suite's tests, tears everything down and returns the exit
// code for os.Exit. The worker logs are printed when a test failed or a worker did not shut
// down cleanly. Goroutines the suite leaked (goleak) fail it too.
func Main(m *testing.M, opts Options, env **Env) int {
	if opts.ClusterLock {
		unlock, err := LockCluster(false)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", opts.Name, err)
			return 1
		}
		defer unlock()
	}
	e, err := Setup(context.Background(), opts) // a TestMain has no context of its own
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", opts.Name, err)
		if e != nil {
			e.DumpLogs()
			e.teardown()
		}
		return 1
	}
	*env = e
	code := m.Run()
	if err := e.Close(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", opts.Name, err)
		code = 1
	}
	if code != 0 {
		e.DumpLogs()
	}
	if code != 0 || os.Getenv(KeepLogsEnv) != "" {
		fmt.Fprintf(os.Stderr, "%s: worker logs kept in %s\n", opts.Name, e.LogDir)
	} else {
		_ = os.RemoveAll(e.Dir)
	}
	if opts.Broker != nil {
		_ = os.RemoveAll(opts.Broker.Dir)
	}
	if err := goleak.Find(LeakOptions()...); err != nil {
		fmt.Fprintf(os.Stderr, "%s: leaked goroutines: %v\n", opts.Name, err)
		code = 1
	}
	return code
}

// LeakOptions are the goroutines a suite may leave behind: the reader of client-go's pooled
// HTTP/2 connection to the API server (process-wide, shared by every clientset, idle until
// the process exits) and klog's flush daemon.
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreAnyFunction("golang.org/x/net/http2.(*ClientConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreAnyFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("k8s.io/klog/v2.(*flushDaemon).run.func1"),
	}
}

// Setup starts JetStream and opts.Replicas processes of each worker, and waits (until ctx ends,
// 30 s at most) for the streams and buckets they create. On error the returned Env (possibly
// nil) holds whatever was started, for DumpLogs.
func Setup(ctx context.Context, opts Options) (*Env, error) {
	if opts.Name == "" {
		opts.Name = "pipeline"
	}
	if opts.Replicas <= 0 {
		opts.Replicas = 1
	}
	bin, err := Binaries()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kubeclip-"+opts.Name+"-")
	if err != nil {
		return nil, err
	}
	e := &Env{opts: opts, Bin: bin, Dir: dir, LogDir: filepath.Join(dir, "logs"), Kubeconfig: clustertest.Kubeconfig()}
	if err := os.MkdirAll(e.LogDir, 0o755); err != nil {
		return e, err
	}
	e.Subjects, _ = events.NewSubjects("")
	e.SandboxKey = make([]byte, execspec.MinMasterKeySize)
	if _, err := rand.Read(e.SandboxKey); err != nil {
		return e, err
	}
	e.SandboxKeyFile = filepath.Join(dir, "sandbox.key")
	if err := os.WriteFile(e.SandboxKeyFile, []byte(hex.EncodeToString(e.SandboxKey)), 0o600); err != nil {
		return e, err
	}
	if opts.NATSProcess {
		var bin string
		if bin, err = natstest.BuildServerBinary(); err == nil {
			e.NATS, err = StartNATSProcess(filepath.Join(dir, "nats"), bin, filepath.Join(e.LogDir, "nats-server.log"))
		}
	} else {
		e.NATS, err = StartNATS(filepath.Join(dir, "nats"))
	}
	if err != nil {
		return e, err
	}
	e.natsURL = e.NATS.URL()
	// The test's own connection outlives a NATS restart, like the workers' do.
	// Its inbox is the CLI's: exec-workers answer only into a client's inbox.
	e.NC, err = nats.Connect(e.NATS.URL(), nats.Name("kubeclip-"+opts.Name), nats.CustomInboxPrefix(inbox.CLIPrefix), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		return e, fmt.Errorf("connecting to %s: %w", e.NATS.URL(), err)
	}
	e.JS, err = jetstream.New(e.NC)
	if err != nil {
		return e, err
	}
	for _, kind := range Kinds() {
		for range opts.Replicas {
			if _, err := e.StartWorker(kind); err != nil {
				return e, err
			}
		}
	}
	for range opts.ExecWorkers {
		if _, err := e.StartWorker(ExecWorker); err != nil {
			return e, err
		}
	}
	// The streams exist once a worker started; wait for them so a test can publish at once.
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		_, err := e.JS.Stream(ctx, events.WorkStream)
		if err == nil {
			_, err = e.JS.KeyValue(ctx, runwatch.OwnershipBucket)
		}
		if err == nil {
			_, err = e.JS.Stream(ctx, e.Subjects.RunStream())
		}
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return e, fmt.Errorf("the workers did not create the streams and buckets: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	// The broker reads the run stream (a lease's end releases its grants), which the workers
	// create: it starts after them, and before any test can mint.
	if opts.Broker != nil {
		if err := e.startBroker(opts.Broker); err != nil {
			return e, fmt.Errorf("starting the credential broker: %w", err)
		}
	}
	return e, nil
}

// Close stops every live worker with SIGTERM and expects a clean exit, then closes the
// connection and stops JetStream.
func (e *Env) Close() error {
	err := e.StopAll()
	e.teardown()
	return err
}

func (e *Env) teardown() {
	for _, w := range e.workers.live() {
		_ = w.Kill()
	}
	if e.NC != nil {
		e.NC.Close()
	}
	if e.NATS != nil && !e.attached {
		e.NATS.Stop()
	}
}

// DumpLogs prints the last lines of every worker's log to stderr.
func (e *Env) DumpLogs() {
	if e == nil || e.LogDir == "" {
		return
	}
	entries, _ := os.ReadDir(e.LogDir)
	for _, ent := range entries {
		data, _ := os.ReadFile(filepath.Join(e.LogDir, ent.Name()))
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > 80 {
			lines = lines[len(lines)-80:]
		}
		fmt.Fprintf(os.Stderr, "---- last lines of %s ----\n%s\n", ent.Name(), strings.Join(lines, "\n"))
	}
}

// Binaries returns the directory holding the worker binaries: $KUBECLIP_BIN when it has them
// (make test builds them first), else a fresh build into a temporary directory.
func Binaries() (string, error) {
	if dir := os.Getenv("KUBECLIP_BIN"); dir != "" && hasBinaries(dir) {
		return dir, nil
	}
	dir, err := os.MkdirTemp("", "kubeclip-bin-")
	if err != nil {
		return "", err
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/...")
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building the binaries: %w", err)
	}
	return dir, nil
}

// hasBinaries reports whether dir holds every binary a suite may start.
func hasBinaries(dir string) bool {
	for _, b := range append(Kinds(), ExecWorker, CredentialBroker, CLI) {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return false
		}
	}
	return true
}

// moduleRoot finds the directory of go.mod from the working directory up.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

// LockCluster takes the cluster capacity lock, a file lock every suite on this machine that
// runs agent pods through this package shares. The single node has room for about 19 agent
// pods (100m CPU each, the tenant LimitRange's minimum, on 2 CPUs); a test that fills it takes
// the lock exclusively, so no other suite's pods sit unschedulable meanwhile (their
// run-watchers would fail them after the 5 s unschedulable grace), and every other suite holds
// it shared. The lock is released by the returned function, or when the process dies.
func LockCluster(exclusive bool) (func(), error) {
	path := filepath.Join(os.TempDir(), "kubeclip-cluster-capacity.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, fmt.Errorf("opening the cluster lock %s: %w", path, err)
	}
	how := syscall.LOCK_SH
	if exclusive {
		how = syscall.LOCK_EX
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}
