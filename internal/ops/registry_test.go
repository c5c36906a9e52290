package ops_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kubeclip/kubeclip/internal/ops"
)

// TestRegistryExported: every registered metric is listed, a vector with no series yet
// included, with the kinds that Prometheus exposes under more names: histograms (from the
// collector's type, or what a custom collector collects) and summaries.
func TestRegistryExported(t *testing.T) {
	reg := ops.NewRegistry()
	reg.MustRegister(
		prometheus.NewCounterVec(prometheus.CounterOpts{Name: "a_total", Help: "a"}, []string{"x"}),
		prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "b_seconds", Help: "b"}, []string{"x"}),
		prometheus.NewGauge(prometheus.GaugeOpts{Name: "c", Help: "c"}),
		prometheus.NewSummaryVec(prometheus.SummaryOpts{Name: "e_seconds", Help: "e"}, []string{"x"}),
		prometheus.NewHistogram(prometheus.HistogramOpts{Name: "f_seconds", Help: "f"}),
		prometheus.NewSummary(prometheus.SummaryOpts{Name: "g_seconds", Help: "g"}),
		collectors.NewGoCollector(),
		ops.NewJetStreamCollector(), // watches nothing: collects nothing, still described
	)
	got := reg.Exported()
	for name, want := range map[string]ops.Kind{
		"a_total":                   ops.KindOther,
		"b_seconds":                 ops.KindHistogram,
		"c":                         ops.KindOther,
		"e_seconds":                 ops.KindSummary,
		"f_seconds":                 ops.KindHistogram,
		"g_seconds":                 ops.KindSummary, // a Histogram by its methods
		"go_gc_duration_seconds":    ops.KindSummary,
		"go_goroutines":             ops.KindOther,
		"kubeclip_consumer_pending": ops.KindOther,
	} {
		if got[name] != want {
			t.Errorf("Exported()[%q] = %q, want %q", name, got[name], want)
		}
	}
	c := prometheus.NewGauge(prometheus.GaugeOpts{Name: "d", Help: "d"})
	reg.MustRegister(c)
	reg.Unregister(c)
	if diff := cmp.Diff(len(got), len(reg.Exported())); diff != "" {
		t.Errorf("an unregistered collector is still listed (-before +after):\n%s", diff)
	}
}
