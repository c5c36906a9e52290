package ops

import (
	"cmp"
	"context"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// warmMetrics are the dispatcher's warm pools: kubeclip_warm_acquires_total{result} and
// kubeclip_warm_pods in all, and per company (WarmPoolCollector) within the bound the lease
// records' series keep: the top companies by warm pods, the others summed under company="*".
type warmMetrics struct {
	acquires *prometheus.CounterVec
	pods     prometheus.Gauge
	pools    *WarmPoolCollector
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
		pools: newWarmPoolCollector(),
	}
	for _, c := range []prometheus.Collector{m.acquires, m.pods, m.pools} {
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
func (m *Metrics) WarmPods(byCompany map[string]int) {
	n := 0
	for _, c := range byCompany {
		n += c
	}
	m.warm.pods.Set(float64(n))
	m.warm.pools.setPods(byCompany)
}

// WarmPools is the collector of the warm pools per company, for the dispatcher to Watch.
func (m *Metrics) WarmPools() *WarmPoolCollector { return m.warm.pools }

// WarmPoolAcquires is what one pool's record says of its company's acquires
// (dispatch.WarmPoolStats).
type WarmPoolAcquires struct {
	CompanyID    string
	Hits, Misses uint64
}

// WarmPoolCollector reports kubeclip_warm_pool_pods{company} (the dispatcher's cache, at its
// last pass) and kubeclip_warm_pool_acquires{company, result} (the pools' records, read at scrape
// time, at most every DefaultLeaseRefresh, each read bounded by DefaultJetStreamScrapeTimeout).
// Until Watch it reports the pods alone.
type WarmPoolCollector struct {
	mu   sync.Mutex
	read func(context.Context) ([]WarmPoolAcquires, error)
	scrapeRead
	pools []WarmPoolAcquires
	pods  map[string]int

	podsDesc, acquiresDesc, up *prometheus.Desc
}

var _ prometheus.Collector = (*WarmPoolCollector)(nil)

func newWarmPoolCollector() *WarmPoolCollector {
	return &WarmPoolCollector{
		scrapeRead: defaultScrapeRead(),
		podsDesc: prometheus.NewDesc("kubeclip_warm_pool_pods",
			"Unbound warm pods by company, as this dispatcher's cache held them at its last pass. Only the 20 companies with the most warm pods (then the most acquires) have series of their own; the others are summed under company=\"*\".",
			[]string{"company"}, nil),
		acquiresDesc: prometheus.NewDesc("kubeclip_warm_pool_acquires",
			"Acquires of the shapes of a company's warm pools since each pool was made, by result: hit (bound a warm pod) or miss (created cold), from the pools' records (a drained pool's go with it). Companies as kubeclip_warm_pool_pods.",
			[]string{"company", "result"}, nil),
		up: prometheus.NewDesc("kubeclip_warm_pools_read_ok", "1 when the last read of the warm pools' records finished in time, else 0 (kubeclip_warm_pool_acquires then holds the last complete read).", nil, nil),
	}
}

// Watch makes the collector report the pools' acquires that read returns.
func (c *WarmPoolCollector) Watch(read func(context.Context) ([]WarmPoolAcquires, error), o LeaseCollectorOptions) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.read = read
	c.apply(o)
}

func (c *WarmPoolCollector) setPods(byCompany map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pods = byCompany
}

// Describe implements prometheus.Collector.
func (c *WarmPoolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.podsDesc
	ch <- c.acquiresDesc
	ch <- c.up
}

// Collect implements prometheus.Collector.
func (c *WarmPoolCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.read != nil {
		c.refreshWith(func(ctx context.Context) error {
			pools, err := c.read(ctx)
			if err == nil {
				c.pools = pools
			}
			return err
		})
	}
	type company struct{ pods, hits, misses uint64 }
	byCompany := map[string]*company{}
	get := func(id string) *company {
		co := byCompany[id]
		if co == nil {
			co = &company{}
			byCompany[id] = co
		}
		return co
	}
	for id, n := range c.pods {
		get(id).pods += uint64(n)
	}
	for _, p := range c.pools {
		co := get(p.CompanyID)
		co.hits += p.Hits
		co.misses += p.Misses
	}
	kept, others := splitTop(byCompany, c.top, func(a, b *company) int {
		return cmp.Or(cmp.Compare(b.pods, a.pods), cmp.Compare(b.hits+b.misses, a.hits+a.misses))
	})
	if len(others) > 0 {
		sum := &company{}
		for _, id := range others {
			sum.pods += byCompany[id].pods
			sum.hits += byCompany[id].hits
			sum.misses += byCompany[id].misses
		}
		byCompany[otherCompanies] = sum
		kept = append(kept, otherCompanies)
	}
	for _, id := range kept {
		co := byCompany[id]
		ch <- prometheus.MustNewConstMetric(c.podsDesc, prometheus.GaugeValue, float64(co.pods), id)
		if c.read != nil {
			ch <- prometheus.MustNewConstMetric(c.acquiresDesc, prometheus.GaugeValue, float64(co.hits), id, "hit")
			ch <- prometheus.MustNewConstMetric(c.acquiresDesc, prometheus.GaugeValue, float64(co.misses), id, "miss")
		}
	}
	if c.read != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, c.okValue())
	}
}
