package brokersvc

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"github.com/kubeclip/kubeclip/pkg/broker/proxy"
	"github.com/kubeclip/kubeclip/pkg/cas"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// Budgets are the operator's per-company budgets of brokered calls, enforced before a call is
// forwarded (Admit) and charged with what the upstream stated once the call ended (Spent), so
// the agent cannot lie about them:
//
//   - requests per second, per company and per replica: a token bucket in this process. A
//     shared rate would put a compare-and-set on NATS in front of every call (a round trip on
//     the hot path the bench holds to 2 ms at p50, and every replica taking turns on one key
//     per company at the rates the budget is there to stop); a per-replica rate costs nothing,
//     and the operator sets it as the company's rate divided by the replicas.
//   - tokens per day (UTC), per company, shared by every replica: the company's counter of the
//     day in KUBECLIP_BUDGETS (events.SpendKey), which also counts its calls for `kubeclip
//     status`. A call is refused once the tokens counted reach the budget; tokens are known only
//     when a call ends, so the calls in flight when it is reached complete, and a company passes
//     its budget by those. Each replica reads a company's counter before its first call of the
//     day (at most ReadTimeout), adds its calls' spend in memory and writes it every Flush (one
//     compare-and-set per company with calls, reading again when another replica moved it), and
//     reads it again every Refresh while the company makes calls (and before its first call
//     after two idle Refreshes): a company may pass its budget by what the other replicas
//     admitted within a Refresh.
//
// A counter the bucket cannot read or write (it is full, NATS does not answer) fails open, as
// the other budgets' (docs/security.md, Budgets): the call is admitted on what this replica
// counted, its spend waits in memory and is written once the bucket takes writes again, and
// StoreFailures is told (kubeclip_store_write_errors_total{bucket="KUBECLIP_BUDGETS"}). Refusing
// instead would stop every company's model calls whenever the shared bucket filled; a company
// over its budget is still refused on this replica's own count.
type Budgets struct {
	kv                jetstream.KeyValue
	requestsPerSecond float64
	burst             int
	tokensPerDay      int64
	requestsBudget    string
	tokensBudget      string
	flush, refresh    time.Duration
	readTimeout       time.Duration
	failures          *events.StoreFailures
	log               zerolog.Logger
	now               func() time.Time

	exceeded  *prometheus.CounterVec
	untracked prometheus.Counter

	mu        sync.Mutex
	companies map[spendRef]*companySpend
	ready     chan struct{}
}

// The budgets of kubeclip_broker_budget_exceeded_total.
const (
	BudgetRequestsPerSecond = "requests_per_second"
	BudgetTokensPerDay      = "tokens_per_day"
)

// Defaults of BudgetOptions.
const (
	// DefaultBudgetFlush is how long a company's spend gathers in a replica before it is
	// written: one write per second per company with calls per replica, whatever its call rate
	// (a model call takes seconds; at 100 ms, a hundred busy companies cost a thousand KV writes
	// a second per replica). What the other replicas see of a replica's spend is that late.
	DefaultBudgetFlush = time.Second
	// DefaultBudgetRefresh is how often a replica reads again the counter of a company making
	// calls that it has not written meanwhile, and so how late it sees the other replicas'.
	DefaultBudgetRefresh = time.Second
	// DefaultBudgetReadTimeout bounds the read before a company's first call of the day on a
	// replica; past it the call is admitted (fail open).
	DefaultBudgetReadTimeout = time.Second
	// DefaultBudgetCompanies bounds the companies a replica follows at once (a few hundred bytes
	// each); a company idle for budgetIdle is forgotten. Past it a new company's calls are
	// admitted and not counted (kubeclip_broker_budget_untracked_total).
	DefaultBudgetCompanies = 10_000
	// budgetIdle is how long a company with nothing left to write is followed after its last
	// call.
	budgetIdle = time.Minute
	// budgetStoreRetry: after a read or write the bucket refused, the counter is not tried
	// again before this (its spend waits in memory), so a full bucket costs one refused write
	// per company every 5 s, not one per flush.
	budgetStoreRetry = 5 * time.Second
	// budgetCASAttempts bounds the compare-and-set retries of one write: replicas writing the
	// same company at once take turns.
	budgetCASAttempts = 20
	// budgetLogEvery is how often a company's refusals are logged at most.
	budgetLogEvery = time.Minute
	// budgetDrain bounds the last write at shutdown.
	budgetDrain = 5 * time.Second
)

