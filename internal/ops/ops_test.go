package ops_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/internal/ops"
	"github.com/kubeclip/kubeclip/pkg/events"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// cmd/run-watcher passes *ops.Metrics as a runwatch.Observer, which checks that interface.
var _ events.Observer = (*ops.Metrics)(nil)

// serve starts a Server on a random loopback port and returns its base URL.
func serve(t *testing.T, reg *prometheus.Registry) (*ops.Server, string) {
	t.Helper()
	return serveWith(t, ops.Options{Gatherer: reg})
}

// serveWith starts a Server with opts on a random loopback port and returns its base URL.
func serveWith(t *testing.T, opts ops.Options) (*ops.Server, string) {
	t.Helper()
	opts.Addr, opts.Logger = "127.0.0.1:0", zerolog.New(zerolog.NewTestWriter(t))
	s, err := ops.Listen(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return s, "http://" + s.Addr().String()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url) //nolint:noctx // a test against a loopback server
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestProfiling: /debug/pprof/ is served only when Profiling is on.
func TestProfiling(t *testing.T) {
	for _, tc := range []struct {
		profiling bool
		wantCode  int
	}{{false, http.StatusNotFound}, {true, http.StatusOK}} {
		_, base := serveWith(t, ops.Options{Gatherer: prometheus.NewRegistry(), Profiling: tc.profiling})
		for _, path := range []string{"/debug/pprof/", "/debug/pprof/heap", "/debug/pprof/goroutine?debug=1"} {
			if code, _ := get(t, base+path); code != tc.wantCode {
				t.Errorf("Profiling %v: GET %s = %d, want %d", tc.profiling, path, code, tc.wantCode)
			}
		}
	}
}

func TestReadiness(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, base := serve(t, reg)
	reg.MustRegister(s.ReadyGauge())
	pass := ops.Check{Name: "nats", Func: func(context.Context) error { return nil }}
	fail := ops.Check{Name: "kubernetes", Func: func(context.Context) error { return errors.New("connection refused") }}
	slow := ops.Check{Name: "slow", Func: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() }}

	steps := []struct {
		name     string
		do       func()
		wantCode int
		wantBody string
	}{
		{"before the worker started", func() {}, http.StatusServiceUnavailable, "not ready: starting\n"},
		{"every check passes", func() { s.SetReady(pass) }, http.StatusOK, "ok nats\n"},
		{"one check fails", func() { s.SetReady(pass, fail) }, http.StatusServiceUnavailable, "ok nats\nfail kubernetes: connection refused\n"},
		{"a check outlives the timeout", func() { s.SetReady(slow) }, http.StatusServiceUnavailable, "fail slow: context deadline exceeded\n"},
		{"shutting down", func() { s.SetReady(pass); s.Stopping() }, http.StatusServiceUnavailable, "not ready: shutting down\n"},
	}
	for _, st := range steps {
		st.do()
		code, body := get(t, base+"/readyz")
		if code != st.wantCode || body != st.wantBody {
			t.Errorf("%s: /readyz = %d %q, want %d %q", st.name, code, body, st.wantCode, st.wantBody)
		}
		// kubeclip_ready says what /readyz says.
		if ready, want := value(t, reg, "kubeclip_ready"), st.wantCode == http.StatusOK; (ready == 1) != want {
			t.Errorf("%s: kubeclip_ready = %v, want ready %v", st.name, ready, want)
		}
		// Liveness never depends on readiness.
		if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
			t.Errorf("%s: /healthz = %d, want 200", st.name, code)
		}
	}
}

func TestListenRefusesABusyPort(t *testing.T) {
	s, _ := serve(t, prometheus.NewRegistry())
	_, err := ops.Listen(ops.Options{Addr: s.Addr().String(), Gatherer: prometheus.NewRegistry()})
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Listen on a busy port = %v, want address already in use", err)
	}
}

