package ops

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubeclip/kubeclip/pkg/api"
)

var _ api.Observer = (*Metrics)(nil)

func newAPIDropped(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kubeclip_api_requests_dropped_total",
		Help: "api.validate and api.ping requests dropped without an answer, by service and reason (reply_not_inbox: the reply subject is not a client's inbox).",
	}, []string{"service", "reason"})
	if err := reg.Register(c); err != nil {
		return nil, err
	}
	return c, nil
}

// APIRequestDropped implements api.Observer.
func (m *Metrics) APIRequestDropped(service, reason string) {
	m.apiDropped.WithLabelValues(service, reason).Inc()
}
