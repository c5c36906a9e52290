package ops

import (
	"regexp"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Registry is a worker's metrics registry. It remembers the collectors registered on it so
// Exported can list every metric the worker exports, a vector that has no series yet included:
// the dashboard and alert test (tests/monitoring) checks its queries against that list.
type Registry struct {
	*prometheus.Registry

	mu         sync.Mutex
	collectors []prometheus.Collector
}

var _ prometheus.Registerer = (*Registry)(nil)

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry { return &Registry{Registry: prometheus.NewRegistry()} }

// Register implements prometheus.Registerer.
func (r *Registry) Register(c prometheus.Collector) error {
	if err := r.Registry.Register(c); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.collectors = append(r.collectors, c)
	return nil
}

// MustRegister implements prometheus.Registerer.
func (r *Registry) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// Unregister implements prometheus.Registerer.
func (r *Registry) Unregister(c prometheus.Collector) bool {
	if !r.Registry.Unregister(c) {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.collectors = slices.DeleteFunc(r.collectors, func(x prometheus.Collector) bool { return x == c })
	return true
}

// descName finds a Desc's fully-qualified name in its String form, the only place client_golang
// shows it: `Desc{fqName: "kubeclip_runs_in_flight", help: ...}`.
var descName = regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)

// Kind is what Exported knows of a metric's type: the two that Prometheus exposes under more
// names than their own (a histogram's _bucket, _sum and _count; a summary's _sum and _count),
// and Other.
type Kind string

// The kinds Exported reports.
const (
	KindHistogram Kind = "histogram"
	KindSummary   Kind = "summary"
	KindOther     Kind = "other"
)

// Exported returns every metric the registered collectors describe, by name, with its kind. A
// histogram or summary is its base name. The kind comes from the collector's type (a histogram
// vector with no series yet is still a histogram) or, for a custom collector, from what it
// collects now; a custom collector with nothing to say yet is KindOther.
func (r *Registry) Exported() map[string]Kind {
	r.mu.Lock()
	cs := slices.Clone(r.collectors)
	r.mu.Unlock()
	out := map[string]Kind{}
	for _, c := range cs {
		kind := KindOther
		// A single Histogram or Summary is left to collectedKinds: the two interfaces have the
		// same methods, so a type switch takes a summary for a histogram, and each collects
		// itself, which says which it is.
		switch c.(type) {
		case *prometheus.HistogramVec:
			kind = KindHistogram
		case *prometheus.SummaryVec:
			kind = KindSummary
		}
		for _, name := range describe(c) {
			out[name] = kind
		}
		if kind != KindOther {
			continue
		}
		for name, k := range collectedKinds(c) {
			out[name] = k
		}
	}
	return out
}

func describe(c prometheus.Collector) []string {
	ch := make(chan *prometheus.Desc)
	go func() {
		c.Describe(ch)
		close(ch)
	}()
	var names []string
	for d := range ch {
		if m := descName.FindStringSubmatch(d.String()); m != nil {
			names = append(names, m[1])
		}
	}
	return names
}

// collectedKinds are the histograms and summaries among what c collects now.
func collectedKinds(c prometheus.Collector) map[string]Kind {
	ch := make(chan prometheus.Metric)
	go func() {
		c.Collect(ch)
		close(ch)
	}()
	out := map[string]Kind{}
	for m := range ch {
		var pb dto.Metric
		if m.Write(&pb) != nil {
			continue
		}
		name := descName.FindStringSubmatch(m.Desc().String())
		switch {
		case name == nil:
		case pb.Histogram != nil:
			out[name[1]] = KindHistogram
		case pb.Summary != nil:
			out[name[1]] = KindSummary
		}
	}
	return out
}
