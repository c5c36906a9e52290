package ops

import (
	"cmp"
	"context"
	"encoding/json"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// Lease collector defaults.
const (
	// DefaultLeaseTopCompanies is how many companies get series of their own in kubeclip_leases;
	// the others are summed under company="*". Company ids are the host's choice and thousands
	// of companies are the target, so a series per company would grow without bound; the
	// companies with the most live leases are the ones a dashboard looks for. 20 companies
	// times the 13 lease states is at most 273 series (with "*").
	DefaultLeaseTopCompanies = 20
	// DefaultLeaseRefresh: the records are read at most this often, the last count served in
	// between, so several scrapers (or replicas' scrapes) cost one read of the bucket.
	DefaultLeaseRefresh = 15 * time.Second
)

// otherCompanies labels the companies past the top ones: '*' is not a character a company id
// may hold (events.ValidateToken), so it never names a real company.
const otherCompanies = "*"

// LeaseCollector reports kubeclip_leases{company, state} from the lease records in
// KUBECLIP_LEASES, read at scrape time (at most every DefaultLeaseRefresh, each read bounded by
// DefaultJetStreamScrapeTimeout). Until Watch it collects nothing. Every dispatcher replica
// reports the same counts: aggregate replicas with max, not sum.
type LeaseCollector struct {
	mu sync.Mutex
	kv events.KVWatcher
	scrapeRead
	counts []leaseCount

	leases, up *prometheus.Desc
}

type leaseCount struct {
	company string
	state   lease.State
	n       int
}

var _ prometheus.Collector = (*LeaseCollector)(nil)

// NewLeaseCollector returns a collector with nothing to read yet.
func NewLeaseCollector() *LeaseCollector {
	return &LeaseCollector{
		scrapeRead: defaultScrapeRead(),
		leases: prometheus.NewDesc("kubeclip_leases",
			"Lease records by state and company. Only the 20 companies with the most live leases (then the most records) have series of their own; the others are summed under company=\"*\", so the series stay bounded whatever the number of companies. Records stay until the lease bucket's TTL.",
			[]string{"company", "state"}, nil),
		up: prometheus.NewDesc("kubeclip_leases_read_ok", "1 when the last read of the lease records finished in time, else 0 (kubeclip_leases then holds the last complete read).", nil, nil),
	}
}

// LeaseCollectorOptions change a LeaseCollector's defaults; zero fields keep them.
type LeaseCollectorOptions struct {
	TopCompanies int
	Refresh      time.Duration
	Timeout      time.Duration
	Now          func() time.Time
}

// Watch makes the collector count the records of kv (the KUBECLIP_LEASES bucket).
func (c *LeaseCollector) Watch(kv events.KVWatcher, o LeaseCollectorOptions) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.kv = kv
	c.apply(o)
}

// Describe implements prometheus.Collector.
func (c *LeaseCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.leases
	ch <- c.up
}

// Collect implements prometheus.Collector.
func (c *LeaseCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.kv == nil {
		return
	}
	c.refreshWith(func(ctx context.Context) error {
		counts, err := c.count(ctx)
		if err == nil {
			c.counts = counts
		}
		return err
	})
	for _, lc := range c.counts {
		ch <- prometheus.MustNewConstMetric(c.leases, prometheus.GaugeValue, float64(lc.n), lc.company, string(lc.state))
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, c.okValue())
}

// count reads every record once and keeps the top companies.
func (c *LeaseCollector) count(ctx context.Context) ([]leaseCount, error) {
	type company struct {
		live, total int
		states      map[lease.State]int
	}
	byCompany := map[string]*company{}
	err := events.ReadCurrent(ctx, c.kv, func(e jetstream.KeyValueEntry) {
		var rec struct {
			CompanyID string      `json:"companyId"`
			State     lease.State `json:"state"`
		}
		if json.Unmarshal(e.Value(), &rec) != nil || rec.CompanyID == "" {
			return // not a lease record: nothing to count
		}
		co := byCompany[rec.CompanyID]
		if co == nil {
			co = &company{states: map[lease.State]int{}}
			byCompany[rec.CompanyID] = co
		}
		co.total++
		if rec.State.Live() {
			co.live++
		}
		co.states[rec.State]++
	})
	if err != nil {
		return nil, err
	}
	kept, rest := splitTop(byCompany, c.top, func(a, b *company) int {
		return cmp.Or(cmp.Compare(b.live, a.live), cmp.Compare(b.total, a.total))
	})
	var out []leaseCount
	for _, id := range kept {
		for st, n := range byCompany[id].states {
			out = append(out, leaseCount{company: id, state: st, n: n})
		}
	}
	others := map[lease.State]int{}
	for _, id := range rest {
		for st, n := range byCompany[id].states {
			others[st] += n
		}
	}
	for st, n := range others {
		out = append(out, leaseCount{company: otherCompanies, state: st, n: n})
	}
	return out, nil
}
