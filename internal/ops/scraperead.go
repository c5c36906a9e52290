package ops

import (
	"cmp"
	"context"
	"slices"
	"time"
)

// scrapeRead is how a collector reads a store at scrape time (the lease records, the warm
// pools' records): at most once per refresh, scrapes in between served the last read; each read
// bounded by timeout; a failed read keeps the last one and reports ok false; the companies past
// the top ones summed under otherCompanies (splitTop).
type scrapeRead struct {
	top     int
	refresh time.Duration
	timeout time.Duration
	now     func() time.Time
	readAt  time.Time // of the last read that succeeded
	ok      bool      // whether the last read succeeded
}

func defaultScrapeRead() scrapeRead {
	return scrapeRead{top: DefaultLeaseTopCompanies, refresh: DefaultLeaseRefresh, timeout: DefaultJetStreamScrapeTimeout, now: time.Now}
}

// apply sets what o sets.
func (r *scrapeRead) apply(o LeaseCollectorOptions) {
	r.top = cmp.Or(o.TopCompanies, r.top)
	r.refresh = cmp.Or(o.Refresh, r.refresh)
	r.timeout = cmp.Or(o.Timeout, r.timeout)
	if o.Now != nil {
		r.now = o.Now
	}
}

// refreshWith calls read when the last successful read is older than the refresh; read keeps
// what it read only when it returns nil.
func (r *scrapeRead) refreshWith(read func(context.Context) error) {
	if !r.readAt.IsZero() && r.now().Sub(r.readAt) < r.refresh {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.timeout)
	defer cancel()
	r.ok = read(ctx) == nil
	if r.ok {
		r.readAt = r.now()
	}
}

// okValue is kubeclip_*_read_ok's value.
func (r *scrapeRead) okValue() float64 {
	if r.ok {
		return 1
	}
	return 0
}

// splitTop orders the companies of byCompany by compare, then by id, and returns the first top
// of them and the others: the bound every per-company series keeps (DefaultLeaseTopCompanies).
func splitTop[T any](byCompany map[string]T, top int, compare func(a, b T) int) (kept, others []string) {
	ids := make([]string, 0, len(byCompany))
	for id := range byCompany {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b string) int {
		return cmp.Or(compare(byCompany[a], byCompany[b]), cmp.Compare(a, b))
	})
	if len(ids) <= top {
		return ids, nil
	}
	return ids[:top], ids[top:]
}
