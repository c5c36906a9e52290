package monitoring_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestAlertsFireWhenTheyShould evaluates each alert of rules.yaml with Prometheus' own PromQL
// engine over series as the workers would report them, one sample a minute: it fires for the
// failure it names (after its `for`), and stays quiet for the healthy case beside it.
func TestAlertsFireWhenTheyShould(t *testing.T) {
	alerts := alertsOf(t)
	const (
		dispatcher = `worker="dispatcher",pod="dispatcher-1",namespace="kubeclip",job="kubeclip"`
		watcher    = `worker="run-watcher",pod="run-watcher-1",namespace="kubeclip",job="kubeclip"`
		consumer   = `stream="KUBECLIP_WORK",consumer="dispatcher",` + dispatcher
		runs       = `stream="PAPERCLIP_RUNS",` + dispatcher
		results    = `subject="paperclip.run.*.*.result",outcome="stored",` + watcher
	)
	tests := []struct {
		alert  string
		series []series
		at     time.Duration // evaluated then, with samples from 0 to there
		want   bool
	}{
		{"KubeclipConsumerStalled", []series{
			{`kubeclip_consumer_pending{` + consumer + `}`, constant(5)},
			{`kubeclip_consumer_ack_pending{` + consumer + `}`, constant(2)},
			{`kubeclip_consumer_ack_floor_sequence{` + consumer + `}`, constant(100)},
		}, 30 * time.Minute, true},
		{"KubeclipConsumerStalled", []series{ // a backlog that is being worked through
			{`kubeclip_consumer_pending{` + consumer + `}`, constant(5)},
			{`kubeclip_consumer_ack_pending{` + consumer + `}`, constant(2)},
			{`kubeclip_consumer_ack_floor_sequence{` + consumer + `}`, ramp(100, 1)},
		}, 30 * time.Minute, false},
		{"KubeclipConsumerStalled", []series{ // idle: nothing waiting, nothing acked
			{`kubeclip_consumer_pending{` + consumer + `}`, constant(0)},
			{`kubeclip_consumer_ack_pending{` + consumer + `}`, constant(0)},
			{`kubeclip_consumer_ack_floor_sequence{` + consumer + `}`, constant(100)},
		}, 30 * time.Minute, false},
		{"KubeclipConsumerStalled", []series{ // stalled, but not for long enough yet
			{`kubeclip_consumer_pending{` + consumer + `}`, constant(5)},
			{`kubeclip_consumer_ack_pending{` + consumer + `}`, constant(0)},
			{`kubeclip_consumer_ack_floor_sequence{` + consumer + `}`, constant(100)},
		}, 14 * time.Minute, false},

		{"KubeclipResultsNotArriving", []series{
			{`kubeclip_runs_in_flight{` + watcher + `}`, constant(3)},
			{`kubeclip_events_published_total{` + results + `}`, constant(40)},
		}, 90 * time.Minute, true},
		{"KubeclipResultsNotArriving", []series{ // no result ever published: the series is absent
			{`kubeclip_runs_in_flight{` + watcher + `}`, constant(3)},
		}, 90 * time.Minute, true},
		{"KubeclipResultsNotArriving", []series{ // a result every 10 minutes
			{`kubeclip_runs_in_flight{` + watcher + `}`, constant(3)},
			{`kubeclip_events_published_total{` + results + `}`, func(m int) float64 { return float64(m / 10) }},
		}, 90 * time.Minute, false},
		{"KubeclipResultsNotArriving", []series{ // nothing in flight
			{`kubeclip_runs_in_flight{` + watcher + `}`, constant(0)},
			{`kubeclip_events_published_total{` + results + `}`, constant(40)},
		}, 90 * time.Minute, false},

		{"KubeclipStreamFilling", []series{
			{`kubeclip_stream_bytes{` + runs + `}`, constant(90)},
			{`kubeclip_stream_max_bytes{` + runs + `}`, constant(100)},
		}, 20 * time.Minute, true},
		{"KubeclipStreamFull", []series{
			{`kubeclip_stream_bytes{` + runs + `}`, constant(90)},
			{`kubeclip_stream_max_bytes{` + runs + `}`, constant(100)},
		}, 20 * time.Minute, false},
		{"KubeclipStreamFull", []series{
			{`kubeclip_stream_bytes{` + runs + `}`, constant(97)},
			{`kubeclip_stream_max_bytes{` + runs + `}`, constant(100)},
		}, 20 * time.Minute, true},
		{"KubeclipStreamFilling", []series{
			{`kubeclip_stream_bytes{` + runs + `}`, constant(50)},
			{`kubeclip_stream_max_bytes{` + runs + `}`, constant(100)},
		}, 20 * time.Minute, false},

		{"KubeclipWorkerNotReady", []series{{`kubeclip_ready{` + dispatcher + `}`, constant(0)}}, 10 * time.Minute, true},
		{"KubeclipWorkerNotReady", []series{{`kubeclip_ready{` + dispatcher + `}`, constant(1)}}, 10 * time.Minute, false},
		{"KubeclipWorkerDown", []series{{`up{` + dispatcher + `}`, constant(0)}}, 10 * time.Minute, true},
		{"KubeclipWorkerDown", []series{{`up{` + dispatcher + `}`, constant(1)}}, 10 * time.Minute, false},

		{"KubeclipBudgetExceeded", []series{
			{`kubeclip_budget_exceeded_total{source="log",kind="company",` + watcher + `}`, func(m int) float64 { return float64(min(m, 20) / 20) }},
		}, 25 * time.Minute, true},
		{"KubeclipBudgetExceeded", []series{
			{`kubeclip_budget_exceeded_total{source="log",kind="company",` + watcher + `}`, constant(1)},
		}, 25 * time.Minute, false},

		{"KubeclipStoreWritesFailing", []series{
			{`kubeclip_store_write_errors_total{bucket="KUBECLIP_BUDGETS",` + watcher + `}`, ramp(0, 3)},
		}, 30 * time.Minute, true},
		{"KubeclipStoreWritesFailing", []series{ // one failed write, long ago
			{`kubeclip_store_write_errors_total{bucket="KUBECLIP_BUDGETS",` + watcher + `}`, func(m int) float64 { return float64(min(m, 1)) }},
		}, 30 * time.Minute, false},

		{"KubeclipLogLinesLost", []series{
			{`kubeclip_log_gaps_total{` + watcher + `}`, func(m int) float64 { return float64(min(max(m-20, 0), 1)) }},
		}, 30 * time.Minute, true},
		{"KubeclipLogLinesLost", []series{ // one gap, over an hour ago
			{`kubeclip_log_gaps_total{` + watcher + `}`, func(m int) float64 { return float64(min(m, 1)) }},
		}, 90 * time.Minute, false},

		{"KubeclipKubernetesAPIErrors", []series{
			{`kubeclip_kubernetes_requests_total{method="GET",code="200",` + dispatcher + `}`, ramp(0, 80)},
			{`kubeclip_kubernetes_requests_total{method="POST",code="500",` + dispatcher + `}`, ramp(0, 20)},
		}, 20 * time.Minute, true},
		{"KubeclipKubernetesAPIErrors", []series{
			{`kubeclip_kubernetes_requests_total{method="GET",code="200",` + dispatcher + `}`, ramp(0, 99)},
			{`kubeclip_kubernetes_requests_total{method="GET",code="429",` + dispatcher + `}`, ramp(0, 1)},
		}, 20 * time.Minute, false},

		{"KubeclipJetStreamUnanswered", []series{{`kubeclip_jetstream_scrape_ok{` + dispatcher + `}`, constant(0)}}, 15 * time.Minute, true},
		{"KubeclipJetStreamUnanswered", []series{{`kubeclip_jetstream_scrape_ok{` + dispatcher + `}`, constant(1)}}, 15 * time.Minute, false},
	}
	covered := map[string]bool{}
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 1_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	for i, tc := range tests {
		t.Run(fmt.Sprintf("%s/%d", tc.alert, i), func(t *testing.T) {
			a, ok := alerts[tc.alert]
			if !ok {
				t.Fatalf("rules.yaml has no alert %s", tc.alert)
			}
			covered[tc.alert] = true
			if got := firing(t, engine, a, tc.series, tc.at); got != tc.want {
				t.Errorf("%s firing at %s = %v, want %v\n%s", tc.alert, tc.at, got, tc.want, a.expr)
			}
		})
	}
	for name := range alerts {
		if !covered[name] {
			t.Errorf("alert %s has no case here", name)
		}
	}
}

