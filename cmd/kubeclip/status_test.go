package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/internal/ops"
	"github.com/kubeclip/kubeclip/pkg/api"
	"github.com/kubeclip/kubeclip/pkg/broker/brokersvc"
	"github.com/kubeclip/kubeclip/pkg/dispatch"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// statusNow is the golden report's clock.
var statusNow = time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)

// setUpStatusNATS creates the streams, buckets and worker consumers as the workers do (the
// buckets of the dispatcher, run-watcher and exec-worker are left out: their rows say absent),
// and serves the queues service on js's connection as the tenant-worker does (answering the
// clients', the status user's and the test connections' inboxes).
func setUpStatusNATS(t *testing.T, js jetstream.JetStream, s events.Subjects) {
	t.Helper()
	ctx := t.Context()
	if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := lease.EnsureBuckets(ctx, js, lease.BucketOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []jetstream.StreamConfig{events.RetryStreamConfig(1, 0), dispatch.ParkedStreamConfig(1, 0)} {
		if _, err := events.EnsureStream(ctx, js, cfg); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		stream string
		cfg    jetstream.ConsumerConfig
	}{
		{s.LeaseStream(), events.TenantWorkerConsumerConfig(s)},
		{events.RetryStream, events.RetryConsumerConfig(events.TenantWorkerConsumer)},
		{events.WorkStream, events.DispatcherConsumerConfig()},
		{s.LeaseStream(), events.DispatcherEndConsumerConfig(s)},
		{s.RunStream(), events.DispatcherResultConsumerConfig(s)},
	} {
		if _, err := events.EnsureConsumer(ctx, js, c.stream, c.cfg); err != nil {
			t.Fatal(err)
		}
	}
	replies := inbox.MustRule(append(inbox.DefaultClientPrefixes(), "_INBOX")...)
	if _, err := api.ServeQueues(ctx, js.Conn(), api.ServeOptions{Subjects: s, Replies: replies, Logger: zerolog.New(zerolog.NewTestWriter(t))}, js); err != nil {
		t.Fatal(err)
	}
}

// workerMetrics serves a worker's /metrics as the worker does (internal/app.StartOps): the Go
// and process collectors, the worker metrics with two exec streams, and the self-check's
// gauges, one permission missing.
func workerMetrics(t *testing.T) *httptest.Server {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := ops.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.ExecSessions(3)
	m.ExecSessions(-1)
	// The self-check's gauges as the selfcheck change names them (internal/ops/selfcheck.go).
	ok := prometheus.NewGauge(prometheus.GaugeOpts{Name: metricSelfCheckOK, Help: "1 when the start-up self-check found every permission."})
	missing := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricPermissionMissing, Help: "1 for each permission the self-check found missing."}, []string{"kind", "permission"})
	reg.MustRegister(ok, missing)
	ok.Set(0)
	missing.WithLabelValues("nats", "publish $JS.API.STREAM.INFO.KUBECLIP_WORK").Set(1)
	missing.WithLabelValues("kubernetes", "create pods/exec in kubeclip tenants").Set(1)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	t.Cleanup(srv.Close)
	return srv
}

