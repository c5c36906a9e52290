// Package e2e runs the real worker binaries against a real JetStream server and the local
// Kubernetes cluster, and checks what Paperclip would see: the run events.
package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// stubImage is the agent stub the cluster harness builds and imports.
const stubImage = "kubeclip.local/agent-stub:dev"

// agentBusyTimeout is the dispatcher's --agent-busy-timeout in these tests.
const agentBusyTimeout = 15 * time.Second

// env is shared by every test: one JetStream server and one replica of each worker.
var env struct {
	natsURL string
	js      jetstream.JetStream
	nc      *nats.Conn
	subj    events.Subjects
	logDir  string
}

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	bin, err := binaries()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	dir, err := os.MkdirTemp("", "kubeclip-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	srv, err := events.StartEmbedded(events.EmbeddedOptions{StoreDir: filepath.Join(dir, "nats"), Port: -1})
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: starting nats-server:", err)
		return 1
	}
	defer events.ShutdownEmbedded(srv)
	env.natsURL = srv.ClientURL()
	env.logDir = filepath.Join(dir, "logs")
	if err := os.MkdirAll(env.logDir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	env.nc, err = nats.Connect(env.natsURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer env.nc.Close()
	env.js, _ = jetstream.New(env.nc)
	env.subj, _ = events.NewSubjects("")

	kubeconfig := clustertest.Kubeconfig()
	common := []string{"--nats-url", env.natsURL, "--kubeconfig", kubeconfig, "--log-level", "debug"}
	workers := []*worker{
		startWorker(bin, "tenant-worker", common),
		startWorker(bin, "dispatcher", append(common, "--agent-busy-timeout", agentBusyTimeout.String())),
		startWorker(bin, "run-watcher", common),
	}
	code := m.Run()
	for _, w := range workers {
		if err := w.stop(); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %s did not shut down cleanly: %v\n", w.name, err)
			code = 1
		}
	}
	if code != 0 {
		dumpLogs(srv)
	}
	return code
}

// binaries returns the directory holding the worker binaries: $KUBECLIP_BIN when it has them
// (make test builds them first), else a fresh build.
func binaries() (string, error) {
	if dir := os.Getenv("KUBECLIP_BIN"); dir != "" {
		if _, err := os.Stat(filepath.Join(dir, "run-watcher")); err == nil {
			return dir, nil
		}
	}
	dir, err := os.MkdirTemp("", "kubeclip-bin-")
	if err != nil {
		return "", err
	}
	cmd := exec.Command("go", "build", "-o", dir+"/", "../../cmd/...")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("building the binaries: %w", err)
	}
	return dir, nil
}

type worker struct {
	name string
	cmd  *exec.Cmd
	done chan error
}

func startWorker(bin, name string, args []string) *worker {
	logFile, err := os.Create(filepath.Join(env.logDir, name+".log"))
	if err != nil {
		panic(err)
	}
	cmd := exec.Command(filepath.Join(bin, name), args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		panic(fmt.Sprintf("starting %s: %v", name, err))
	}
	w := &worker{name: name, cmd: cmd, done: make(chan error, 1)}
	go func() {
		w.done <- cmd.Wait()
		logFile.Close()
	}()
	return w
}

// stop sends SIGTERM and expects a clean exit (status 0) within the drain bound.
func (w *worker) stop() error {
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-w.done:
		return err
	case <-time.After(40 * time.Second):
		_ = w.cmd.Process.Kill()
		return errors.New("still running 40s after SIGTERM")
	}
}

func dumpLogs(*server.Server) {
	entries, _ := os.ReadDir(env.logDir)
	for _, e := range entries {
		data, _ := os.ReadFile(filepath.Join(env.logDir, e.Name()))
		lines := strings.Split(string(data), "\n")
		if len(lines) > 80 {
			lines = lines[len(lines)-80:]
		}
		fmt.Fprintf(os.Stderr, "---- last lines of %s ----\n%s\n", e.Name(), strings.Join(lines, "\n"))
	}
}

// newID returns a fresh id usable as company, agent and run id.
func newID(prefix string) string {
	return prefix + "-" + strings.ToLower(ulid.Make().String())
}

// stubConfig is a Job-backend provider config whose adapter runs the agent stub with env.
func stubConfig(env map[string]string, mutate ...func(map[string]any)) json.RawMessage {
	if env == nil {
		env = map[string]string{}
	}
	cfg := map[string]any{
		"backend":                "job",
		"podActivityDeadlineSec": 120,
		"adapters": []any{map[string]any{
			"adapterType":  "claude_local",
			"runtimeImage": stubImage,
			"envKeys":      []string{"ANTHROPIC_API_KEY"},
			"allowFqdns":   []string{"api.anthropic.com"},
			"defaultEnv":   env,
		}},
		"defaultResources": map[string]any{
			"requests": map[string]string{"cpu": "100m", "memory": "128Mi"},
			"limits":   map[string]string{"cpu": "500m", "memory": "256Mi"},
		},
	}
	for _, m := range mutate {
		m(cfg)
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		panic(err)
	}
	return data
}

// run is one acquired run under test.
type run struct {
	t         *testing.T
	companyID string
	agentID   string
	runID     string

	mu     sync.Mutex
	events []events.Received
	cond   chan struct{} // closed and replaced whenever an event arrives
}