// BudgetOptions configure NewBudgets. Zero budgets are off; the spend is counted all the same
// (for `kubeclip status`).
type BudgetOptions struct {
	// KV is events.BudgetBucket. Required.
	KV jetstream.KeyValue
	// RequestsPerSecond is the most calls a company may start per second on one replica (0:
	// no limit); RequestBurst how many it may start at once (0: RequestsPerSecond rounded up).
	RequestsPerSecond float64
	RequestBurst      int
	// TokensPerDay is the most tokens (input and output, as the upstreams stated them) a
	// company may spend per UTC day across every replica (0: no limit).
	TokensPerDay int64
	// RequestsBudget and TokensBudget name the settings in the refusals the agent sees
	// ("--company-tokens-per-day (KUBECLIP_BROKER_COMPANY_TOKENS_PER_DAY)").
	RequestsBudget, TokensBudget string
	// Flush, Refresh and ReadTimeout: 0 is DefaultBudgetFlush, DefaultBudgetRefresh,
	// DefaultBudgetReadTimeout.
	Flush, Refresh, ReadTimeout time.Duration
	// StoreFailures is told each read or write the bucket refused and each write it took.
	StoreFailures *events.StoreFailures
	// Registerer gets the budget metrics (nil: not registered).
	Registerer prometheus.Registerer
	// Log gets each refusal (with the company) and failed writes.
	Log zerolog.Logger
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// spendRef is one company's counter of one day.
type spendRef struct {
	company string
	day     int64
}

// companySpend is what this replica knows of one company's day.
type companySpend struct {
	limiter *rate.Limiter // nil: no request rate

	mu      sync.Mutex
	known   bool // used and rev are the bucket's as of readAt
	used    events.Spend
	rev     uint64 // 0: no counter in the bucket yet
	pending events.Spend
	readAt  time.Time
	retryAt time.Time // the bucket refused: not tried again before then
	active  time.Time // the last call admitted or ended
	loading chan struct{}
	// logged is when a refusal of this company was last logged: a company past its budget may
	// retry many times a second, and the log says so once a minute.
	logged time.Time
}

// NewBudgets checks o and registers the budget metrics.
func NewBudgets(o BudgetOptions) (*Budgets, error) {
	switch {
	case o.KV == nil:
		return nil, errors.New("brokersvc.BudgetOptions.KV is required")
	case o.RequestsPerSecond < 0 || math.IsNaN(o.RequestsPerSecond) || math.IsInf(o.RequestsPerSecond, 0):
		return nil, errors.New("brokersvc.BudgetOptions.RequestsPerSecond must be a number ≥ 0")
	case o.RequestBurst < 0:
		return nil, errors.New("brokersvc.BudgetOptions.RequestBurst must not be negative")
	case o.TokensPerDay < 0:
		return nil, errors.New("brokersvc.BudgetOptions.TokensPerDay must not be negative")
	case o.Flush < 0 || o.Refresh < 0 || o.ReadTimeout < 0:
		return nil, errors.New("brokersvc.BudgetOptions' durations must not be negative")
	}
	if o.RequestBurst == 0 {
		o.RequestBurst = int(math.Ceil(o.RequestsPerSecond))
	}
	if o.Flush == 0 {
		o.Flush = DefaultBudgetFlush
	}
	if o.Refresh == 0 {
		o.Refresh = DefaultBudgetRefresh
	}
	if o.ReadTimeout == 0 {
		o.ReadTimeout = DefaultBudgetReadTimeout
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.RequestsBudget == "" {
		o.RequestsBudget = "the broker's requests-per-second budget"
	}
	if o.TokensBudget == "" {
		o.TokensBudget = "the broker's tokens-per-day budget"
	}
	b := &Budgets{
		kv: o.KV, requestsPerSecond: o.RequestsPerSecond, burst: o.RequestBurst, tokensPerDay: o.TokensPerDay,
		requestsBudget: o.RequestsBudget, tokensBudget: o.TokensBudget,
		flush: o.Flush, refresh: o.Refresh, readTimeout: o.ReadTimeout,
		failures: o.StoreFailures, log: o.Log, now: o.Now,
		exceeded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeclip_broker_budget_exceeded_total",
			Help: "Calls the credential broker refused (429) because their company's budget was used up, by budget (requests_per_second, per replica; tokens_per_day). Which company is in the broker's log, never a label.",
		}, []string{"budget"}),
		untracked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kubeclip_broker_budget_untracked_total",
			Help: "Calls the credential broker admitted without counting them against their company's budgets: the replica followed as many companies as it may (DefaultBudgetCompanies).",
		}),
		companies: map[spendRef]*companySpend{},
		ready:     make(chan struct{}),
	}
	b.exceeded.WithLabelValues(BudgetRequestsPerSecond)
	b.exceeded.WithLabelValues(BudgetTokensPerDay)
	if o.Registerer != nil {
		for _, c := range []prometheus.Collector{b.exceeded, b.untracked} {
			if err := o.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("registering the broker's budget metrics: %w", err)
			}
		}
	}
	return b, nil
}