func TestMetricsFollowObservations(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := ops.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	_, base := serve(t, reg)

	settle := func(attempt uint64, fate events.Fate, code events.Code) {
		m.MessageSettled(events.Settlement{
			Consumer: "tenant-worker", Subject: "paperclip.lease.c1.acquire", Attempt: attempt,
			Fate: fate, Code: code, HandlerDuration: 30 * time.Millisecond,
		})
	}
	settle(1, events.FateAcked, "")
	settle(1, events.FateRetried, "")
	settle(2, events.FateTerminated, events.CodeInternal)
	log := events.RunLogEvent{RunID: "r1", CompanyID: "c1", Lines: []events.LogLine{{Text: "hello"}, {Text: "world!"}}}
	m.EventPublished(events.Publication{Subject: "paperclip.run.c1.r1.log", Event: log, Duration: time.Millisecond})
	m.EventPublished(events.Publication{Subject: "paperclip.run.c1.r1.log", Event: log, Duplicate: true})
	m.EventPublished(events.Publication{Subject: "paperclip.run.c1.r1.status", Err: errors.New("timeout")})
	m.EventPublished(events.Publication{Subject: "paperclip.run.c1.r1.log", Err: &jetstream.APIError{Code: 400}})
	m.RunsInFlight(1)
	m.RunsInFlight(1)
	m.RunsInFlight(-1)

	want := `
# HELP kubeclip_events_published_total Publish calls, by subject pattern and outcome (stored, duplicate, rejected, error).
# TYPE kubeclip_events_published_total counter
kubeclip_events_published_total{outcome="duplicate",subject="paperclip.run.*.*.log"} 1
kubeclip_events_published_total{outcome="error",subject="paperclip.run.*.*.status"} 1
kubeclip_events_published_total{outcome="rejected",subject="paperclip.run.*.*.log"} 1
kubeclip_events_published_total{outcome="stored",subject="paperclip.run.*.*.log"} 1
# HELP kubeclip_log_bytes_total Bytes of agent log lines published as log events (first stores only, not duplicates).
# TYPE kubeclip_log_bytes_total counter
kubeclip_log_bytes_total 11
# HELP kubeclip_log_lines_total Agent log lines published as log events (first stores only, not duplicates).
# TYPE kubeclip_log_lines_total counter
kubeclip_log_lines_total 2
# HELP kubeclip_message_redeliveries_total Settled deliveries that were redeliveries (attempt > 1), by consumer and subject pattern.
# TYPE kubeclip_message_redeliveries_total counter
kubeclip_message_redeliveries_total{consumer="tenant-worker",subject="paperclip.lease.*.acquire"} 1
# HELP kubeclip_messages_consumed_total Messages settled by the consume loop, by consumer, subject pattern and fate (acked, retried, deferred, terminated, handed_back).
# TYPE kubeclip_messages_consumed_total counter
kubeclip_messages_consumed_total{consumer="tenant-worker",fate="acked",subject="paperclip.lease.*.acquire"} 1
kubeclip_messages_consumed_total{consumer="tenant-worker",fate="retried",subject="paperclip.lease.*.acquire"} 1
kubeclip_messages_consumed_total{consumer="tenant-worker",fate="terminated",subject="paperclip.lease.*.acquire"} 1
# HELP kubeclip_runs_in_flight Runs the run-watcher follows that have no result yet.
# TYPE kubeclip_runs_in_flight gauge
kubeclip_runs_in_flight 1
# HELP kubeclip_terminal_failures_total Messages that failed for good (a failed event was published), by consumer, subject pattern and failure code.
# TYPE kubeclip_terminal_failures_total counter
kubeclip_terminal_failures_total{code="internal",consumer="tenant-worker",subject="paperclip.lease.*.acquire"} 1
`
	names := []string{
		"kubeclip_events_published_total", "kubeclip_log_bytes_total", "kubeclip_log_lines_total",
		"kubeclip_message_redeliveries_total", "kubeclip_messages_consumed_total",
		"kubeclip_runs_in_flight", "kubeclip_terminal_failures_total",
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(reg, "kubeclip_handler_duration_seconds"); n != 3 {
		t.Errorf("handler duration series = %d, want 3 (one per fate)", n)
	}

	// The same numbers over HTTP, in the Prometheus text format.
	code, body := get(t, base+"/metrics")
	if code != http.StatusOK || !strings.Contains(body, `kubeclip_log_bytes_total 11`) {
		t.Errorf("/metrics = %d, want 200 with kubeclip_log_bytes_total 11:\n%s", code, body)
	}
}

func TestSubjectPattern(t *testing.T) {
	tests := []struct{ subject, want string }{
		{"paperclip.lease.7d2f1c9e.acquire", "paperclip.lease.*.acquire"},
		{"acme.lease.c.release", "acme.lease.*.release"},
		{"paperclip.run.c1.r1.log", "paperclip.run.*.*.log"},
		{"kubeclip.dispatch.c1.r1", "kubeclip.dispatch.*.*"},
		{"work.c1.r0", "other"},
		{"", "none"},
	}
	for _, tc := range tests {
		if got := ops.SubjectPattern(tc.subject); got != tc.want {
			t.Errorf("SubjectPattern(%q) = %q, want %q", tc.subject, got, tc.want)
		}
	}
}