// TestStatusGolden pins `kubeclip status -o json` (and its text) for an installation set up by
// the real code: leases written through pkg/lease, acquires published by the real publisher and
// one taken and acknowledged by the tenant-worker's consumer, one taken and not, a worker's
// metrics page and a worker that does not answer.
func TestStatusGolden(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t, goleak.IgnoreCurrent()) })
	_, _, js := natstest.Start(t)
	s, err := events.NewSubjects("")
	if err != nil {
		t.Fatal(err)
	}
	setUpStatusNATS(t, js, s)
	ctx := t.Context()

	kv, err := js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	records := lease.Records{KV: kv}
	ago := func(d time.Duration) time.Time { return statusNow.Add(-d) }
	for _, rec := range []lease.Record{
		{CompanyID: "acme", RunID: "run-1", State: lease.StateCreated, Namespace: "kubeclip-t-acme", WorkloadName: "pc-run-1", Backend: "job", CreatedAt: ago(90 * time.Minute)},
		{CompanyID: "acme", RunID: "run-2", State: lease.StateDispatching, Namespace: "kubeclip-t-acme", WorkloadName: "pc-run-2", Backend: "pod", CreatedAt: ago(3 * time.Minute)},
		{CompanyID: "acme", RunID: "run-3", State: lease.StateFailed, Failure: events.CodeInvalidConfig, CreatedAt: ago(time.Hour)},
		{CompanyID: "beta", RunID: "run-4", State: lease.StateRequested, CreatedAt: ago(10 * time.Second)},
		{CompanyID: "beta", RunID: "run-5", State: lease.StateReleased, Namespace: "kubeclip-t-beta", WorkloadName: "pc-run-5", Backend: "job", CreatedAt: ago(2 * time.Hour)},
		{CompanyID: "beta", RunID: "run-6", State: lease.StateCreated, Namespace: "kubeclip-t-beta", WorkloadName: "pc-run-6", Backend: "job", CreatedAt: ago(20 * time.Minute)},
		{CompanyID: "gamma", RunID: "run-7", State: lease.StateRetained, Namespace: "kubeclip-t-gamma", WorkloadName: "pc-run-7", Backend: "pod", Reusable: true, CreatedAt: ago(time.Minute)},
	} {
		if _, created, err := records.Create(ctx, rec); err != nil || !created {
			t.Fatalf("creating %s's record: created %v, %v", rec.RunID, created, err)
		}
	}
	// A value in the bucket that is not a lease record.
	if _, err := kv.Put(ctx, "acme.not-json", []byte("{")); err != nil {
		t.Fatal(err)
	}

	pub, err := events.NewPublisher(events.PublisherOptions{JS: js, Subjects: s, Now: func() time.Time { return statusNow }})
	if err != nil {
		t.Fatal(err)
	}
	for _, run := range []string{"run-8", "run-9", "run-10"} {
		req := events.AcquireRequest{CompanyID: "acme", AgentID: "agent-1", RunID: run, EnvironmentID: "local", Config: json.RawMessage(`{"backend":"job"}`)}
		if _, err := pub.Publish(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	// The tenant-worker takes two: it acknowledges the first and is still on the second.
	cons, err := js.Consumer(ctx, s.LeaseStream(), events.TenantWorkerConsumer)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(2, jetstream.FetchMaxWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	var taken []jetstream.Msg
	for m := range batch.Messages() {
		taken = append(taken, m)
	}
	if len(taken) != 2 {
		t.Fatalf("fetched %d acquires, want 2", len(taken))
	}
	if err := taken[0].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}

	spendThroughBroker(t, js)

	metrics := workerMetrics(t)
	client := &http.Client{}
	t.Cleanup(client.CloseIdleConnections)
	src := statusSource{JS: js, Subjects: s, HTTP: client, Now: func() time.Time { return statusNow }}
	opts := statusOptions{
		MetricsURLs: []string{metrics.URL + "/metrics", "http://operator:hunter2@127.0.0.1:1/metrics"},
		Output:      "json", Interval: time.Second, Timeout: 10 * time.Second, LeaseScanLimit: 100, OldestLive: 3,
	}
	r, err := collectStatus(ctx, src, opts)
	if err != nil {
		t.Fatal(err)
	}

	// The oldest pending acquire's time is the server's: check it, then zero it for the file.
	for i, c := range r.Consumers {
		if c.Consumer != events.TenantWorkerConsumer {
			continue
		}
		if c.OldestPendingAt == nil || time.Since(*c.OldestPendingAt) > time.Minute || c.OldestPendingSeq != 2 {
			t.Fatalf("tenant-worker's oldest pending: seq %d at %v, want seq 2 of the last minute", c.OldestPendingSeq, c.OldestPendingAt)
		}
		r.Consumers[i].OldestPendingAt, r.Consumers[i].OldestPendingAgeSeconds = &time.Time{}, 0
	}
	for i := range r.Workers {
		r.Workers[i].URL = strings.Replace(r.Workers[i].URL, metrics.URL, "http://worker", 1)
	}

	var jsonOut, textOut bytes.Buffer
	if err := writeStatus(&jsonOut, r, "json"); err != nil {
		t.Fatal(err)
	}
	if err := writeStatus(&textOut, r, "text"); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(jsonOut.String()+textOut.String(), "hunter2") {
		t.Error("a metrics URL's password is in the report")
	}
	golden(t, "status.json.golden", jsonOut.Bytes())
	golden(t, "status.txt.golden", textOut.Bytes())
}

// spendThroughBroker has the credential broker's budgets (two replicas, as two processes
// would) count brokered calls at statusNow: acme 3 calls and 1,500 tokens, beta 1 call and 42
// tokens, and a call of acme's the day before, which today's report leaves out.
func spendThroughBroker(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	kv, err := events.EnsureBucket(t.Context(), js, events.BudgetBucketConfig(1, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	type call struct {
		company string
		tokens  int64
	}
	for _, c := range []struct {
		now   time.Time
		calls []call
	}{
		{statusNow, []call{{"acme", 1000}, {"acme", 400}, {"beta", 42}}},
		{statusNow, []call{{"acme", 100}}},
		{statusNow.Add(-24 * time.Hour), []call{{"acme", 9999}}},
	} {
		b, err := brokersvc.NewBudgets(brokersvc.BudgetOptions{KV: kv, Now: func() time.Time { return c.now }, Log: zerolog.New(zerolog.NewTestWriter(t))})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- b.Run(ctx) }()
		for _, call := range c.calls {
			if rej := b.Admit(t.Context(), call.company); rej != nil {
				t.Fatalf("admitting %s: %s", call.company, rej.Message)
			}
			b.Spent(call.company, call.tokens)
		}
		cancel() // its last flush writes the spend
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s (-want +got):\n%s", path, diff)
	}
}

// TestStatusLeaseScanBounds: the scan stops at its limit and says so, counts at most
// maxStatusCompanies companies one by one (the rest together), keeps only the oldest live
// leases asked for, and --company reads one company's records only.
func TestStatusLeaseScanBounds(t *testing.T) {
	_, _, js := natstest.Start(t)
	s, err := events.NewSubjects("")
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := lease.EnsureBuckets(ctx, js, lease.BucketOptions{}); err != nil {
		t.Fatal(err)
	}
	const companies, perCompany = maxStatusCompanies + 200, 2
	put := func(rec lease.Record) {
		data, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		// Async puts: the records' content is lease.Record's, the bucket the real one.
		if _, err := js.PublishAsync("$KV."+lease.Bucket+"."+rec.Ref().Key(), data); err != nil {
			t.Fatal(err)
		}
	}
	record := func(i int, state lease.State) lease.Record {
		return lease.Record{
			CompanyID: fmt.Sprintf("co-%04d", i%companies), RunID: fmt.Sprintf("run-%05d", i),
			State: state, CreatedAt: statusNow.Add(-time.Duration(i) * time.Second),
		}
	}
	for i := range companies * perCompany {
		put(record(i, lease.StateCreated))
	}
	// The runs of the first 600 records finish, then are released: two more revisions of each
	// of those keys after every first one, so the middle revisions lie between the last values
	// and only each key's last value may be counted.
	for _, state := range []lease.State{lease.StateFinished, lease.StateReleased} {
		for i := range 600 {
			put(record(i, state))
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("the records were not stored within 30s")
	}
	src := statusSource{JS: js, Subjects: s, HTTP: &http.Client{}, Now: func() time.Time { return statusNow }}
	base := statusOptions{Output: "json", Interval: time.Second, Timeout: 30 * time.Second, OldestLive: 2}
	total := companies * perCompany

	for _, tc := range []struct {
		name          string
		company       string
		limit         int
		wantScanned   int
		wantPartial   string
		wantLive      int
		wantCompanies int
		wantOthers    int
		wantOldest    []string
	}{
		{name: "all", limit: total, wantScanned: total, wantLive: total - 600, wantCompanies: maxStatusCompanies, wantOthers: 200 * perCompany, wantOldest: []string{"run-02399", "run-02398"}},
		{name: "stops at the limit", limit: 500, wantScanned: 500, wantPartial: "limit", wantLive: 500, wantCompanies: 500},
		{name: "one company", company: "co-0007", limit: total, wantScanned: perCompany, wantLive: 1, wantCompanies: 1, wantOldest: []string{"run-01207"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			o.Company, o.LeaseScanLimit = tc.company, tc.limit
			r, err := collectStatus(ctx, src, o)
			if err != nil {
				t.Fatal(err)
			}
			l := r.Leases
			if l.Error != "" || l.Scanned != tc.wantScanned || l.Partial != tc.wantPartial || l.Complete != (tc.wantPartial == "") {
				t.Fatalf("scanned %d, partial %q, complete %v, error %q; want %d, %q", l.Scanned, l.Partial, l.Complete, l.Error, tc.wantScanned, tc.wantPartial)
			}
			live := 0
			for _, c := range append(l.Companies, companyLeases{}) {
				live += c.Live
			}
			if l.OtherCompanies != nil {
				live += l.OtherCompanies.Live
			}
			if live != tc.wantLive {
				t.Errorf("%d live leases, want %d", live, tc.wantLive)
			}
			if len(l.Companies) != tc.wantCompanies {
				t.Errorf("%d companies counted one by one, want %d", len(l.Companies), tc.wantCompanies)
			}
			others := 0
			if l.OtherCompanies != nil {
				others = l.OtherCompanies.Total
			}
			if others != tc.wantOthers {
				t.Errorf("%d leases counted under other companies, want %d", others, tc.wantOthers)
			}
			if tc.wantOldest != nil {
				var got []string
				for _, x := range l.OldestLive {
					got = append(got, x.Run)
				}
				if diff := cmp.Diff(tc.wantOldest, got); diff != "" {
					t.Errorf("oldest live (-want +got):\n%s", diff)
				}
			}
		})
	}
	// Each scan deleted its consumer: a --watch does not pile them up on the bucket.
	st, err := js.Stream(ctx, "KV_"+lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Consumers; n != 0 {
		t.Errorf("%d consumers left on the lease bucket after the scans", n)
	}
}

// TestStatusFlags: a bad setting is a usage error naming the flag, before anything connects.
func TestStatusFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"bad output", []string{"status", "-o", "yaml"}, "--output (KUBECLIP_OUTPUT) must be text or json"},
		{"bad interval", []string{"status", "--watch", "--interval", "0s"}, "--interval (KUBECLIP_STATUS_INTERVAL) must be > 0"},
		{"bad timeout", []string{"status", "--timeout", "-1s"}, "--timeout (KUBECLIP_STATUS_TIMEOUT) must be > 0"},
		{"bad limit", []string{"status", "--lease-scan-limit", "0"}, "--lease-scan-limit (KUBECLIP_LEASE_SCAN_LIMIT) must be > 0"},
		{"too many oldest", []string{"status", "--oldest", "101"}, "--oldest (KUBECLIP_STATUS_OLDEST) must be between 0 and 100"},
		{"bad company", []string{"status", "--company", "a.b"}, "--company (KUBECLIP_COMPANY): companyId"},
		{"metrics URL without a scheme", []string{"status", "--metrics-url", "dispatcher:8080/metrics"}, "--metrics-url (KUBECLIP_METRICS_URLS)"},
		{"metrics URL's password not repeated", []string{"status", "--metrics-url", "ftp://u:hunter2@h/metrics"}, `"ftp://h/metrics" is not an http(s) URL`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := run(t.Context(), tc.args, func(string) (string, bool) { return "", false }, &out, &out)
			if app.ExitCode(err) != 2 || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("got %v (exit %d), want a usage error with %q", err, app.ExitCode(err), tc.wantErr)
			}
		})
	}
}

