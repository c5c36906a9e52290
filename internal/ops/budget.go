package ops

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// newBudgetMetric is kubeclip_budget_exceeded_total{source, kind}: alert on any increase. Its
// labels are bounded (source: exec, log or lease; kind: exec, run or company); which company hit a
// budget is in the worker's log and in that company's own run events, never a label, so the
// series do not grow with the number of companies.
func newBudgetMetric(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kubeclip_budget_exceeded_total",
		Help: "Writes a company's budget refused, by source (exec: recorded execs, log: container logs, lease: lease records) and kind (exec, run, company). Recording stops for that exec or run, an acquire past the lease-record quota fails; other companies are unaffected.",
	}, []string{"source", "kind"})
	return c, reg.Register(c)
}

// BudgetExceeded implements execsvc.BudgetObserver, the run-watcher's and the tenant-worker's.
func (m *Metrics) BudgetExceeded(source string, kind events.BudgetKind) {
	m.budgetExceeded.WithLabelValues(source, string(kind)).Inc()
}