type alert struct {
	expr    string
	pending time.Duration // the rule's `for`: how long expr must hold before the alert fires
}

func alertsOf(t *testing.T) map[string]alert {
	t.Helper()
	out := map[string]alert{}
	for _, o := range render(t) {
		if o.GetKind() != "PrometheusRule" {
			continue
		}
		groups, _, _ := unstructured.NestedSlice(o.Object, "spec", "groups")
		for _, g := range groups {
			rules, _ := g.(map[string]any)["rules"].([]any)
			for _, r := range rules {
				rule, _ := r.(map[string]any)
				name, _ := rule["alert"].(string)
				expr, _ := rule["expr"].(string)
				var d time.Duration
				if f, ok := rule["for"].(string); ok {
					pd, err := parseDuration(f)
					if err != nil {
						t.Fatalf("alert %s: for %q: %v", name, f, err)
					}
					d = pd
				}
				out[name] = alert{expr: expr, pending: d}
			}
		}
	}
	return out
}

func parseDuration(s string) (time.Duration, error) {
	d, err := model.ParseDuration(s)
	return time.Duration(d), err
}

// firing reports whether alert a fires at `at` over the given series: its expr returns a result
// at every minute of the `for` before it, as Prometheus' rule evaluation (every minute) would
// see.
func firing(t *testing.T, engine *promql.Engine, a alert, ss []series, at time.Duration) bool {
	t.Helper()
	start := time.Unix(0, 0)
	q := queryable(t, ss, int(at/time.Minute))
	for ts := at - a.pending; ts <= at; ts += time.Minute {
		query, err := engine.NewInstantQuery(context.Background(), q, nil, a.expr, start.Add(ts))
		if err != nil {
			t.Fatal(err)
		}
		res := query.Exec(context.Background())
		if res.Err != nil {
			t.Fatalf("evaluating at %s: %v", ts, res.Err)
		}
		v, err := res.Vector()
		query.Close()
		if err != nil {
			t.Fatal(err)
		}
		if len(v) == 0 {
			return false
		}
	}
	return true
}