// TestStatusWatchEndsOnCancel: --watch redraws until its context ends, then returns without
// an error, and writes one report per draw (no screen clearing into a buffer).
func TestStatusWatchEndsOnCancel(t *testing.T) {
	srv, _, js := natstest.Start(t)
	s, err := events.NewSubjects("")
	if err != nil {
		t.Fatal(err)
	}
	setUpStatusNATS(t, js, s)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	out := &lockedBuffer{}
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"status", "--watch", "--interval", "10ms", "-o", "json", "--nats-url", srv.ClientURL()},
			func(string) (string, bool) { return "", false }, out, out)
	}()
	deadline := time.Now().Add(20 * time.Second)
	for strings.Count(out.String(), `"time"`) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than 3 reports in 20s: %q", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("watch ended with %v", err)
	}
	if strings.Contains(out.String(), "\033[") {
		t.Error("the screen was cleared on a stream that is not a terminal")
	}
}

// lockedBuffer is a bytes.Buffer a test reads while the command writes it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// BenchmarkStatusLeaseScan measures one collection over a lease bucket of 10,000 and 100,000
// records (3 states, 500 companies) on an in-process server; the CLI's own memory is measured
// as the binary's peak RSS (docs/monitoring.md, `kubeclip status`), since the server shares this process's heap.
func BenchmarkStatusLeaseScan(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
			_, _, js := natstest.Start(b)
			s, err := events.NewSubjects("")
			if err != nil {
				b.Fatal(err)
			}
			ctx := b.Context()
			if err := lease.EnsureBuckets(ctx, js, lease.BucketOptions{}); err != nil {
				b.Fatal(err)
			}
			states := []lease.State{lease.StateCreated, lease.StateFinished, lease.StateReleased}
			for i := range n {
				rec := lease.Record{
					CompanyID: fmt.Sprintf("co-%03d", i%500), RunID: fmt.Sprintf("run-%06d", i), State: states[i%3],
					Namespace: "kubeclip-t-co", WorkloadName: fmt.Sprintf("pc-run-%06d", i), Backend: "job",
					CreatedAt: statusNow.Add(-time.Duration(i) * time.Second),
				}
				data, err := json.Marshal(rec)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := js.PublishAsync("$KV."+lease.Bucket+"."+rec.Ref().Key(), data); err != nil {
					b.Fatal(err)
				}
			}
			select {
			case <-js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				b.Fatal("the records were not stored within a minute")
			}
			src := statusSource{JS: js, Subjects: s, HTTP: &http.Client{}, Now: func() time.Time { return statusNow }}
			o := statusOptions{Output: "json", Interval: time.Second, Timeout: time.Minute, LeaseScanLimit: defaultLeaseScanLimit, OldestLive: defaultOldestLiveLeases}
			for b.Loop() {
				r, err := collectStatus(ctx, src, o)
				if err != nil || !r.Leases.Complete || r.Leases.Scanned != n {
					b.Fatalf("scanned %d of %d, complete %v, %v", r.Leases.Scanned, n, r.Leases.Complete, err)
				}
			}
			b.ReportMetric(float64(n)/(b.Elapsed().Seconds()/float64(b.N)), "records/s")
		})
	}
}

