// Package status runs `kubeclip status` against a running `kubeclip demo`: the real binaries, the
// demo's embedded JetStream server and the local cluster.
package status

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
)

// demoCompany is the company `kubeclip demo` acquires for.
const demoCompany = "demo-company"

var bin string

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := pt.Binaries()
	if err != nil {
		os.Stderr.WriteString("status: " + err.Error() + "\n")
		return 1
	}
	bin = dir
	unlock, err := pt.LockCluster(false)
	if err != nil {
		os.Stderr.WriteString("status: " + err.Error() + "\n")
		return 1
	}
	defer unlock()
	code := m.Run()
	if err := goleak.Find(pt.LeakOptions()...); err != nil {
		os.Stderr.WriteString("status: leaked goroutines: " + err.Error() + "\n")
		code = 1
	}
	return code
}

// demoOutput collects the demo's stdout and finds lines in it as they come.
type demoOutput struct {
	mu    sync.Mutex
	lines []string
	added chan struct{}
}

func (o *demoOutput) read(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		o.mu.Lock()
		o.lines = append(o.lines, sc.Text())
		o.mu.Unlock()
		select {
		case o.added <- struct{}{}:
		default:
		}
	}
}

func (o *demoOutput) text() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strings.Join(o.lines, "\n")
}

// await returns the first submatch of re in the output, waiting up to timeout for it.
func (o *demoOutput) await(t *testing.T, re *regexp.Regexp, timeout time.Duration) string {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		if m := re.FindStringSubmatch(o.text()); m != nil {
			return m[1]
		}
		select {
		case <-o.added:
		case <-time.After(200 * time.Millisecond):
		case <-deadline.C:
			t.Fatalf("the demo printed no %q within %s; its output:\n%s", re, timeout, o.text())
		}
	}
}

// statusReport is the part of `kubeclip status -o json` the test reads (docs/monitoring.md, `kubeclip status`).
type statusReport struct {
	Leases struct {
		Complete  bool `json:"complete"`
		Companies []struct {
			Company string         `json:"company"`
			Live    int            `json:"live"`
			States  map[string]int `json:"states"`
		} `json:"companies"`
		OldestLive []struct {
			Company string `json:"company"`
			Run     string `json:"run"`
			Lease   string `json:"lease"`
			State   string `json:"state"`
		} `json:"oldestLive"`
	} `json:"leases"`
	Metrics bool `json:"metrics"`
}

// TestStatusShowsTheDemosLease runs `kubeclip demo` with a run long enough to look at and, while
// its lease is live, `kubeclip status` against the demo's NATS (the URL the demo prints): the
// lease is there by id, with its company and run, in -o json and on the text screen.
func TestStatusShowsTheDemosLease(t *testing.T) {
	cs := clustertest.Clientset(t)
	ns := pt.NamespaceOf(t, demoCompany)
	if _, err := cs.CoreV1().Namespaces().Get(t.Context(), ns, metav1.GetOptions{}); apierrors.IsNotFound(err) {
		pt.CleanupTenant(t, cs, demoCompany) // the demo's tenant is this test's: remove it after
	}
	cfg := filepath.Join(t.TempDir(), "demo.json")
	// The demo's own agent stub, printing long enough (60 lines, 15 s) for status to find it live.
	if err := os.WriteFile(cfg, pt.StubConfig(map[string]string{"STUB_LINES": "60", "STUB_INTERVAL": "250ms"}), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	demo := exec.CommandContext(ctx, filepath.Join(bin, pt.CLI), "demo", "--kubeconfig", clustertest.Kubeconfig(), "--config", cfg)
	demo.Cancel = func() error { return demo.Process.Signal(os.Interrupt) }
	demo.WaitDelay = 30 * time.Second
	var stderr bytes.Buffer
	demo.Stderr = &stderr
	stdout, err := demo.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := demo.Start(); err != nil {
		t.Fatal(err)
	}
	out := &demoOutput{added: make(chan struct{}, 1)}
	read := make(chan struct{})
	go func() { out.read(stdout); close(read) }()
	waited := false
	defer func() {
		if !waited {
			cancel()
			<-read
			_ = demo.Wait()
		}
	}()

	natsURL := out.await(t, regexp.MustCompile(`(?m)^embedded JetStream at (\S+)$`), time.Minute)
	runID := out.await(t, regexp.MustCompile(`acquire published: company `+demoCompany+`, agent \S+, run (\S+)`), time.Minute)
	leaseID := out.await(t, regexp.MustCompile(`\[created\]\s+lease (\S+):`), 2*time.Minute)

	status := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, filepath.Join(bin, pt.CLI), append([]string{"status", "--nats-url", natsURL}, args...)...)
		var so, se bytes.Buffer
		cmd.Stdout, cmd.Stderr = &so, &se
		if err := cmd.Run(); err != nil {
			t.Fatalf("kubeclip status %v: %v\n%s%s", args, err, so.String(), se.String())
		}
		return so.String()
	}
	var r statusReport
	if err := json.Unmarshal([]byte(status("-o", "json")), &r); err != nil {
		t.Fatalf("decoding status -o json: %v", err)
	}
	screen := status("--company", demoCompany)

	found := false
	for _, l := range r.Leases.OldestLive {
		if l.Lease == leaseID && l.Company == demoCompany && l.Run == runID {
			found = true
		}
	}
	if !r.Leases.Complete || !found || r.Metrics {
		t.Errorf("status -o json: complete %v, metrics %v, the demo's lease %s (company %s, run %s) among the oldest live: %v; got %+v",
			r.Leases.Complete, r.Metrics, leaseID, demoCompany, runID, found, r.Leases)
	}
	if !regexp.MustCompile(`(?m)^`+demoCompany+`\s+`+regexp.QuoteMeta(runID)+`\s+`+regexp.QuoteMeta(leaseID)+`\s+(created|dispatching)\s`).MatchString(screen) ||
		!strings.Contains(screen, "no --metrics-url given") {
		t.Errorf("status's screen shows no live lease %s of run %s of %s, or does not say it read NATS only:\n%s", leaseID, runID, demoCompany, screen)
	}

	// The demo goes on to its result and its release, as without status.
	<-read
	err = demo.Wait()
	waited = true
	if err != nil {
		t.Fatalf("the demo ended with %v\nstdout:\n%s\nstderr:\n%s", err, out.text(), stderr.String())
	}
	if !strings.Contains(out.text(), "[released] lease "+leaseID) {
		t.Errorf("the demo did not release its lease:\n%s", out.text())
	}
}