// series is one time series: a metric with labels (PromQL notation) and its value at each
// minute.
type series struct {
	metric string
	value  func(minute int) float64
}

func constant(v float64) func(int) float64 { return func(int) float64 { return v } }

func ramp(from, perMinute float64) func(int) float64 {
	return func(m int) float64 { return from + perMinute*float64(m) }
}

// queryable holds ss sampled every minute from 0 to minutes.
func queryable(t *testing.T, ss []series, minutes int) storage.Queryable {
	t.Helper()
	var all []storage.Series
	for _, s := range ss {
		lset, err := parser.ParseMetric(s.metric)
		if err != nil {
			t.Fatalf("%s: %v", s.metric, err)
		}
		var samples []chunks.Sample
		for m := 0; m <= minutes; m++ {
			samples = append(samples, sample{t: int64(m) * time.Minute.Milliseconds(), f: s.value(m)})
		}
		all = append(all, storage.NewListSeries(lset, samples))
	}
	return storage.QueryableFunc(func(int64, int64) (storage.Querier, error) {
		return &storage.MockQuerier{SelectMockFunction: func(_ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
			var out []storage.Series
			for _, s := range all {
				if matchesAll(s.Labels(), ms) {
					out = append(out, s)
				}
			}
			return &seriesSet{list: out, i: -1}
		}}, nil
	})
}

func matchesAll(lset labels.Labels, ms []*labels.Matcher) bool {
	for _, m := range ms {
		if !m.Matches(lset.Get(m.Name)) {
			return false
		}
	}
	return true
}

type seriesSet struct {
	list []storage.Series
	i    int
}

func (s *seriesSet) Next() bool                      { s.i++; return s.i < len(s.list) }
func (s *seriesSet) At() storage.Series              { return s.list[s.i] }
func (*seriesSet) Err() error                        { return nil }
func (*seriesSet) Warnings() annotations.Annotations { return nil }

// sample is a float sample (chunks.Sample).
type sample struct {
	t int64
	f float64
}

func (s sample) T() int64                    { return s.t }
func (s sample) F() float64                  { return s.f }
func (sample) H() *histogram.Histogram       { return nil }
func (sample) FH() *histogram.FloatHistogram { return nil }
func (sample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s sample) Copy() chunks.Sample         { return s }
