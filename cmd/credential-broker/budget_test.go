package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/broker/ca"
	"github.com/kubeclip/kubeclip/pkg/broker/mintclient"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// TestBudgetFlags runs the broker as its binary does, on the shipped broker user, with
// --company-tokens-per-day 100: each call states 40 tokens (input 31, output 9; cache tokens are
// not charged), so the third call (80 spent) passes and the fourth (120) gets the agent a 429
// naming the flag; the broker's counter of the day in KUBECLIP_BUDGETS holds the three calls
// and their 120 tokens, and /metrics counts the refusal with no company label.
func TestBudgetFlags(t *testing.T) {
	srv := natstest.StartWithAuth(t, "../../"+natstest.ShippedAuthConf)
	ctx := t.Context()
	_, js := connectAs(t, srv.ClientURL(), "kubeclip", inbox.WorkersPrefix)
	if err := events.EnsureStreams(ctx, js, events.Options{StoreBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	up, upstreamCA := startAnthropicUpstream(t, dir)
	f := writeFiles(t, []string{"api.anthropic.com"}, fmt.Sprintf(
		`{"ANTHROPIC_API_KEY": {"hosts": ["api.anthropic.com"], "headers": ["x-api-key"], "errors": "anthropic", "upstreams": {"api.anthropic.com": %q}}}`,
		up.srv.Listener.Addr().String()))
	ports := natstest.FreePorts(t, 2)
	listen, opsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])), net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	args := append(f.args(), "--nats-url", srv.ClientURL(), "--nats-user", "broker", "--listen", listen, "--ops-addr", opsAddr,
		"--upstream-ca", upstreamCA, "--store-bytes", strconv.Itoa(1<<30), "--company-tokens-per-day", "100")
	startBroker(t, args, opsAddr, io.Discard)
	opsClient := &http.Client{Timeout: 2 * time.Second}
	defer opsClient.CloseIdleConnections()

	client, _ := connectAs(t, srv.ClientURL(), "paperclip", inbox.PaperclipPrefix)
	minter, err := mintclient.New(mintclient.Options{NATS: client, InboxPrefix: inbox.PaperclipPrefix})
	if err != nil {
		t.Fatal(err)
	}
	brokerKey, err := minter.Key(ctx)
	if err != nil {
		t.Fatalf("the broker's key: %v", err)
	}
	reply, err := minter.Mint(ctx, brokerKey, mintclient.Lease{CompanyID: "company-a", RunID: "run-1", LeaseID: "lease-1"}, "ANTHROPIC_API_KEY", realValue)
	if err != nil {
		t.Fatalf("mint: %v", err)
	}
	bindPod(t, js, "company-a", "run-1", "127.0.0.1") // the run-watcher names the run's pod
	authority, err := ca.Parse(mustRead(t, f.caCert), mustRead(t, f.caKey))
	if err != nil {
		t.Fatal(err)
	}
	agent := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: authority.Pool(), MinVersion: tls.VersionTLS12},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, listen)
		},
	}}
	defer agent.CloseIdleConnections()
	call := func() (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://api.anthropic.com/v1/messages", strings.NewReader(`{"model":"claude-test","max_tokens":64,"messages":[]}`))
		req.Header.Set("X-Api-Key", reply.Placeholder)
		resp, err := agent.Do(req)
		if err != nil {
			t.Fatalf("calling through the broker: %v", err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}
	for i := range 3 {
		if status, b := call(); status != http.StatusOK {
			t.Fatalf("call %d, %d tokens spent of 100: %d %s", i+1, 40*i, status, b)
		}
		eventually(t, "the call's end to be counted", 5*time.Second, func() bool {
			return scrape(t, opsClient, opsAddr)[`kubeclip_broker_calls_total{format="anthropic_messages",outcome="metered"}`] == float64(i+1)
		})
	}
	status, b := call()
	want := `{"type":"error","error":{"type":"rate_limit_error","message":"kubeclip broker: company budget of 100 tokens per day (--company-tokens-per-day (KUBECLIP_BROKER_COMPANY_TOKENS_PER_DAY)) exceeded: company company-a has used 120 tokens today (UTC); it resets at `
	if status != http.StatusTooManyRequests || !strings.HasPrefix(b, want) {
		t.Errorf("the call past the budget: %d %s, want 429 %s…", status, b, want)
	}
	if n := len(up.seen()); n != 3 {
		t.Errorf("the upstream got %d calls, want the 3 within the budget", n)
	}
	if got := scrape(t, opsClient, opsAddr)[`kubeclip_broker_budget_exceeded_total{budget="tokens_per_day"}`]; got != 1 {
		t.Errorf(`kubeclip_broker_budget_exceeded_total{budget="tokens_per_day"} = %v, want 1`, got)
	}
	_, brokerJS := connectAs(t, srv.ClientURL(), "broker", inbox.BrokerPrefix)
	kv, err := brokerJS.KeyValue(ctx, events.BudgetBucket)
	if err != nil {
		t.Fatal(err)
	}
	key := events.SpendKey("company-a", events.SpendDay(time.Now()))
	var spend events.Spend
	eventually(t, "the company's spend in its counter", 5*time.Second, func() bool {
		entry, err := kv.Get(ctx, key)
		if err != nil {
			return false
		}
		spend, err = events.DecodeSpend(entry.Value())
		return err == nil && spend == events.Spend{Requests: 3, Tokens: 120}
	})
	t.Logf("429 body: %s; counter %s = %+v", b, key, spend)
}
