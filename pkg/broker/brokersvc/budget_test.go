package brokersvc_test

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/brokersvc"
	"github.com/kubeclip/kubeclip/pkg/broker/ca"
	"github.com/kubeclip/kubeclip/pkg/broker/proxy"
	"github.com/kubeclip/kubeclip/pkg/events"
)

const (
	anthropicHost = "api.anthropic.com"
	openaiHost    = "api.openai.com"
	// Every upstream answer states 100 input and 50 output tokens: 150 a call.
	tokensPerCall = 150
	// The names the refusals give the budgets, as cmd/credential-broker passes its flags'.
	tokensFlag   = "--company-tokens-per-day (KUBECLIP_BROKER_COMPANY_TOKENS_PER_DAY)"
	requestsFlag = "--company-requests-per-second (KUBECLIP_BROKER_COMPANY_REQUESTS_PER_SECOND)"
)

var openai = broker.Binding{Hosts: []string{openaiHost}, Headers: []broker.Header{broker.HeaderAuthorization}}

// modelUpstream stands in for the model APIs over real TLS (its certificates from a CA of its
// own, which the broker trusts and the pod does not), answering every call with its usage.
type modelUpstream struct {
	srv   *httptest.Server
	roots *x509.CertPool
	calls atomic.Int64
}

func startModelUpstream(t *testing.T) *modelUpstream {
	t.Helper()
	public, err := ca.Generate(ca.Options{Hosts: []string{anthropicHost, openaiHost}})
	if err != nil {
		t.Fatal(err)
	}
	iss, err := ca.NewIssuer(ca.IssuerOptions{CA: public, Hosts: []string{anthropicHost, openaiHost}})
	if err != nil {
		t.Fatal(err)
	}
	u := &modelUpstream{roots: public.Pool()}
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		u.calls.Add(1)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/chat/completions" {
			_, _ = io.WriteString(w, `{"id":"c","model":"gpt-test","usage":{"prompt_tokens":100,"completion_tokens":50}}`)
			return
		}
		_, _ = io.WriteString(w, `{"id":"m","type":"message","model":"claude-test","usage":{"input_tokens":100,"output_tokens":50}}`)
	}))
	u.srv.TLS = &tls.Config{GetCertificate: iss.GetCertificate}
	u.srv.StartTLS()
	t.Cleanup(u.srv.Close)
	return u
}

// budgetEnv is what broker replicas share: a real nats-server with the grants and budgets
// buckets, the installation CA, the sealing key, and the upstream.
type budgetEnv struct {
	js      jetstream.JetStream
	grants  jetstream.KeyValue
	budgets jetstream.KeyValue
	sealer  *broker.Sealer
	store   *broker.Store
	install *ca.CA
	issuer  *ca.Issuer
	up      *modelUpstream
}

func newBudgetEnv(t *testing.T, storeBytes int64) *budgetEnv {
	t.Helper()
	_, _, js := natstest.Start(t)
	e := &budgetEnv{js: js, up: startModelUpstream(t)}
	var err error
	if e.grants, err = js.CreateKeyValue(t.Context(), broker.BucketOptions{StoreBytes: 1 << 30}.Config()); err != nil {
		t.Fatal(err)
	}
	if e.budgets, err = events.EnsureBucket(t.Context(), js, events.BudgetBucketConfig(1, 0, storeBytes)); err != nil {
		t.Fatal(err)
	}
	key := make([]byte, broker.SealingKeyLen)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	if e.sealer, err = broker.NewSealer(key); err != nil {
		t.Fatal(err)
	}
	if e.store, err = broker.NewStore(broker.StoreOptions{KV: e.grants, Sealer: e.sealer, GrantsPerCompany: 10}); err != nil {
		t.Fatal(err)
	}
	if e.install, err = ca.Generate(ca.Options{Hosts: []string{anthropicHost, openaiHost}}); err != nil {
		t.Fatal(err)
	}
	if e.issuer, err = ca.NewIssuer(ca.IssuerOptions{CA: e.install, Hosts: []string{anthropicHost, openaiHost}}); err != nil {
		t.Fatal(err)
	}
	return e
}

