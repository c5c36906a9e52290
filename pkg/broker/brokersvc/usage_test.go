package brokersvc_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/brokersvc"
	"github.com/kubeclip/kubeclip/pkg/broker/proxy"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestUsageCountsWhatResponsesState: the observer meters each response as it streams (here in
// two writes), counts tokens by format and kind and calls by outcome, with no company or run
// label, and logs each call's usage with its ids at debug.
func TestUsageCountsWhatResponsesState(t *testing.T) {
	reg := prometheus.NewRegistry()
	var log strings.Builder
	u, err := brokersvc.NewUsage(brokersvc.UsageOptions{Registerer: reg, Log: zerolog.New(&log).Level(zerolog.DebugLevel)})
	if err != nil {
		t.Fatal(err)
	}
	grant := broker.Grant{Company: "company-a", Run: "run-1", Lease: "lease-1", Key: "OPENAI_API_KEY"}
	call := func(path string, status int, contentType, body string, upstreamErr error) {
		t.Helper()
		ex, err := u.Begin(t.Context(), proxy.Call{Grant: grant, Host: "api.openai.com", Request: httptest.NewRequest(http.MethodPost, "https://api.openai.com"+path, nil)})
		if err != nil {
			t.Fatal(err)
		}
		if upstreamErr != nil {
			ex.End(upstreamErr)
			return
		}
		ex.Response(status, http.Header{"Content-Type": {contentType}})
		half := len(body) / 2
		_, _ = ex.Write([]byte(body[:half]))
		_, _ = ex.Write([]byte(body[half:]))
		ex.End(nil)
	}
	call("/v1/responses", 200, "application/json", `{"id":"r","model":"gpt-test","usage":{"input_tokens":40,"output_tokens":9,"input_tokens_details":{"cached_tokens":10}}}`, nil)
	call("/v1/chat/completions", 200, "application/json", `{"id":"c","model":"gpt-test","usage":{"prompt_tokens":7,"completion_tokens":3}}`, nil)
	call("/v1/models", 200, "application/json", `{"data":[]}`, nil)
	call("/v1/responses", 0, "", "", errors.New("dial tcp: refused"))

	toks := gathered(t, reg, "kubeclip_broker_usage_tokens_total")
	for series, want := range map[string]float64{
		"openai_responses/input":      30, // the cached tokens are not input
		"openai_responses/cache_read": 10, "openai_responses/output": 9,
		"openai_chat_completions/input": 7, "openai_chat_completions/output": 3,
	} {
		if toks[series] != want {
			t.Errorf("tokens %s = %v, want %v", series, toks[series], want)
		}
	}
	calls := gathered(t, reg, "kubeclip_broker_calls_total")
	for series, want := range map[string]float64{
		"openai_responses/metered": 1, "openai_chat_completions/metered": 1, "none/path": 1, "openai_responses/failed": 1,
	} {
		if calls[series] != want {
			t.Errorf("calls %s = %v, want %v", series, calls[series], want)
		}
	}
	for _, name := range []string{"kubeclip_broker_calls_total", "kubeclip_broker_usage_tokens_total"} {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() != "format" && l.GetName() != "kind" && l.GetName() != "outcome" && l.GetName() != "result" {
						t.Errorf("%s has a label %s", name, l.GetName())
					}
				}
			}
		}
	}
	if !strings.Contains(log.String(), `"run_id":"run-1"`) || !strings.Contains(log.String(), `"input_tokens":30`) {
		t.Errorf("the debug log does not give the call's run and usage:\n%s", log.String())
	}
}

// gathered is a counter vector's values by "label/label".
func gathered(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var parts []string
			for _, l := range m.GetLabel() {
				parts = append(parts, l.GetValue())
			}
			out[strings.Join(parts, "/")] = m.GetCounter().GetValue()
		}
	}
	return out
}

// flakyPublisher stores usage events as a stream would (one copy per message id) and fails
// the first fail publishes after they were stored: the ack was lost.
type flakyPublisher struct {
	mu     sync.Mutex
	fail   int
	tries  int
	stored map[string]events.RunUsageEvent
	order  []string
}

