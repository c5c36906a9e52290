package brokersvc

import (
	"context"
	"fmt"
	"net/http"

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
// company, run, lease and key in the debug log. It never refuses a call (budgets are next).
type Usage struct {
	tokens *prometheus.CounterVec
	calls  *prometheus.CounterVec
	log    zerolog.Logger
}

var _ proxy.Observer = (*Usage)(nil)

// The token kinds of kubeclip_broker_usage_tokens_total.
const (
	TokensInput      = "input"
	TokensOutput     = "output"
	TokensCacheRead  = "cache_read"
	TokensCacheWrite = "cache_write"
)

// OutcomeMetered and OutcomeFailed label kubeclip_broker_calls_total beside meter.Reason's
// values: a call metered in full, and one whose upstream never answered.
const (
	OutcomeMetered = "metered"
	OutcomeFailed  = "failed"
)

func formats() []meter.Format {
	return []meter.Format{meter.FormatNone, meter.AnthropicMessages, meter.OpenAIChatCompletions, meter.OpenAIResponses}
}

func outcomes() []string {
	return []string{OutcomeMetered, OutcomeFailed, string(meter.ReasonPath), string(meter.ReasonEncoded), string(meter.ReasonContentType),
		string(meter.ReasonMalformed), string(meter.ReasonBadValue), string(meter.ReasonInconsistent), string(meter.ReasonTruncated), string(meter.ReasonNoUsage)}
}

// NewUsage registers the usage metrics on reg (nil: not registered).
func NewUsage(reg prometheus.Registerer, log zerolog.Logger) (*Usage, error) {
	u := &Usage{
		tokens: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeclip_broker_usage_tokens_total",
			Help: "Tokens the model APIs stated in the responses the credential broker forwarded, by format (anthropic_messages, openai_chat_completions, openai_responses) and kind (input not cached, output, cache_read, cache_write).",
		}, []string{"format", "kind"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kubeclip_broker_calls_total",
			Help: "Calls the credential broker forwarded, by format (none: a path it does not meter) and outcome (metered; failed: no response; else why the response was not metered, pkg/broker/meter's reasons).",
		}, []string{"format", "outcome"}),
		log: log,
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
	if reg != nil {
		for _, c := range []prometheus.Collector{u.tokens, u.calls} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("registering the broker's usage metrics: %w", err)
			}
		}
	}
	return u, nil
}

// Begin follows one call.
func (u *Usage) Begin(_ context.Context, call proxy.Call) (proxy.Exchange, error) {
	return &exchange{u: u, grant: call.Grant, host: call.Host, format: meter.FormatOf(call.Request.URL.Path)}, nil
}

// exchange meters one call. The proxy calls it from the call's goroutine, in order.
type exchange struct {
	u      *Usage
	grant  broker.Grant
	host   string
	format meter.Format
	status int
	m      *meter.Meter
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
	if e.m == nil { // the upstream never answered
		e.u.calls.WithLabelValues(format, OutcomeFailed).Inc()
		log.AnErr("call_error", err).Msg("a brokered call got no response")
		return
	}
	r := e.m.Result()
	outcome := OutcomeMetered
	if !r.Metered {
		outcome = string(r.Reason)
	}
	e.u.calls.WithLabelValues(format, outcome).Inc()
	if r.Format != meter.FormatNone {
		e.u.tokens.WithLabelValues(format, TokensInput).Add(float64(r.InputTokens))
		e.u.tokens.WithLabelValues(format, TokensOutput).Add(float64(r.OutputTokens))
		e.u.tokens.WithLabelValues(format, TokensCacheRead).Add(float64(r.CacheReadTokens))
		e.u.tokens.WithLabelValues(format, TokensCacheWrite).Add(float64(r.CacheWriteTokens))
	}
	log.Int("status", e.status).Str("model", r.Model).Bool("stream", r.Stream).
		Int64("input_tokens", r.InputTokens).Int64("output_tokens", r.OutputTokens).
		Int64("cache_read_tokens", r.CacheReadTokens).Int64("cache_write_tokens", r.CacheWriteTokens).
		Bool("metered", r.Metered).Bool("complete", r.Complete).Str("reason", string(r.Reason)).Str("detail", r.Detail).
		AnErr("call_error", err).Msg("brokered call usage")
}
