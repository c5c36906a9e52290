package ops_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubeclip/kubeclip/internal/ops"
)

// TestWarmPoolsByCompanyAreBounded: kubeclip_warm_pool_pods and kubeclip_warm_pool_acquires
// report each company's warm pods (the dispatcher's last pass) and its pools' acquires (their
// records, summed over its shapes); past the top companies by warm pods, then acquires, the
// rest are summed under company="*". The records are read at most once per refresh, and a read
// that fails keeps the last one and says so.
func TestWarmPoolsByCompanyAreBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := ops.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	records := []ops.WarmPoolAcquires{
		{CompanyID: "busy", Hits: 7, Misses: 2}, {CompanyID: "busy", Hits: 1, Misses: 1}, // two shapes
		{CompanyID: "drained", Hits: 30, Misses: 3}, // the most acquires, but no pods: past the top 2
		{CompanyID: "small", Hits: 1},               // one pod as tiny has, one acquire: by name
		{CompanyID: "tiny", Misses: 1},
	}
	var readErr error
	reads := 0
	now := time.Unix(1000, 0)
	m.WarmPools().Watch(func(context.Context) ([]ops.WarmPoolAcquires, error) {
		reads++
		return records, readErr
	}, ops.LeaseCollectorOptions{TopCompanies: 2, Refresh: time.Minute, Now: func() time.Time { return now }})
	m.WarmPods(map[string]int{"busy": 3, "small": 1, "tiny": 1})

	want := `
kubeclip_warm_pods 5
kubeclip_warm_pool_acquires{company="*",result="hit"} 30
kubeclip_warm_pool_acquires{company="*",result="miss"} 4
kubeclip_warm_pool_acquires{company="busy",result="hit"} 8
kubeclip_warm_pool_acquires{company="busy",result="miss"} 3
kubeclip_warm_pool_acquires{company="small",result="hit"} 1
kubeclip_warm_pool_acquires{company="small",result="miss"} 0
kubeclip_warm_pool_pods{company="*"} 1
kubeclip_warm_pool_pods{company="busy"} 3
kubeclip_warm_pool_pods{company="small"} 1
kubeclip_warm_pools_read_ok 1
`
	compare := func(when, want string) {
		t.Helper()
		if got := gatheredText(t, reg, "kubeclip_warm_pool_acquires", "kubeclip_warm_pool_pods", "kubeclip_warm_pods", "kubeclip_warm_pools_read_ok"); got != strings.TrimPrefix(want, "\n") {
			t.Errorf("%s: gathered\n%s\nwant\n%s", when, got, want)
		}
	}
	compare("first scrape", want)

	// Within the refresh the records are not read again; past it a failed read keeps the last.
	records = append(records, ops.WarmPoolAcquires{CompanyID: "busy", Hits: 100})
	compare("within the refresh", want)
	now = now.Add(time.Minute)
	readErr = errors.New("timeout")
	compare("a failed read", strings.Replace(want, "kubeclip_warm_pools_read_ok 1", "kubeclip_warm_pools_read_ok 0", 1))
	if reads != 2 {
		t.Errorf("%d reads of the records, want 2 (one per refresh)", reads)
	}
}

// gatheredText is the named series as `name{labels} value` lines, sorted as Gather sorts them.
func gatheredText(t *testing.T, reg prometheus.Gatherer, names ...string) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, mf := range mfs {
		if !slices.Contains(names, mf.GetName()) {
			continue
		}
		for _, m := range mf.Metric {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := m.GetGauge().GetValue()
			if m.GetCounter() != nil {
				v = m.GetCounter().GetValue()
			}
			if len(labels) > 0 {
				fmt.Fprintf(&b, "%s{%s} %g\n", mf.GetName(), strings.Join(labels, ","), v)
			} else {
				fmt.Fprintf(&b, "%s %g\n", mf.GetName(), v)
			}
		}
	}
	return b.String()
}
