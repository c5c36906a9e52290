package brokersvc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/meter"
	"github.com/kubeclip/kubeclip/pkg/broker/proxy"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// Usage is the proxy's Observer that meters every forwarded call from the upstream's response
// (pkg/broker/meter), as the body streams to the agent: tokens by format and kind, calls by
// format and outcome, in metrics without any company or run label; each call's usage with its
// company, run, lease and key in the debug log; and, with a Publisher, per run on the run
// stream (events.RunUsageEvent): the calls' usage is coalesced per run in memory (ledger) and
// published at most once per run per flush interval, and at once when the run's grant is
// released (Released). It refuses a call when its company's budget is used up (Budgets: 429,
// before the call is forwarded), and when it could not account for it (the ledger full: 503).
type Usage struct {
	tokens *prometheus.CounterVec
	calls  *prometheus.CounterVec
	events *prometheus.CounterVec
	runs   prometheus.GaugeFunc
	log    zerolog.Logger

	pub     UsagePublisher // nil: metrics and log only
	budgets *Budgets       // nil: none
	ledger  *ledger
	flush   time.Duration
	timeout time.Duration
	wake    chan struct{} // a grant was released: flush its run now
	ready   chan struct{}
}

var _ proxy.Observer = (*Usage)(nil)

// UsagePublisher is the part of events.Publisher Usage publishes with.
type UsagePublisher interface {
	Publish(ctx context.Context, ev events.Event, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}

var _ UsagePublisher = (*events.Publisher)(nil)

// Defaults of UsageOptions.
const (
	// DefaultUsageFlush is how often a run's usage is published at most: an agent making
	// thousands of calls a second makes one event a second, and Paperclip sees spend within
	// about a second.
	DefaultUsageFlush = time.Second
	// DefaultUsageRuns bounds the runs whose usage a replica holds: a few hundred bytes each,
	// a few MiB at the bound, far more runs than a replica serves at once.
	DefaultUsageRuns = 10_000
	// usageIdleFlushes keeps an idle run's meter for a minute of 1 s flushes, so a run calling
	// every few seconds keeps one meter and seqs without gaps.
	usageIdleFlushes = 60
	// usagePublishers publish a flush's events in parallel: one run's stream ack waits on no
	// other's.
	usagePublishers = 8
	// DefaultUsageDrain bounds the last flush at shutdown, after the proxy drained its calls.
	DefaultUsageDrain = 10 * time.Second
)

// UsageOptions configure NewUsage.
type UsageOptions struct {
	// Publisher publishes the usage events (nil: none; metrics and the log only).
	Publisher UsagePublisher
	// Budgets admit each call before it is forwarded and are charged when it ends (nil: none).
	// Run does not run them: the caller runs Budgets.Run beside Usage.Run.
	Budgets *Budgets
	// Registerer gets the usage metrics (nil: not registered).
	Registerer prometheus.Registerer
	// Log gets each call's usage at debug, and publishes that failed.
	Log zerolog.Logger
	// FlushInterval is how often a run's usage is published at most (0: DefaultUsageFlush).
	FlushInterval time.Duration
	// MaxRuns bounds the runs held (0: DefaultUsageRuns); a call of one more is refused.
	MaxRuns int
	// PublishTimeout bounds one publish (0: 5 s); a publish that fails is retried, identical,
	// at the next flush.
	PublishTimeout time.Duration
	// Now stamps the events (nil: time.Now); NewMeter names a run's meter (nil: a ULID).
	Now      func() time.Time
	NewMeter func() string
}

// The token kinds of kubeclip_broker_usage_tokens_total.
const (
	TokensInput      = "input"
	TokensOutput     = "output"
	TokensCacheRead  = "cache_read"
	TokensCacheWrite = "cache_write"
)

// OutcomeMetered and OutcomeFailed label kubeclip_broker_calls_total beside meter.Reason's
// values: a call metered in full, and one whose upstream never answered. OutcomeFull is a call
// refused because the usage ledger had no room for its run.
const (
	OutcomeMetered = "metered"
	OutcomeFailed  = "failed"
	OutcomeFull    = "usage_full"
)

// The results of kubeclip_broker_usage_events_total.
const (
	eventStored    = "stored"
	eventDuplicate = "duplicate"
	eventFailed    = "failed"
)

func formats() []meter.Format {
	return []meter.Format{meter.FormatNone, meter.AnthropicMessages, meter.OpenAIChatCompletions, meter.OpenAIResponses}
}

func outcomes() []string {
	return []string{OutcomeMetered, OutcomeFailed, OutcomeFull, string(meter.ReasonPath), string(meter.ReasonEncoded), string(meter.ReasonContentType),
		string(meter.ReasonMalformed), string(meter.ReasonBadValue), string(meter.ReasonInconsistent), string(meter.ReasonTruncated), string(meter.ReasonNoUsage)}
}

// NewUsage checks o and registers the usage metrics.
func NewUsage(o UsageOptions) (*Usage, error) {
	switch {
	case o.FlushInterval < 0:
		return nil, errors.New("brokersvc.UsageOptions.FlushInterval must not be negative")
	case o.MaxRuns < 0:
		return nil, errors.New("brokersvc.UsageOptions.MaxRuns must not be negative")
	}
	if o.FlushInterval == 0 {
		o.FlushInterval = DefaultUsageFlush
	}
	if o.MaxRuns == 0 {
		o.MaxRuns = DefaultUsageRuns
	}
	if o.PublishTimeout <= 0 {
		o.PublishTimeout = 5 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.NewMeter == nil {
		o.NewMeter = func() string { return ulid.Make().String() }
	}
	u := &Usage{
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeclip_broker_usage_tokens_total",
			Help: "Tokens the model APIs stated in the responses the credential broker forwarded, by format (anthropic_messages, openai_chat_completions, openai_responses) and kind (input not cached, output, cache_read, cache_write).",
		}, []string{"format", "kind"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeclip_broker_calls_total",
			Help: "Calls the credential broker forwarded, by format (none: a path it does not meter) and outcome (metered; failed: no response; usage_full: refused, its run's usage could not be held; else why the response was not metered, pkg/broker/meter's reasons).",
		}, []string{"format", "outcome"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeclip_broker_usage_events_total",
			Help: "Publishes of usage events to the run stream, by result (stored; duplicate: a retry the stream had stored; failed: retried at the next flush).",
		}, []string{"result"}),
		log:     o.Log,
		pub:     o.Publisher,
		budgets: o.Budgets,
		ledger:  newLedger(o.MaxRuns, usageIdleFlushes, o.NewMeter, o.Now),
		flush:   o.FlushInterval,
		timeout: o.PublishTimeout,
		wake:    make(chan struct{}, 1),
		ready:   make(chan struct{}),
	}
	u.runs = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kubeclip_broker_usage_runs",
		Help: "Runs whose usage the credential broker holds in memory (bounded by its usage runs setting).",
	}, func() float64 { return float64(u.ledger.len()) })
	for _, r := range []string{eventStored, eventDuplicate, eventFailed} {
		u.events.WithLabelValues(r)
	}
	for _, f := range formats() {
		if f != meter.FormatNone {
			for _, k := range []string{TokensInput, TokensOutput, TokensCacheRead, TokensCacheWrite} {
				u.tokens.WithLabelValues(f.String(), k)
			}
		}
		for _, o := range outcomes() {
			u.calls.WithLabelValues(f.String(), o)
		}
	}
	if o.Registerer != nil {
		for _, c := range []prometheus.Collector{u.tokens, u.calls, u.events, u.runs} {
			if err := o.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("registering the broker's usage metrics: %w", err)
			}
		}
	}
	return u, nil
}