// acquire publishes an acquire for a fresh run of companyID/agentID and starts collecting its
// events. The company's namespace is deleted when the test ends.
func acquire(t *testing.T, companyID, agentID string, cfg json.RawMessage) *run {
	t.Helper()
	r := &run{t: t, companyID: companyID, agentID: agentID, runID: newID("run"), cond: make(chan struct{})}
	r.publishAcquire(cfg, true)
	r.collect()
	return r
}

func (r *run) request(cfg json.RawMessage) events.AcquireRequest {
	return events.AcquireRequest{
		RunID: r.runID, CompanyID: r.companyID, EnvironmentID: "e2e", AgentID: r.agentID, Config: cfg,
	}
}

// publishAcquire publishes the run's acquire, through the Publisher (with its message id) or
// raw (no message id, so JetStream cannot deduplicate it).
func (r *run) publishAcquire(cfg json.RawMessage, withMsgID bool) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := r.request(cfg)
	if withMsgID {
		pub, _ := events.NewPublisher(events.PublisherOptions{JS: env.js, Subjects: env.subj})
		if _, err := pub.Publish(ctx, req); err != nil {
			r.t.Fatalf("publishing acquire: %v", err)
		}
		return
	}
	subj, _ := env.subj.Lease(r.companyID, events.LeaseAcquire)
	data, _ := json.Marshal(req)
	if _, err := env.js.Publish(ctx, subj, data); err != nil {
		r.t.Fatalf("publishing acquire: %v", err)
	}
}

func (r *run) release(lease string, destroy bool) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pub, _ := events.NewPublisher(events.PublisherOptions{JS: env.js, Subjects: env.subj})
	req := events.ReleaseRequest{RunID: r.runID, CompanyID: r.companyID, ProviderLeaseID: lease, Destroy: destroy}
	if _, err := pub.Publish(ctx, req); err != nil {
		r.t.Fatalf("publishing release: %v", err)
	}
}

// collect follows the run's events in the background until the test ends.
func (r *run) collect() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	r.t.Cleanup(func() {
		cancel()
		<-done
	})
	go func() {
		defer close(done)
		_ = events.Follow(ctx, env.js, env.subj, r.companyID, r.runID, events.FollowOptions{}, func(rec events.Received) error {
			r.mu.Lock()
			r.events = append(r.events, rec)
			close(r.cond)
			r.cond = make(chan struct{})
			r.mu.Unlock()
			return nil
		})
	}()
}

// waitFor waits until pred holds for the events so far and returns them.
func (r *run) waitFor(timeout time.Duration, what string, pred func([]events.Received) bool) []events.Received {
	r.t.Helper()
	deadline := time.After(timeout)
	for {
		r.mu.Lock()
		evs := append([]events.Received(nil), r.events...)
		cond := r.cond
		r.mu.Unlock()
		if pred(evs) {
			return evs
		}
		select {
		case <-cond:
		case <-deadline:
			r.t.Fatalf("run %s: no %s within %s; events so far:\n%s", r.runID, what, timeout, describe(evs))
		}
	}
}

// waitKind waits for the first event of a kind and returns it.
func waitKind[T events.Event](r *run, timeout time.Duration) T {
	r.t.Helper()
	var zero T
	evs := r.waitFor(timeout, fmt.Sprintf("%T event", zero), func(evs []events.Received) bool {
		for _, e := range evs {
			if _, ok := e.Event.(T); ok {
				return true
			}
		}
		return false
	})
	for _, e := range evs {
		if v, ok := e.Event.(T); ok {
			return v
		}
	}
	return zero
}

// all returns every event of type T received so far.
func all[T events.Event](r *run) []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []T
	for _, e := range r.events {
		if v, ok := e.Event.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func describe(evs []events.Received) string {
	var b strings.Builder
	for _, e := range evs {
		data, _ := json.Marshal(e.Event)
		if len(data) > 300 {
			data = append(data[:300], "..."...)
		}
		fmt.Fprintf(&b, "  %T %s\n", e.Event, data)
	}
	return b.String()
}

// cleanupTenant deletes the company's tenant namespace when the test ends.
func cleanupTenant(t *testing.T, cs kubernetes.Interface, companyID string) {
	t.Cleanup(func() {
		ns := namespaceOf(t, companyID)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	})
}

func namespaceOf(t *testing.T, companyID string) string {
	ns, err := policy.TenantNamespace(policy.DefaultConfig(), companyID)
	if err != nil {
		t.Fatalf("tenant namespace of %s: %v", companyID, err)
	}
	return ns
}

// stubLines extracts the stub's assistant line texts ("stub line N") from the log events, in
// the order they were published.
func stubLines(logs []events.RunLogEvent) []string {
	var out []string
	for _, ev := range logs {
		for _, l := range ev.Lines {
			var msg struct {
				Type    string `json:"type"`
				Message struct {
					Content []struct {
						Text string `json:"text"`
					} `json:"content"`
				} `json:"message"`
			}
			if json.Unmarshal([]byte(l.Text), &msg) == nil && msg.Type == "assistant" && len(msg.Message.Content) > 0 {
				out = append(out, msg.Message.Content[0].Text)
			}
		}
	}
	return out
}
