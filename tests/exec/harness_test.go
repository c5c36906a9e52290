// Package exec runs exec end to end: the real worker binaries (exec-workers included) against a
// real JetStream server and the local cluster, pod leases whose sandboxd runs the commands, over
// both exec routes, and the kubeclip CLI.
package exec

import (
	"context"
	"encoding/json"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execclient"
)

// runTimeout bounds a lease's start on this 2-core machine (pod start a few seconds, images
// local).
const runTimeout = 2 * time.Minute

// sandboxImage is the local cluster's Paperclip sandbox: a Debian userland, node, the claude
// stub (hack/cluster/sandbox-image.sh).
const sandboxImage = "kubeclip.local/sandbox:dev"

// env is shared by every test: one JetStream server and one replica of each worker; the tests
// start their own exec-workers, on the route they test.
var env *pt.Env

// leaseIdleWindow is the dispatcher's --lease-idle-window: long enough for `kubeclip lease show`
// to see a released reusable lease retained, short enough for the test to see it suspended.
const leaseIdleWindow = 10 * time.Second

func TestMain(m *testing.M) {
	os.Exit(pt.Main(m, pt.Options{
		Name: "exec", ClusterLock: true,
		Args: map[string][]string{pt.Dispatcher: {"--lease-idle-window", leaseIdleWindow.String()}},
	}, &env))
}

// podConfig is a pod lease's provider config on the sandbox image.
func podConfig() json.RawMessage {
	return pt.StubConfig(nil, func(c map[string]any) {
		c["backend"] = "pod"
		c["podActivityDeadlineSec"] = 900
		c["adapters"].([]any)[0].(map[string]any)["runtimeImage"] = sandboxImage
	})
}

// lease is an acquired pod lease.
type lease struct {
	run     *pt.Run
	created events.RunCreatedEvent
	execclient.Lease
}

// acquire acquires a pod lease for a fresh company and waits for its created event (not for
// its pod to be ready: exec waits for that itself).
func acquire(t *testing.T) *lease {
	t.Helper()
	company := pt.NewID("co")
	pt.CleanupTenant(t, clustertest.Clientset(t), company)
	r := env.Acquire(t, company, pt.NewID("agent"), podConfig())
	created := pt.WaitKind[events.RunCreatedEvent](r, runTimeout)
	return &lease{run: r, created: created, Lease: execclient.Lease{CompanyID: company, RunID: r.RunID, ProviderLeaseID: created.ProviderLeaseID}}
}

// waitReady waits for the lease's status Running/Ready.
func (l *lease) waitReady(t *testing.T) {
	t.Helper()
	l.run.WaitFor(runTimeout, "status Running/Ready", func(evs []events.Received) bool {
		for _, st := range pt.Only[events.RunStatusEvent](evs) {
			if st.Phase == events.PhaseRunning && st.Reason == events.ReasonReady {
				return true
			}
		}
		return false
	})
}

// execWorkers starts n exec-workers on route and stops (SIGTERM) those still running when the
// test ends.
func execWorkers(t *testing.T, route string, n int) []*pt.Worker {
	t.Helper()
	var ws []*pt.Worker
	for range n {
		w, err := env.StartWorker(pt.ExecWorker, "--exec-route", route)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	t.Cleanup(func() {
		for _, w := range ws {
			if w.Exited() {
				continue // killed by the test
			}
			if err := w.Stop(); err != nil {
				t.Errorf("%s: %v", w.ID, err)
			}
		}
	})
	return ws
}

// newClient is an exec client on the suite's connection.
func newClient(t *testing.T) *execclient.Client {
	t.Helper()
	c, err := execclient.New(execclient.Options{NATS: env.NC, Subjects: env.Subjects})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// run runs x on l, bounded by a few minutes.
func run(t *testing.T, c *execclient.Client, l *lease, x execclient.Exec) (execclient.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	x.Lease = l.Lease
	return c.Run(ctx, x)
}

// lines is an io.Writer that keeps what it is written and counts its newlines.
type lines struct {
	mu  sync.Mutex
	n   int
	buf []byte
}

func (l *lines) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range b {
		if c == '\n' {
			l.n++
		}
	}
	l.buf = append(l.buf, b...)
	return len(b), nil
}

func (l *lines) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

func (l *lines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.buf)
}

// eventually polls cond every 50 ms until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting until %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