// company is what this replica knows of ref, nil past DefaultBudgetCompanies.
func (b *Budgets) company(ref spendRef) *companySpend {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.companies[ref]
	if c == nil {
		if len(b.companies) >= DefaultBudgetCompanies {
			return nil
		}
		c = &companySpend{}
		if b.requestsPerSecond > 0 {
			c.limiter = rate.NewLimiter(rate.Limit(b.requestsPerSecond), b.burst)
		}
		b.companies[ref] = c
	}
	return c
}

// Admit decides whether company may make one more call now: nil, or the 429 the agent gets,
// naming the budget and when it allows calls again. It waits on NATS only before a company's
// first call of the day on this replica (at most ReadTimeout).
func (b *Budgets) Admit(ctx context.Context, company string) *proxy.Rejection {
	now := b.now()
	ref := spendRef{company: company, day: events.SpendDay(now)}
	c := b.company(ref)
	if c == nil {
		b.untracked.Inc()
		return nil
	}
	if b.tokensPerDay > 0 {
		b.load(ctx, ref, c, now)
		c.mu.Lock()
		used := c.used.Tokens + c.pending.Tokens
		c.active = now
		c.mu.Unlock()
		if used >= b.tokensPerDay {
			reset := events.SpendDayStart(ref.day + 1)
			return b.refuse(c, company, BudgetTokensPerDay, now, &proxy.Rejection{
				Status: http.StatusTooManyRequests, Quota: true, RetryAfter: reset.Sub(now),
				Message: fmt.Sprintf("kubeclip broker: company budget of %d tokens per day (%s) exceeded: company %s has used %d tokens today (UTC); it resets at %s",
					b.tokensPerDay, b.tokensBudget, company, used, reset.Format(time.RFC3339)),
			})
		}
	}
	if c.limiter != nil {
		r := c.limiter.ReserveN(now, 1)
		if wait := r.DelayFrom(now); !r.OK() || wait > 0 {
			r.CancelAt(now)
			return b.refuse(c, company, BudgetRequestsPerSecond, now, &proxy.Rejection{
				Status: http.StatusTooManyRequests, RetryAfter: wait,
				Message: fmt.Sprintf("kubeclip broker: company budget of %s requests per second per broker replica (%s) exceeded by company %s; it allows the next call in %s",
					strconv.FormatFloat(b.requestsPerSecond, 'f', -1, 64), b.requestsBudget, company, wait.Round(time.Millisecond)),
			})
		}
	}
	return nil
}

// refuse counts a refusal and logs it with the company, at most once a minute per company.
func (b *Budgets) refuse(c *companySpend, company, budget string, now time.Time, rej *proxy.Rejection) *proxy.Rejection {
	b.exceeded.WithLabelValues(budget).Inc()
	c.mu.Lock()
	log := now.Sub(c.logged) >= budgetLogEvery
	if log {
		c.logged = now
	}
	c.mu.Unlock()
	if log {
		b.log.Info().Str(events.LogKeyTenant, company).Str("budget", budget).Msg("refused a brokered call: the company's budget is used up (logged once a minute; kubeclip_broker_budget_exceeded_total counts every refusal)")
	}
	return rej
}

// Spent counts one call of company that ended, with the tokens its upstream stated.
func (b *Budgets) Spent(company string, tokens int64) {
	now := b.now()
	c := b.company(spendRef{company: company, day: events.SpendDay(now)})
	if c == nil {
		return
	}
	c.mu.Lock()
	c.pending = c.pending.Add(events.Spend{Requests: 1, Tokens: max(tokens, 0)})
	c.active = now
	c.mu.Unlock()
}

// load reads ref's counter before its first call of the day on this replica, and before its
// first call after it was idle for two Refreshes (Run refreshes only the companies making calls,
// so what this replica knows of an idle one is as old as its last call); concurrent calls wait
// for the one read. A read that fails admits the call (fail open) and is not tried again before
// budgetStoreRetry.
func (b *Budgets) load(ctx context.Context, ref spendRef, c *companySpend, now time.Time) {
	c.mu.Lock()
	if (c.known && now.Sub(c.readAt) < 2*b.refresh) || now.Before(c.retryAt) {
		c.mu.Unlock()
		return
	}
	if wait := c.loading; wait != nil {
		c.mu.Unlock()
		t := time.NewTimer(b.readTimeout)
		defer t.Stop()
		select {
		case <-wait:
		case <-ctx.Done():
		case <-t.C:
		}
		return
	}
	done := make(chan struct{})
	c.loading = done
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.loading = nil
		c.mu.Unlock()
		close(done)
	}()
	rctx, cancel := context.WithTimeout(ctx, b.readTimeout)
	defer cancel()
	_ = b.read(rctx, ref, c, now)
}

