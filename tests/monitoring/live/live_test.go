// Package live runs the real worker binaries (internal/pipelinetest: a JetStream server and the
// local cluster) through one run and reads their /metrics: the series the dashboard and the
// alerts of deploy/kustomize/components/monitoring query are there and moved, and none carries a
// run id.
package live

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// env is one JetStream server and one replica of each worker, each serving /metrics on a port
// of its own choosing (the address is in its log).
var env *pt.Env

func TestMain(m *testing.M) {
	ops := []string{"--ops-addr", "127.0.0.1:0"}
	os.Exit(pt.Main(m, pt.Options{
		Name: "monitoring", ClusterLock: true,
		Args: map[string][]string{pt.TenantWorker: ops, pt.Dispatcher: ops, pt.RunWatcher: ops},
	}, &env))
}

const runTimeout = 90 * time.Second

// TestWorkersExportWhatTheDashboardQueries runs one Job run and then checks each worker's
// scrape: lease counts, acquire latencies, consumer lag, stream usage, Kubernetes requests and
// readiness.
func TestWorkersExportWhatTheDashboardQueries(t *testing.T) {
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	r := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(map[string]string{"STUB_LINES": "3"}))
	pt.WaitKind[events.RunCreatedEvent](r, runTimeout)
	if res := pt.WaitKind[events.RunResultEvent](r, runTimeout); res.Outcome != events.OutcomeSucceeded {
		t.Fatalf("result %+v, want succeeded", res)
	}
	runsStream := env.Subjects.RunStream()

	type want struct {
		metric  string
		labels  map[string]string
		atLeast float64
	}
	every := []want{
		{"kubeclip_ready", nil, 1},
		{"kubeclip_jetstream_scrape_ok", nil, 1},
		{"kubeclip_stream_bytes", map[string]string{"stream": runsStream}, 1},
		{"kubeclip_stream_max_bytes", map[string]string{"stream": runsStream}, 1},
		{"kubeclip_stream_messages", map[string]string{"stream": env.Subjects.LeaseStream()}, 1},
		{"kubeclip_kubernetes_requests_total", map[string]string{"method": "GET", "code": "200"}, 1},
	}
	perWorker := map[string][]want{
		pt.TenantWorker: append(every,
			want{"kubeclip_consumer_ack_floor_sequence", map[string]string{"consumer": events.TenantWorkerConsumer}, 1},
			want{"kubeclip_consumer_pending", map[string]string{"consumer": events.TenantWorkerConsumer}, 0},
		),
		pt.Dispatcher: append(every,
			want{"kubeclip_acquire_created_seconds_count", nil, 1},
			want{"kubeclip_leases", map[string]string{"company": company}, 1},
			want{"kubeclip_leases_read_ok", nil, 1},
			want{"kubeclip_consumer_ack_floor_sequence", map[string]string{"consumer": events.DispatcherConsumer}, 1},
			want{"kubeclip_consumer_ack_floor_sequence", map[string]string{"consumer": events.DispatcherResultConsumer}, 1},
			want{"kubeclip_consumer_ack_pending", map[string]string{"consumer": events.DispatcherEndConsumer}, 0},
		),
		pt.RunWatcher: append(every,
			want{"kubeclip_acquire_ready_seconds_count", nil, 1},
			want{"kubeclip_runs_in_flight", nil, 0},
		),
	}
	for kind, wants := range perWorker {
		url := "http://" + opsAddr(t, kind) + "/metrics"
		var fams map[string]*dto.MetricFamily
		var missing []string
		for deadline := time.Now().Add(30 * time.Second); ; {
			fams, missing = scrape(t, url), nil
			for _, w := range wants {
				if v, ok := value(fams, w.metric, w.labels); !ok || v < w.atLeast {
					missing = append(missing, fmt.Sprintf("%s%v = %v (found: %v), want >= %v", w.metric, w.labels, v, ok, w.atLeast))
				}
			}
			if len(missing) == 0 || time.Now().After(deadline) {
				break
			}
			select {
			case <-t.Context().Done():
				t.Fatal(t.Context().Err())
			case <-time.After(time.Second): // the next scrape
			}
		}
		if len(missing) > 0 {
			t.Errorf("%s after 30s: %s", kind, strings.Join(missing, "; "))
		}
		// Bounded labels: no series names the run.
		for name, f := range fams {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if strings.Contains(l.GetValue(), r.RunID) {
						t.Errorf("%s: %s has label %s=%q, the run's id", kind, name, l.GetName(), l.GetValue())
					}
				}
			}
		}
	}
}

// opsAddr is where the worker of kind serves /metrics, from its log.
func opsAddr(t *testing.T, kind string) string {
	t.Helper()
	workers := env.Workers(kind)
	if len(workers) != 1 {
		t.Fatalf("%d %s workers, want 1", len(workers), kind)
	}
	f, err := os.Open(workers[0].LogPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec struct{ Message, Addr string }
		if json.Unmarshal(sc.Bytes(), &rec) == nil && strings.HasPrefix(rec.Message, "serving /healthz") && rec.Addr != "" {
			return rec.Addr
		}
	}
	t.Fatalf("%s's log does not say where it serves /metrics", kind)
	return ""
}

func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parsing %s: %v", url, err)
	}
	return fams
}

// value sums the series of metric whose labels include labels; ok is false when there is none.
// A histogram's <name>_count is its sample count.
func value(fams map[string]*dto.MetricFamily, metric string, labels map[string]string) (v float64, ok bool) {
	f, found := fams[metric]
	if base, isCount := strings.CutSuffix(metric, "_count"); !found && isCount {
		f = fams[base]
	}
	for _, m := range f.GetMetric() {
		if !hasLabels(m, labels) {
			continue
		}
		ok = true
		switch {
		case m.Counter != nil:
			v += m.GetCounter().GetValue()
		case m.Gauge != nil:
			v += m.GetGauge().GetValue()
		case m.Histogram != nil:
			v += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return v, ok
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
			n++
		}
	}
	return n == len(want)
}
