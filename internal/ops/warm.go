package ops

import (
	"github.com/prometheus/client_golang/prometheus"
)

// warmMetrics are the dispatcher's warm pools: kubeclip_warm_acquires_total{result} and
// kubeclip_warm_pods. Like the budget metric their labels are bounded: which company hit or
// missed is in its pool's record (KUBECLIP_WARM: hits, misses), the dispatcher's log and the
// `created` events' warm, never a label, so the series do not grow with the companies.
type warmMetrics struct {
	acquires *prometheus.CounterVec
	pods     prometheus.Gauge
}

func newWarmMetrics(reg prometheus.Registerer) (*warmMetrics, error) {
	m := &warmMetrics{
		acquires: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeclip_warm_acquires_total",
			Help: "Acquires a warm pool could serve (backend pod, not reusable, warm pools on), by result: hit (bound a warm pod) or miss (created cold).",
		}, []string{"result"}),
		pods: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kubeclip_warm_pods",
			Help: "Unbound warm pods in the cluster, as this dispatcher's cache holds them.",
		}),
	}
	for _, c := range []prometheus.Collector{m.acquires, m.pods} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// WarmAcquire implements dispatch.WarmObserver.
func (m *Metrics) WarmAcquire(hit bool) {
	result := "miss"
	if hit {
		result = "hit"
	}
	m.warm.acquires.WithLabelValues(result).Inc()
}

// WarmPods implements dispatch.WarmObserver.
func (m *Metrics) WarmPods(n int) { m.warm.pods.Set(float64(n)) }
