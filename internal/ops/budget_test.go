package ops_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kubeclip/kubeclip/internal/ops"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestBudgetMetric: every budget refusal counts, by source and kind only (no company label).
func TestBudgetMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := ops.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.BudgetExceeded("exec", events.BudgetCompany)
	m.BudgetExceeded("exec", events.BudgetCompany)
	m.BudgetExceeded("log", events.BudgetRun)
	m.BudgetExceeded("lease", events.BudgetCompany)
	want := `
# HELP kubeclip_budget_exceeded_total Writes a company's budget refused, by source (exec: recorded execs, log: container logs, lease: lease records) and kind (exec, run, company). Recording stops for that exec or run, an acquire past the lease-record quota fails; other companies are unaffected.
# TYPE kubeclip_budget_exceeded_total counter
kubeclip_budget_exceeded_total{kind="company",source="exec"} 2
kubeclip_budget_exceeded_total{kind="company",source="lease"} 1
kubeclip_budget_exceeded_total{kind="run",source="log"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kubeclip_budget_exceeded_total"); err != nil {
		t.Error(err)
	}
}
