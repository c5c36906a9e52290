package ops_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/internal/ops"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// TestLeaseCollectorBoundsCompanies: kubeclip_leases counts the records by company and state;
// past the top companies (by live leases) the rest are one company "*", so the series stay
// bounded however many companies there are. Counts are read at most once per refresh.
func TestLeaseCollectorBoundsCompanies(t *testing.T) {
	ctx := t.Context()
	_, _, js := natstest.Start(t)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: lease.Bucket})
	if err != nil {
		t.Fatal(err)
	}
	put := func(company, run string, state lease.State) {
		t.Helper()
		b, err := json.Marshal(lease.Record{RunID: run, CompanyID: company, State: state})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, company+"."+run, b); err != nil {
			t.Fatal(err)
		}
	}
	// busy has the most live leases; small-a and small-b one each (a tie small-a wins by
	// name); many-ended has the most records but none live, so it falls past the top 2 with
	// small-b and small-c.
	for i := range 3 {
		put("busy", fmt.Sprint("r", i), lease.StateCreated)
	}
	put("busy", "r9", lease.StateReleased)
	for i := range 5 {
		put("many-ended", fmt.Sprint("r", i), lease.StateReleased)
	}
	put("small-a", "r0", lease.StateCreated)
	put("small-b", "r0", lease.StateRequested)
	put("small-c", "r0", lease.StateReleased)

	now := time.Unix(1000, 0)
	c := ops.NewLeaseCollector()
	c.Watch(kv, ops.LeaseCollectorOptions{TopCompanies: 2, Refresh: time.Minute, Now: func() time.Time { return now }})
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	const head = `
# HELP kubeclip_leases Lease records by state and company. Only the 20 companies with the most live leases (then the most records) have series of their own; the others are summed under company="*", so the series stay bounded whatever the number of companies. Records stay until the lease bucket's TTL.
# TYPE kubeclip_leases gauge
`
	want := head + `kubeclip_leases{company="*",state="released"} 6
kubeclip_leases{company="*",state="requested"} 1
kubeclip_leases{company="busy",state="created"} 3
kubeclip_leases{company="busy",state="released"} 1
kubeclip_leases{company="small-a",state="created"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kubeclip_leases"); err != nil {
		t.Error(err)
	}
	if got := value(t, reg, "kubeclip_leases_read_ok"); got != 1 {
		t.Errorf("kubeclip_leases_read_ok = %v, want 1", got)
	}

	// A new record is seen at the next refresh, not before.
	put("small-c", "r1", lease.StateCreated)
	put("small-c", "r2", lease.StateCreated)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kubeclip_leases"); err != nil {
		t.Errorf("within the refresh interval: %v", err)
	}
	now = now.Add(time.Minute)
	want = head + `kubeclip_leases{company="*",state="created"} 1
kubeclip_leases{company="*",state="released"} 5
kubeclip_leases{company="*",state="requested"} 1
kubeclip_leases{company="busy",state="created"} 3
kubeclip_leases{company="busy",state="released"} 1
kubeclip_leases{company="small-c",state="created"} 2
kubeclip_leases{company="small-c",state="released"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kubeclip_leases"); err != nil {
		t.Errorf("after the refresh interval: %v", err)
	}
}

// TestLeaseCollectorKeepsTheLastCount: a read that does not finish in time keeps the last
// complete count and says so.
func TestLeaseCollectorKeepsTheLastCount(t *testing.T) {
	ctx := t.Context()
	s, _, js := natstest.Start(t)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: lease.Bucket})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(lease.Record{RunID: "r0", CompanyID: "c", State: lease.StateCreated})
	if _, err := kv.Put(ctx, "c.r0", b); err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1000, 0)
	c := ops.NewLeaseCollector()
	c.Watch(kv, ops.LeaseCollectorOptions{Refresh: time.Second, Timeout: 200 * time.Millisecond, Now: func() time.Time { return now }})
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	if got := value(t, reg, "kubeclip_leases"); got != 1 {
		t.Fatalf("kubeclip_leases = %v, want 1", got)
	}
	s.Shutdown()
	s.WaitForShutdown()
	now = now.Add(time.Minute)
	if got := value(t, reg, "kubeclip_leases_read_ok"); got != 0 {
		t.Errorf("kubeclip_leases_read_ok with the server gone = %v, want 0", got)
	}
	if got := value(t, reg, "kubeclip_leases"); got != 1 {
		t.Errorf("kubeclip_leases with the server gone = %v, want the last count, 1", got)
	}
}

// TestScrapeTimeBounds pins the reasons of the collectors' defaults: one scrape of the
// dispatcher runs both reads (the JetStream questions, the lease records) and the readiness
// checks (kubeclip_ready) within Prometheus' default 10 s scrape timeout, and the lease series stay bounded with the top companies (at 13
// lease states, under 300).
func TestScrapeTimeBounds(t *testing.T) {
	const prometheusScrapeTimeout = 10 * time.Second
	if all := 2*ops.DefaultJetStreamScrapeTimeout + ops.DefaultCheckTimeout; all >= prometheusScrapeTimeout {
		t.Errorf("a scrape's reads and checks may take %s, not within the %s scrape timeout", all, prometheusScrapeTimeout)
	}
	const leaseStates = 13
	if n := (ops.DefaultLeaseTopCompanies + 1) * leaseStates; n > 300 {
		t.Errorf("kubeclip_leases may have %d series, want at most 300", n)
	}
	if ops.DefaultLeaseRefresh < 10*time.Second {
		t.Errorf("the lease records are read every %s: more often than a scrape interval", ops.DefaultLeaseRefresh)
	}
}
