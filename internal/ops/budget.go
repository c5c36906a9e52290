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

// newStoreWriteErrors is kubeclip_store_write_errors_total{bucket}: writes to a shared bucket
// (KUBECLIP_BUDGETS, KUBECLIP_EXECS) that failed and were let through (fail open: the charge
// admitted, the exec started and recorded). Alert on any increase: the bucket is full or NATS
// does not answer, and budgets are counted in each process only meanwhile. Its label is one of
// a few fixed bucket names.
func newStoreWriteErrors(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kubeclip_store_write_errors_total",
		Help: "Writes to a shared KV bucket (KUBECLIP_BUDGETS, KUBECLIP_EXECS) that failed and were let through (fail open), by bucket.",
	}, []string{"bucket"})
	return c, reg.Register(c)
}

// StoreWriteFailed implements execsvc.StoreObserver and runwatch.StoreObserver.
func (m *Metrics) StoreWriteFailed(bucket string) {
	m.storeWriteErrors.WithLabelValues(bucket).Inc()
}