// mint gives company's lease a placeholder of key, bound to the pod 127.0.0.1.
func (e *budgetEnv) mint(t *testing.T, company, key string, b broker.Binding) string {
	t.Helper()
	p, _, err := e.store.Mint(t.Context(), broker.MintRequest{
		Company: company, Run: "run-" + company, Lease: "lease-" + company, Key: key, Binding: b,
		Peer: netip.MustParseAddr("127.0.0.1"), Value: "sk-real-" + company,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p.Reveal()
}

// replica is one broker replica as cmd/credential-broker wires it: its own grant cache, budgets,
// usage observer and TLS proxy.
type replica struct {
	addr     string
	reg      *prometheus.Registry
	failures *atomic.Int64 // writes and reads of the budgets bucket that failed (fail open)
}

func (e *budgetEnv) replica(t *testing.T, o brokersvc.BudgetOptions) *replica {
	t.Helper()
	log := zerolog.New(zerolog.NewTestWriter(t))
	r := &replica{reg: prometheus.NewRegistry(), failures: new(atomic.Int64)}
	cache, err := broker.NewCache(broker.CacheOptions{KV: e.grants, Sealer: e.sealer, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	run(t, cache)
	o.KV, o.Registerer, o.Log = e.budgets, r.reg, log
	o.RequestsBudget, o.TokensBudget = requestsFlag, tokensFlag
	o.StoreFailures = events.NewStoreFailures(log, events.BudgetBucket, func(string) { r.failures.Add(1) })
	budgets, err := brokersvc.NewBudgets(o)
	if err != nil {
		t.Fatal(err)
	}
	run(t, budgets)
	usage, err := brokersvc.NewUsage(brokersvc.UsageOptions{Budgets: budgets, Registerer: r.reg, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	p, err := proxy.New(proxy.Options{
		Routes: []proxy.Route{
			{Host: anthropicHost, Address: e.up.srv.Listener.Addr().String()},
			{Host: openaiHost, Address: e.up.srv.Listener.Addr().String(), Errors: proxy.ErrorsOpenAI},
		},
		Resolver: cache, Observer: usage, RootCAs: e.up.roots, Registerer: r.reg, Log: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r.addr = ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- p.Serve(ctx, ln, e.issuer) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return r
}

type answer struct {
	status int
	header http.Header
	body   string
}

// call is a pod's model call through replica r: it dials the broker for host (as the pod's
// /etc/hosts has it) and trusts only the installation CA. It returns once r has counted the
// call's spend (its kubeclip_broker_calls_total moved), so the next call sees it.
func (e *budgetEnv) call(t *testing.T, r *replica, host, path string, header http.Header) answer {
	t.Helper()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, r.addr)
		},
		TLSClientConfig: &tls.Config{RootCAs: e.install.Pool()},
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "https://"+host+path, strings.NewReader(`{"model":"m","max_tokens":5}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header
	before := r.metric(t, "kubeclip_broker_calls_total", "")
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("calling %s through the broker: %v", host, err)
	}
	body, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusOK {
		eventually(t, "the call's end to be counted", func() bool { return r.metric(t, "kubeclip_broker_calls_total", "") > before })
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: string(body)}
}

// metric sums name's series whose label values include label ("": all of them).
func (r *replica) metric(t *testing.T, name, label string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, l := range m.GetLabel() {
				match = match || l.GetValue() == label
			}
			if match {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func anthropicKey(p string) http.Header {
	return http.Header{"X-Api-Key": {p}, "Anthropic-Version": {"2023-06-01"}}
}

func openaiKey(p string) http.Header { return http.Header{"Authorization": {"Bearer " + p}} }

// anthropicError decodes an Anthropic error body, strictly: nothing but its shape.
func anthropicError(t *testing.T, body string) (typ, message string) {
	t.Helper()
	var v struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"error"`
	}
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil || v.Type != "error" {
		t.Fatalf("not Anthropic's error shape: %s (%v)", body, err)
	}
	return v.Error.Type, v.Error.Message
}

// openaiError decodes an OpenAI error body, strictly.
func openaiError(t *testing.T, body string) (typ, code, message string) {
	t.Helper()
	var v struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    string  `json:"code"`
		} `json:"error"`
	}
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("not OpenAI's error shape: %s (%v)", body, err)
	}
	return v.Error.Type, v.Error.Code, v.Error.Message
}

// TestBudgetExceededIsTheAgentsClear429: over real TLS, through the proxy as a pod calls it, a
// company's calls pass until the tokens its upstream stated reach its budget of the day; then
// the agent gets 429 in the API's own shape (Anthropic rate_limit_error, OpenAI
// insufficient_quota), naming the budget's flag and when it resets, with Retry-After and
// X-Should-Retry: false, and the call never reaches the upstream. Another company is not affected. A request rate per replica
// answers 429 rate_limit_error / rate_limit_exceeded with the wait. Each refusal is counted by
// budget, with no company label.
func TestBudgetExceededIsTheAgentsClear429(t *testing.T) {
	e := newBudgetEnv(t, 0)
	now := time.Now()
	tomorrow := events.SpendDayStart(events.SpendDay(now) + 1).Format(time.RFC3339)
	r := e.replica(t, brokersvc.BudgetOptions{TokensPerDay: 400})
	acme := e.mint(t, "acme", "ANTHROPIC_API_KEY", anthropic)
	acmeOpenAI := e.mint(t, "acme", "OPENAI_API_KEY", openai)
	beta := e.mint(t, "beta", "ANTHROPIC_API_KEY", anthropic)

	// 0, 150 and 300 tokens spent: under 400, the calls pass.
	for i := range 3 {
		if a := e.call(t, r, anthropicHost, "/v1/messages", anthropicKey(acme)); a.status != http.StatusOK {
			t.Fatalf("call %d with %d tokens spent: %d %s, want 200", i+1, i*tokensPerCall, a.status, a.body)
		}
	}
	upstreamBefore := e.up.calls.Load()
	a := e.call(t, r, anthropicHost, "/v1/messages", anthropicKey(acme))
	typ, msg := anthropicError(t, a.body)
	wantMsg := "kubeclip broker: company budget of 400 tokens per day (" + tokensFlag + ") exceeded: company acme has used 450 tokens today (UTC); it resets at " + tomorrow
	if a.status != http.StatusTooManyRequests || typ != "rate_limit_error" || msg != wantMsg {
		t.Errorf("the call past the budget: %d %s %q,\nwant 429 rate_limit_error %q", a.status, typ, msg, wantMsg)
	}
	retry, err := strconv.Atoi(a.header.Get("Retry-After"))
	if err != nil || retry <= 0 || retry > 86400 || a.header.Get("X-Should-Retry") != "false" {
		t.Errorf("Retry-After %q, X-Should-Retry %q; want the seconds until midnight UTC, and false", a.header.Get("Retry-After"), a.header.Get("X-Should-Retry"))
	}
	o := e.call(t, r, openaiHost, "/v1/chat/completions", openaiKey(acmeOpenAI))
	otyp, ocode, omsg := openaiError(t, o.body)
	if o.status != http.StatusTooManyRequests || otyp != "insufficient_quota" || ocode != "insufficient_quota" || omsg != wantMsg {
		t.Errorf("the OpenAI call past the budget: %d %s/%s %q, want 429 insufficient_quota %q", o.status, otyp, ocode, omsg, wantMsg)
	}
	if n := e.up.calls.Load() - upstreamBefore; n != 0 {
		t.Errorf("the upstream got %d calls past the budget, want none", n)
	}
	if b := e.call(t, r, anthropicHost, "/v1/messages", anthropicKey(beta)); b.status != http.StatusOK {
		t.Errorf("another company's call: %d %s, want 200", b.status, b.body)
	}
	if n := r.metric(t, "kubeclip_broker_budget_exceeded_total", brokersvc.BudgetTokensPerDay); n != 2 {
		t.Errorf("kubeclip_broker_budget_exceeded_total{budget=tokens_per_day} = %v, want 2", n)
	}
	t.Logf("tokens/day: status %d, Retry-After %s s, body %s", a.status, a.header.Get("Retry-After"), a.body)

	// A request rate of 1 per second, burst 1, on another replica: the second call at once is
	// refused with the wait.
	rate := e.replica(t, brokersvc.BudgetOptions{RequestsPerSecond: 1})
	gamma := e.mint(t, "gamma", "OPENAI_API_KEY", openai)
	if g := e.call(t, rate, openaiHost, "/v1/chat/completions", openaiKey(gamma)); g.status != http.StatusOK {
		t.Fatalf("the first call under 1 request/s: %d %s", g.status, g.body)
	}
	g := e.call(t, rate, openaiHost, "/v1/chat/completions", openaiKey(gamma))
	gtyp, gcode, gmsg := openaiError(t, g.body)
	wantPrefix := "kubeclip broker: company budget of 1 requests per second per broker replica (" + requestsFlag + ") exceeded by company gamma; it allows the next call in "
	if g.status != http.StatusTooManyRequests || gtyp != "rate_limit_exceeded" || gcode != "rate_limit_exceeded" || !strings.HasPrefix(gmsg, wantPrefix) || g.header.Get("Retry-After") != "1" || g.header.Get("X-Should-Retry") != "" {
		t.Errorf("the second call within a second: %d %s/%s %q Retry-After %q,\nwant 429 rate_limit_exceeded %q… Retry-After 1", g.status, gtyp, gcode, gmsg, g.header.Get("Retry-After"), wantPrefix)
	}
	if n := rate.metric(t, "kubeclip_broker_budget_exceeded_total", brokersvc.BudgetRequestsPerSecond); n != 1 {
		t.Errorf("kubeclip_broker_budget_exceeded_total{budget=requests_per_second} = %v, want 1", n)
	}
	t.Logf("requests/s: status %d, Retry-After %s s, retry-after-ms %s, body %s", g.status, g.header.Get("Retry-After"), g.header.Get("Retry-After-Ms"), g.body)
}

// TestReplicasShareTheTokenBudget: two broker replicas count one company's tokens in the one
// shared counter. Neither replica's own calls reach the budget (B 150, A 300 of 400), together
// they do (450): both refuse the company's calls within a Refresh. A third replica that never
// served the company refuses its first call.
func TestReplicasShareTheTokenBudget(t *testing.T) {
	e := newBudgetEnv(t, 0)
	o := brokersvc.BudgetOptions{TokensPerDay: 400}
	a, b := e.replica(t, o), e.replica(t, o)
	acme := e.mint(t, "acme", "ANTHROPIC_API_KEY", anthropic)
	if r := e.call(t, b, anthropicHost, "/v1/messages", anthropicKey(acme)); r.status != http.StatusOK {
		t.Fatalf("B's call: %d %s", r.status, r.body)
	}
	for i := range 2 {
		if r := e.call(t, a, anthropicHost, "/v1/messages", anthropicKey(acme)); r.status != http.StatusOK {
			t.Fatalf("A's call %d: %d %s", i+1, r.status, r.body)
		}
	}
	spent := time.Now()
	key := events.SpendKey("acme", events.SpendDay(spent))
	eventually(t, "the shared counter to hold all three calls", func() bool {
		entry, err := e.budgets.Get(t.Context(), key)
		if err != nil {
			return false
		}
		s, err := events.DecodeSpend(entry.Value())
		return err == nil && s == events.Spend{Requests: 3, Tokens: 3 * tokensPerCall}
	})
	written := time.Since(spent)
	// Each replica refuses within its Refresh of the other's write: until it reads the counter
	// again (or its own write finds the other's), it may admit calls on what it knew.
	late := map[string]int{}
	refused := func(name string, r *replica) func() bool {
		return func() bool {
			ans := e.call(t, r, anthropicHost, "/v1/messages", anthropicKey(acme))
			if ans.status == http.StatusOK {
				late[name]++
				return false
			}
			_, msg := anthropicError(t, ans.body)
			if ans.status != http.StatusTooManyRequests || !strings.Contains(msg, "exceeded: company acme has used ") {
				t.Fatalf("replica %s: %d %q, want 429 naming the tokens of both replicas", name, ans.status, msg)
			}
			return true
		}
	}
	eventually(t, "replica A to refuse", refused("A", a))
	aRefused := time.Since(spent)
	eventually(t, "replica B to refuse", refused("B", b))
	bRefused := time.Since(spent)
	if !refused("C", e.replica(t, o))() {
		t.Error("a new replica admitted the company's first call past the shared budget")
	}
	t.Logf("spend in the shared counter %s after the last call; A refused %s and B %s after it (Refresh %s), admitting %d and %d calls before; upstream calls %d",
		written.Round(time.Millisecond), aRefused.Round(time.Millisecond), bRefused.Round(time.Millisecond), brokersvc.DefaultBudgetRefresh, late["A"], late["B"], e.up.calls.Load())
	if n, want := e.up.calls.Load(), int64(3+late["A"]+late["B"]); n != want {
		t.Errorf("the upstream got %d calls, want %d: the 3 within the budget and those admitted before a replica read the other's", n, want)
	}
}

// TestFullBudgetStoreFailsOpen: the budgets bucket is full (another source's counters filled
// its share of a 16 MiB store), so no spend can be written: a company within its budget still
// gets its calls through, every failed write is counted (kubeclip_store_write_errors_total's
// count), and a company past its budget is still refused on the replica's own count.
func TestFullBudgetStoreFailsOpen(t *testing.T) {
	e := newBudgetEnv(t, events.MinStoreBytes)
	filled := 0
	for ; ; filled++ {
		_, err := e.budgets.Create(t.Context(), fmt.Sprintf("log.company.filler.%d", filled), []byte("12345678"))
		if err != nil {
			t.Logf("the bucket is full after %d counters: %v", filled, err)
			break
		}
		if filled > 1_000_000 {
			t.Fatal("the budgets bucket never filled")
		}
	}
	r := e.replica(t, brokersvc.BudgetOptions{TokensPerDay: 400, Flush: 10 * time.Millisecond})
	within := e.mint(t, "within", "ANTHROPIC_API_KEY", anthropic)
	for i := range 2 { // 300 tokens of 400
		if a := e.call(t, r, anthropicHost, "/v1/messages", anthropicKey(within)); a.status != http.StatusOK {
			t.Fatalf("call %d of a company within its budget, the bucket full: %d %s, want 200", i+1, a.status, a.body)
		}
	}
	eventually(t, "the failed writes to be counted", func() bool { return r.failures.Load() > 0 })
	// Its own spend could not be written: its next call still goes through.
	if a := e.call(t, r, anthropicHost, "/v1/messages", anthropicKey(within)); a.status != http.StatusOK {
		t.Fatalf("a call of a company within its budget whose spend the full bucket refused: %d %s, want 200", a.status, a.body)
	}
	over := e.mint(t, "over", "ANTHROPIC_API_KEY", anthropic)
	statuses := []int{}
	for range 4 {
		statuses = append(statuses, e.call(t, r, anthropicHost, "/v1/messages", anthropicKey(over)).status)
	}
	if want := []int{200, 200, 200, 429}; fmt.Sprint(statuses) != fmt.Sprint(want) {
		t.Errorf("a company's calls past its budget with the bucket full: %v, want %v (refused on the replica's own count)", statuses, want)
	}
	if _, err := e.budgets.Get(t.Context(), events.SpendKey("within", events.SpendDay(time.Now()))); err == nil {
		t.Error("a spend counter was written into a full bucket")
	}
	t.Logf("bucket full after %d counters; failed budget writes counted: %d; past-budget company: %v", filled, r.failures.Load(), statuses)
}

// clock is a settable clock for Budgets.
type clock struct{ ns atomic.Int64 }

func (c *clock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// TestBudgetsReadAgainAfterIdle: a replica that counted a company's calls a while ago does not
// trust what it knew once the company was idle for two Refreshes: its next call reads the
// shared counter first, and is refused when another replica spent the rest meanwhile.
func TestBudgetsReadAgainAfterIdle(t *testing.T) {
	_, _, js := natstest.Start(t)
	kv, err := events.EnsureBucket(t.Context(), js, events.BudgetBucketConfig(1, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{}
	clk.ns.Store(time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC).UnixNano())
	key := events.SpendKey("acme", events.SpendDay(clk.now()))
	newBudgets := func() *brokersvc.Budgets {
		b, err := brokersvc.NewBudgets(brokersvc.BudgetOptions{KV: kv, TokensPerDay: 400, Flush: 5 * time.Millisecond, Now: clk.now, Log: zerolog.New(zerolog.NewTestWriter(t))})
		if err != nil {
			t.Fatal(err)
		}
		run(t, b)
		return b
	}
	holds := func(tokens int64) func() bool {
		return func() bool {
			entry, err := kv.Get(t.Context(), key)
			if err != nil {
				return false
			}
			s, err := events.DecodeSpend(entry.Value())
			return err == nil && s.Tokens == tokens
		}
	}
	b := newBudgets()
	if rej := b.Admit(t.Context(), "acme"); rej != nil {
		t.Fatal(rej.Message)
	}
	b.Spent("acme", 150)
	eventually(t, "B's spend written", holds(150))

	a := newBudgets()
	for range 2 {
		if rej := a.Admit(t.Context(), "acme"); rej != nil {
			t.Fatal(rej.Message)
		}
		a.Spent("acme", 150)
	}
	eventually(t, "A's spend written", holds(450))

	clk.advance(2 * brokersvc.DefaultBudgetRefresh)
	rej := b.Admit(t.Context(), "acme")
	if rej == nil || !strings.Contains(rej.Message, "has used 450 tokens") {
		t.Fatalf("B's call after two idle Refreshes: %+v, want refused on the 450 tokens of both", rej)
	}
}

// TestFailingBudgetStoreFailsOpen: the budgets bucket is gone (NATS answers every read and
// write of it with an error), so the replica can neither read nor write a counter: the company
// still gets its calls within its budget on the replica's own count, every failure is counted,
// and its call past the budget is refused.
func TestFailingBudgetStoreFailsOpen(t *testing.T) {
	e := newBudgetEnv(t, 0)
	r := e.replica(t, brokersvc.BudgetOptions{TokensPerDay: 400, Flush: 10 * time.Millisecond})
	if err := e.js.DeleteKeyValue(t.Context(), events.BudgetBucket); err != nil {
		t.Fatal(err)
	}
	acme := e.mint(t, "acme", "ANTHROPIC_API_KEY", anthropic)
	statuses := []int{}
	for range 4 {
		statuses = append(statuses, e.call(t, r, anthropicHost, "/v1/messages", anthropicKey(acme)).status)
	}
	if want := []int{200, 200, 200, 429}; fmt.Sprint(statuses) != fmt.Sprint(want) {
		t.Errorf("calls with the budgets bucket gone: %v, want %v (admitted, then refused on the replica's own count)", statuses, want)
	}
	if r.failures.Load() == 0 {
		t.Error("no failed read or write of the budgets bucket was counted")
	}
	t.Logf("bucket gone: calls %v, failed reads and writes counted %d", statuses, r.failures.Load())
}