// TestScrapeWorker: a page that cannot be read or parsed makes its worker unreachable with an
// error naming the URL (never its user information); a page past maxMetricsPageBytes is refused,
// read no further than the bound.
func TestScrapeWorker(t *testing.T) {
	good := "# TYPE kubeclip_exec_streams gauge\nkubeclip_exec_streams 3\n# TYPE kubeclip_self_check_ok gauge\nkubeclip_self_check_ok 1\n"
	for _, tc := range []struct {
		name    string
		status  int
		body    string
		want    workerStatus
		wantErr string
	}{
		{name: "a worker's page", status: http.StatusOK, body: good, want: workerStatus{Reachable: true, ExecStreams: 3}},
		{name: "an error status", status: http.StatusServiceUnavailable, body: good, wantErr: ": status 503 Service Unavailable"},
		{name: "not the text format", status: http.StatusOK, body: "<html>", wantErr: ": parsing the page: "},
		{name: "too large", status: http.StatusOK, body: "# " + strings.Repeat("x", maxMetricsPageBytes) + "\n", wantErr: fmt.Sprintf(": the page is over %d bytes", maxMetricsPageBytes)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(tc.status)
				_, _ = w.Write([]byte(tc.body))
			}))
			defer srv.Close()
			client := &http.Client{}
			defer client.CloseIdleConnections()
			url := strings.Replace(srv.URL, "http://", "http://operator:hunter2@", 1) + "/metrics"
			got := scrapeWorker(t.Context(), client, url)
			if tc.wantErr != "" {
				wantPrefix := "scraping " + srv.URL + "/metrics"
				if got.Reachable || !strings.HasPrefix(got.Error, wantPrefix) || !strings.Contains(got.Error, tc.wantErr) {
					t.Fatalf("got %+v, want unreachable with %q…%q", got, wantPrefix, tc.wantErr)
				}
				return
			}
			if got.Error != "" || !got.Reachable || got.ExecStreams != tc.want.ExecStreams || got.SelfCheckOK == nil || !*got.SelfCheckOK {
				t.Fatalf("got %+v, want %+v with self-check ok", got, tc.want)
			}
			if strings.Contains(got.URL, "hunter2") {
				t.Errorf("the URL keeps its password: %s", got.URL)
			}
		})
	}
}
