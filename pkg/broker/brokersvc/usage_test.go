package brokersvc_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/brokersvc"
	"github.com/kubeclip/kubeclip/pkg/broker/proxy"
)

// TestUsageCountsWhatResponsesState: the observer meters each response as it streams (here in
// two writes), counts tokens by format and kind and calls by outcome, with no company or run
// label, and logs each call's usage with its ids at debug.
func TestUsageCountsWhatResponsesState(t *testing.T) {
	reg := prometheus.NewRegistry()
	var log strings.Builder
	u, err := brokersvc.NewUsage(reg, zerolog.New(&log).Level(zerolog.DebugLevel))
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
					if l.GetName() != "format" && l.GetName() != "kind" && l.GetName() != "outcome" {
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