func (p *flakyPublisher) Publish(_ context.Context, ev events.Event, _ ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	u := ev.(events.RunUsageEvent)
	id := events.UsageEventMsgID(events.Ref(u.CompanyID, u.RunID), u.Meter, u.Seq)
	p.tries++
	_, dup := p.stored[id]
	if !dup {
		p.stored[id] = u
		p.order = append(p.order, id)
	}
	if p.fail > 0 {
		p.fail--
		return nil, errors.New("nats: timeout")
	}
	return &jetstream.PubAck{Stream: "PAPERCLIP_RUNS", Duplicate: dup}, nil
}

func (p *flakyPublisher) snapshot() (tries int, evs []events.RunUsageEvent) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range p.order {
		evs = append(evs, p.stored[id])
	}
	return p.tries, evs
}

// TestUsagePublishesEachRunsDeltasOnce: with a flush interval of an hour, a grant's release
// publishes its run's usage at once; a publish whose ack was lost is retried identical at the
// next flush and stored once (the message id); the stored events add up to the calls exactly.
// A call of a run beyond MaxRuns, while the one run held has a call in flight, is refused 503.
func TestUsagePublishesEachRunsDeltasOnce(t *testing.T) {
	pub := &flakyPublisher{fail: 1, stored: map[string]events.RunUsageEvent{}}
	u, err := brokersvc.NewUsage(brokersvc.UsageOptions{Publisher: pub, FlushInterval: time.Hour, MaxRuns: 1, Log: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- u.Run(ctx) }()
	<-u.Ready()
	grant := broker.Grant{Company: "company-a", Run: "run-1", Lease: "lease-1", Key: "ANTHROPIC_API_KEY"}
	body := `{"id":"m","type":"message","model":"claude-test","usage":{"input_tokens":11,"output_tokens":4,"cache_read_input_tokens":2,"cache_creation_input_tokens":1}}`
	begin := func(g broker.Grant) (proxy.Exchange, error) {
		return u.Begin(t.Context(), proxy.Call{Grant: g, Host: "api.anthropic.com", Request: httptest.NewRequest(http.MethodPost, "https://api.anthropic.com/v1/messages", nil)})
	}
	const calls = 50
	for range calls {
		ex, err := begin(grant)
		if err != nil {
			t.Fatal(err)
		}
		ex.Response(200, http.Header{"Content-Type": {"application/json"}})
		_, _ = ex.Write([]byte(body))
		ex.End(nil)
	}
	inFlight, err := begin(grant)
	if err != nil {
		t.Fatal(err)
	}
	var rej *proxy.Rejection
	if _, err := begin(broker.Grant{Company: "company-b", Run: "run-9", Key: "ANTHROPIC_API_KEY"}); !errors.As(err, &rej) || rej.Status != http.StatusServiceUnavailable {
		t.Fatalf("a second run beyond MaxRuns 1: %v, want a 503 rejection", err)
	}
	inFlight.End(errors.New("dial tcp: refused"))

	u.Released(grant) // the first publish is stored but its ack lost
	waitFor(t, "the release's publish", func() bool { tries, _ := pub.snapshot(); return tries >= 1 })
	cancel() // the drain retries it: the same id, stored once
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	tries, evs := pub.snapshot()
	if len(evs) != 1 || tries != 2 {
		t.Fatalf("%d publishes stored %d events, want 2 publishes of one event: %+v", tries, len(evs), evs)
	}
	got := evs[0].Usage
	want := []events.ModelUsage{{Key: "ANTHROPIC_API_KEY", Host: "api.anthropic.com", Format: "anthropic_messages", Calls: calls + 1,
		InputTokens: 11 * calls, OutputTokens: 4 * calls, CacheReadTokens: 2 * calls, CacheWriteTokens: 1 * calls, Unmetered: map[string]int64{"failed": 1}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the stored usage (-want +got):\n%s", diff)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