// Begin follows one call. A company over a budget is refused (429) first. With a publisher it
// holds the run's count until the call ends, and refuses the call (503) when the ledger has no
// room for one more run: a call the broker could not account for is not forwarded.
func (u *Usage) Begin(ctx context.Context, call proxy.Call) (proxy.Exchange, error) {
	if u.budgets != nil {
		if rej := u.budgets.Admit(ctx, call.Grant.Company); rej != nil {
			return nil, rej
		}
	}
	ex := &exchange{u: u, grant: call.Grant, host: call.Host, format: meter.FormatOf(call.Request.URL.Path)}
	if u.pub != nil {
		if err := u.ledger.begin(events.Ref(call.Grant.Company, call.Grant.Run)); err != nil {
			u.calls.WithLabelValues(ex.format.String(), OutcomeFull).Inc()
			u.log.Warn().Str(events.LogKeyTenant, call.Grant.Company).Str(events.LogKeyRunID, call.Grant.Run).Msg("refused a brokered call: " + err.Error())
			return nil, &proxy.Rejection{Status: http.StatusServiceUnavailable, Message: "kubeclip broker: the broker cannot account for more runs' usage right now; retry shortly"}
		}
		ex.held = true
	}
	return ex, nil
}

// Released is the grant cache's news of a released grant (broker.CacheOptions.Released): the
// run's usage is published at once rather than at the next flush. It never blocks.
func (u *Usage) Released(g broker.Grant) {
	if u.pub == nil || !u.ledger.released(events.Ref(g.Company, g.Run)) {
		return
	}
	select {
	case u.wake <- struct{}{}:
	default: // a flush is already due
	}
}

// Ready is closed once Run runs.
func (u *Usage) Ready() <-chan struct{} { return u.ready }

// Run publishes the runs' usage every flush interval and at each release until ctx ends, then
// publishes what is left (the proxy, stopped first, has drained its calls), for at most
// DefaultUsageDrain.
func (u *Usage) Run(ctx context.Context) error {
	close(u.ready)
	if u.pub == nil {
		<-ctx.Done()
		return nil
	}
	tick := time.NewTicker(u.flush)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return u.drain(context.WithoutCancel(ctx))
		case <-tick.C:
			u.publish(ctx, u.ledger.due(false))
		case <-u.wake:
			u.publish(ctx, u.ledger.due(true))
		}
	}
}