// read reads ref's counter into c. A failure is counted (when ctx, the caller's, did not end)
// and holds the counter off the bucket for budgetStoreRetry.
func (b *Budgets) read(ctx context.Context, ref spendRef, c *companySpend, now time.Time) error {
	key := events.SpendKey(ref.company, ref.day)
	var used events.Spend
	var rev uint64
	entry, err := b.kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		err = nil
	case err != nil:
		err = fmt.Errorf("reading budget %s: %w", key, err)
	default:
		rev = entry.Revision()
		if used, err = events.DecodeSpend(entry.Value()); err != nil {
			err = fmt.Errorf("reading budget %s: %w", key, err)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			c.retryAt = now.Add(budgetStoreRetry)
			b.failures.Failed(err)
		}
		return err
	}
	if !c.known || rev >= c.rev {
		c.used, c.rev, c.known, c.readAt = used, rev, true, now
	}
	return nil
}

// Ready is closed once Run runs.
func (b *Budgets) Ready() <-chan struct{} { return b.ready }

// Run writes the companies' spend every Flush and reads again the counters of companies making
// calls every Refresh, until ctx ends; then it writes what is left, for at most budgetDrain
// (the proxy, stopped first, has drained its calls).
func (b *Budgets) Run(ctx context.Context) error {
	close(b.ready)
	tick := time.NewTicker(b.flush)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), budgetDrain)
			defer cancel()
			b.sync(dctx, true)
			return nil
		case <-tick.C:
			b.sync(ctx, false)
		}
	}
}

// sync writes each company's pending spend, refreshes the active ones and forgets the idle.
// Every replica's Run is the only writer of its companies' counters.
func (b *Budgets) sync(ctx context.Context, final bool) {
	now := b.now()
	today := events.SpendDay(now)
	b.mu.Lock()
	refs := make([]spendRef, 0, len(b.companies))
	for ref := range b.companies {
		refs = append(refs, ref)
	}
	b.mu.Unlock()
	for _, ref := range refs {
		if ctx.Err() != nil {
			return
		}
		b.mu.Lock()
		c := b.companies[ref]
		b.mu.Unlock()
		c.mu.Lock()
		pending, known, retryAt, readAt, active, loading := c.pending, c.known, c.retryAt, c.readAt, c.active, c.loading != nil
		c.mu.Unlock()
		switch {
		case now.Before(retryAt) && !final:
		case !pending.IsZero():
			b.write(ctx, ref, c, now)
		case b.tokensPerDay > 0 && known && ref.day == today && now.Sub(readAt) >= b.refresh && now.Sub(active) < b.refresh:
			_ = b.read(ctx, ref, c, now)
		case !loading && (ref.day != today || now.Sub(active) >= budgetIdle):
			b.mu.Lock()
			c.mu.Lock()
			if c.pending.IsZero() && c.loading == nil {
				delete(b.companies, ref)
			}
			c.mu.Unlock()
			b.mu.Unlock()
		}
	}
}

// write adds c's pending spend to ref's counter with compare-and-set, reading it again when
// another replica moved it. A write the bucket refuses leaves the spend pending (fail open).
func (b *Budgets) write(ctx context.Context, ref spendRef, c *companySpend, now time.Time) {
	key := events.SpendKey(ref.company, ref.day)
	c.mu.Lock()
	known := c.known
	c.mu.Unlock()
	if !known {
		if err := b.read(ctx, ref, c, now); err != nil {
			return
		}
	}
	for range budgetCASAttempts {
		c.mu.Lock()
		pending, used, rev := c.pending, c.used, c.rev
		c.mu.Unlock()
		total := used.Add(pending)
		var next uint64
		var err error
		if rev == 0 {
			next, err = b.kv.Create(ctx, key, total.Encode())
		} else {
			next, err = b.kv.Update(ctx, key, total.Encode(), rev)
		}
		if cas.IsConflict(err) {
			if err := b.read(ctx, ref, c, now); err != nil {
				return
			}
			continue
		}
		if err != nil {
			if ctx.Err() == nil {
				c.mu.Lock()
				c.retryAt = now.Add(budgetStoreRetry)
				c.mu.Unlock()
				b.failures.Failed(fmt.Errorf("writing budget %s: %w", key, err))
			}
			return
		}
		c.mu.Lock()
		// Calls that ended meanwhile stay pending for the next write.
		c.pending = events.Spend{Requests: c.pending.Requests - pending.Requests, Tokens: c.pending.Tokens - pending.Tokens}
		c.used, c.rev, c.known, c.readAt, c.retryAt = total, next, true, now, time.Time{}
		c.mu.Unlock()
		b.failures.Wrote()
		return
	}
	b.log.Warn().Str(events.LogKeyTenant, ref.company).Msg("writing a company's broker spend: " + cas.ErrContended.Error() + "; retried at the next flush")
}
