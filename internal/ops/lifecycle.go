package ops

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// lifecycleMetrics time a lease's way to a running workload and count the runs that moved
// between run-watchers. No label: a label per company would grow with the companies, and the
// dashboard's question is how long acquires take, not whose.
type lifecycleMetrics struct {
	created   prometheus.Histogram
	ready     prometheus.Histogram
	takeovers prometheus.Counter
}

// acquireBuckets span a warm pod bound in a few hundred milliseconds to a cold image pull that
// takes minutes (the issue 16 and 17 benches: created in 0.1-1 s, running in 2-60 s).
var acquireBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600}

func newLifecycleMetrics(reg prometheus.Registerer) (*lifecycleMetrics, error) {
	m := &lifecycleMetrics{
		created: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kubeclip_acquire_created_seconds",
			Help:    "Time from an acquire's lease record (the tenant-worker's first handling of it) to the dispatcher's created event, first publish only (not redeliveries).",
			Buckets: acquireBuckets,
		}),
		ready: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kubeclip_acquire_ready_seconds",
			Help:    "Time from an acquire's lease record to the first status the run-watcher published with the agent's container started (Running, or the run's end when it was over before the watcher looked), once per run.",
			Buckets: acquireBuckets,
		}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubeclip_run_takeovers_total",
			Help: "Runs this run-watcher replica began to follow after an earlier owner (another replica, or this one before a restart) had published their status: a failover, a rolling restart or a rebalance.",
		}),
	}
	for _, c := range []prometheus.Collector{m.created, m.ready, m.takeovers} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// RunCreated implements dispatch.RunObserver.
func (m *Metrics) RunCreated(sinceAcquire time.Duration) {
	m.lifecycle.created.Observe(sinceAcquire.Seconds())
}

// RunReady implements runwatch.Observer.
func (m *Metrics) RunReady(sinceAcquire time.Duration) {
	m.lifecycle.ready.Observe(sinceAcquire.Seconds())
}

// RunTakenOver implements runwatch.Observer.
func (m *Metrics) RunTakenOver() { m.lifecycle.takeovers.Inc() }