// drain publishes until nothing is left or DefaultUsageDrain passed.
func (u *Usage) drain(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, DefaultUsageDrain)
	defer cancel()
	for u.ledger.unpublished() {
		u.publish(ctx, u.ledger.due(false))
		if !u.ledger.unpublished() {
			break
		}
		select {
		case <-ctx.Done():
			u.log.Error().Int("runs", u.ledger.len()).Msg("stopping with usage not published: the run stream did not take it in time")
			return nil
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// publish publishes evs in parallel and marks those the stream acknowledged; the others stay
// pending, identical, for the next flush.
func (u *Usage) publish(ctx context.Context, evs []events.RunUsageEvent) {
	sem := make(chan struct{}, usagePublishers)
	var wg sync.WaitGroup
	for _, ev := range evs {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			pctx, cancel := context.WithTimeout(ctx, u.timeout)
			defer cancel()
			ack, err := u.pub.Publish(pctx, ev)
			switch {
			case err != nil:
				u.events.WithLabelValues(eventFailed).Inc()
				u.log.Warn().Err(err).Str(events.LogKeyTenant, ev.CompanyID).Str(events.LogKeyRunID, ev.RunID).Uint64("seq", ev.Seq).Msg("publishing a run's usage failed; retried at the next flush")
				return
			case ack.Duplicate:
				u.events.WithLabelValues(eventDuplicate).Inc()
			default:
				u.events.WithLabelValues(eventStored).Inc()
			}
			u.ledger.stored(events.Ref(ev.CompanyID, ev.RunID), ev.Seq)
		}()
	}
	wg.Wait()
}

// spent charges a call that ended to its company's budgets: the tokens budget counts input
// and output tokens as the upstream stated them.
func (u *Usage) spent(company string, tokens int64) {
	if u.budgets != nil {
		u.budgets.Spent(company, tokens)
	}
}

// exchange meters one call. The proxy calls it from the call's goroutine, in order.
type exchange struct {
	u      *Usage
	grant  broker.Grant
	host   string
	format meter.Format
	status int
	m      *meter.Meter
	held   bool // the ledger holds the run's count for this call
}

func (e *exchange) Response(status int, header http.Header) {
	e.status = status
	e.m = meter.New(e.format, header)
}

func (e *exchange) Write(p []byte) (int, error) {
	if e.m != nil {
		_, _ = e.m.Write(p)
	}
	return len(p), nil
}

func (e *exchange) End(err error) {
	format := e.format.String()
	log := e.u.log.Debug().Str(events.LogKeyTenant, e.grant.Company).Str(events.LogKeyRunID, e.grant.Run).
		Str("lease", e.grant.Lease).Str("key", e.grant.Key).Str("host", e.host).Str("format", format)
	ref, row := events.Ref(e.grant.Company, e.grant.Run), usageRow{key: e.grant.Key, host: e.host, format: format}
	if e.m == nil { // the upstream never answered
		e.u.spent(e.grant.Company, 0)
		e.u.calls.WithLabelValues(format, OutcomeFailed).Inc()
		if e.held {
			e.u.ledger.end(ref, row, callUsage{outcome: OutcomeFailed})
		}
		log.AnErr("call_error", err).Msg("a brokered call got no response")
		return
	}
	r := e.m.Result()
	outcome := OutcomeMetered
	if !r.Metered {
		outcome = string(r.Reason)
	}
	var tokens int64 // a path not metered states nothing
	if r.Format != meter.FormatNone {
		tokens = r.InputTokens + r.OutputTokens
	}
	e.u.spent(e.grant.Company, tokens) // before the call is counted: who sees the count sees the spend
	e.u.calls.WithLabelValues(format, outcome).Inc()
	if r.Format != meter.FormatNone {
		e.u.tokens.WithLabelValues(format, TokensInput).Add(float64(r.InputTokens))
		e.u.tokens.WithLabelValues(format, TokensOutput).Add(float64(r.OutputTokens))
		e.u.tokens.WithLabelValues(format, TokensCacheRead).Add(float64(r.CacheReadTokens))
		e.u.tokens.WithLabelValues(format, TokensCacheWrite).Add(float64(r.CacheWriteTokens))
	}
	if e.held {
		cu := callUsage{input: r.InputTokens, output: r.OutputTokens, cacheRead: r.CacheReadTokens, cacheWrite: r.CacheWriteTokens}
		if r.Format == meter.FormatNone {
			cu = callUsage{} // as the metrics: a path not metered states nothing
		}
		if outcome != OutcomeMetered {
			cu.outcome = outcome
		}
		e.u.ledger.end(ref, row, cu)
	}
	log.Int("status", e.status).Str("model", r.Model).Bool("stream", r.Stream).
		Int64("input_tokens", r.InputTokens).Int64("output_tokens", r.OutputTokens).
		Int64("cache_read_tokens", r.CacheReadTokens).Int64("cache_write_tokens", r.CacheWriteTokens).
		Bool("metered", r.Metered).Bool("complete", r.Complete).Str("reason", string(r.Reason)).Str("detail", r.Detail).
		AnErr("call_error", err).Msg("brokered call usage")
}
