package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/ca"
	"github.com/kubeclip/kubeclip/pkg/broker/proxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	anthropicHost = "api.anthropic.com"
	openaiHost    = "api.openai.com"
	// The real values: the upstream must see them, the client never.
	realAnthropic = "sk-ant-api03-REAL-ANTHROPIC-never-reaches-the-pod"
	realOpenAI    = "sk-proj-REAL-OPENAI-never-reaches-the-pod"
)

var (
	anthropicBinding = broker.Binding{Hosts: []string{anthropicHost}, Headers: []broker.Header{broker.HeaderXAPIKey, broker.HeaderAuthorization}}
	openaiBinding    = broker.Binding{Hosts: []string{openaiHost}, Headers: []broker.Header{broker.HeaderAuthorization}}
)

// upstream stands in for the bound hosts: a TLS server on loopback whose certificates come
// from a CA of its own (standing in for the public web PKI), which the proxy trusts and the
// pod's client does not. It records what it received.
type upstream struct {
	srv *httptest.Server

	mu    sync.Mutex
	calls []http.Header // each request's headers, its Host added as "X-Test-Host"

	release  chan struct{} // lets /v1/stream finish
	finished atomic.Bool   // /v1/stream wrote its last event
}

func startUpstream(t testing.TB) (*upstream, *x509.CertPool) {
	t.Helper()
	public, err := ca.Generate(ca.Options{Hosts: []string{anthropicHost, openaiHost}})
	if err != nil {
		t.Fatal(err)
	}
	iss, err := ca.NewIssuer(ca.IssuerOptions{CA: public, Hosts: []string{anthropicHost, openaiHost}})
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{release: make(chan struct{})}
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(u.serve))
	u.srv.TLS = &tls.Config{GetCertificate: iss.GetCertificate}
	u.srv.EnableHTTP2 = true
	u.srv.StartTLS()
	t.Cleanup(u.srv.Close)
	return u, public.Pool()
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	h := r.Header.Clone()
	h.Set("X-Test-Host", r.Host)
	u.mu.Lock()
	u.calls = append(u.calls, h)
	u.mu.Unlock()
	switch r.URL.Path {
	case "/v1/stream":
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, sseFirst)
		w.(http.Flusher).Flush()
		select {
		case <-u.release:
		case <-time.After(10 * time.Second):
		}
		_, _ = io.WriteString(w, sseRest)
		u.finished.Store(true)
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"msg_1","type":"message","usage":{"input_tokens":10,"output_tokens":5}}`)
	}
}

const (
	sseFirst = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n"
	sseRest  = "event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":5}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
)

func (u *upstream) received() []http.Header {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]http.Header(nil), u.calls...)
}

// env is a broker on loopback: a real nats-server with the grants bucket, a store and a cache,
// the installation CA and its issuer, the proxy serving TLS, and the upstream.
type env struct {
	store     *broker.Store
	cache     *broker.Cache
	up        *upstream
	upRoots   *x509.CertPool
	install   *ca.CA
	proxyAddr string
	reg       *prometheus.Registry
}

func newEnv(t testing.TB, obs proxy.Observer) *env {
	t.Helper()
	_, _, js := natstest.Start(t)
	kv, err := js.CreateKeyValue(t.Context(), broker.BucketOptions{StoreBytes: 1 << 30}.Config())
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, broker.SealingKeyLen)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	sealer, err := broker.NewSealer(key)
	if err != nil {
		t.Fatal(err)
	}
	store, err := broker.NewStore(broker.StoreOptions{KV: kv, Sealer: sealer, GrantsPerCompany: 100})
	if err != nil {
		t.Fatal(err)
	}
	log := zerolog.New(zerolog.NewTestWriter(t))
	cache, err := broker.NewCache(broker.CacheOptions{KV: kv, Sealer: sealer, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	install, err := ca.Generate(ca.Options{Hosts: []string{anthropicHost, openaiHost}})
	if err != nil {
		t.Fatal(err)
	}
	iss, err := ca.NewIssuer(ca.IssuerOptions{CA: install, Hosts: []string{anthropicHost, openaiHost}})
	if err != nil {
		t.Fatal(err)
	}
	up, upRoots := startUpstream(t)
	reg := prometheus.NewRegistry()
	p, err := proxy.New(proxy.Options{
		Routes: []proxy.Route{
			{Host: anthropicHost, Address: up.srv.Listener.Addr().String()},
			{Host: openaiHost, Address: up.srv.Listener.Addr().String(), Errors: proxy.ErrorsOpenAI},
		},
		Resolver: cache, Observer: obs, RootCAs: upRoots, Registerer: reg, Log: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cacheDone, served := make(chan error, 1), make(chan error, 1)
	go func() { cacheDone <- cache.Run(ctx) }()
	go func() { served <- p.Serve(ctx, ln, iss) }()
	t.Cleanup(func() {
		cancel()
		for what, ch := range map[string]chan error{"Cache.Run": cacheDone, "Serve": served} {
			if err := <-ch; err != nil {
				t.Errorf("%s: %v", what, err)
			}
		}
	})
	select {
	case <-cache.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("the grant cache was not ready after 10 s")
	}
	return &env{store: store, cache: cache, up: up, upRoots: upRoots, install: install, proxyAddr: ln.Addr().String(), reg: reg}
}

// client is a pod's client: it trusts only the installation CA, and whatever host it calls
// it dials the broker (as the pod's /etc/hosts makes it), from local (a loopback address).
func (e *env) client(t testing.TB, local string, h2 bool) *http.Client {
	t.Helper()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
			return d.DialContext(ctx, network, e.proxyAddr)
		},
		TLSClientConfig:   &tls.Config{RootCAs: e.install.Pool()},
		ForceAttemptHTTP2: h2,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

func (e *env) mint(t testing.TB, lease, keyName, value string, b broker.Binding, peer string) broker.Placeholder {
	t.Helper()
	var addr netip.Addr
	if peer != "" {
		addr = netip.MustParseAddr(peer)
	}
	p, _, err := e.store.Mint(t.Context(), broker.MintRequest{
		Company: "company-a", Run: "run-" + lease, Lease: lease, Key: keyName, Binding: b, Peer: addr, Value: value,
	})
	if err != nil {
		t.Fatalf("Mint: %v", err)
	}
	// The proxy resolves through the cache, which learns the grant from its KV watcher a moment
	// after the mint: a call made before then is refused as unknown.
	var refused *broker.RefusedError
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		_, err := e.cache.Resolve(p.Reveal(), b.Hosts[0], b.Headers[0], addr)
		if !errors.As(err, &refused) || refused.Reason != broker.ReasonUnknown && refused.Reason != broker.ReasonReleased {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cache did not hold the grant of lease %s 10 s after its mint", lease)
		}
	}
}

// refusals is kubeclip_broker_refusals_total{reason}.
func (e *env) refusals(t testing.TB, reason broker.Reason) float64 {
	t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "kubeclip_broker_refusals_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == string(reason) {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no kubeclip_broker_refusals_total{reason=%q}", reason)
	return 0
}

type response struct {
	status int
	header http.Header
	body   string
}

// call sends a request to host through the broker and reads the whole answer.
func call(t testing.TB, c *http.Client, host, path string, header http.Header) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "https://"+host+path, strings.NewReader(`{"model":"claude","max_tokens":5}`))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v[0]
			continue
		}
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("calling %s through the broker: %v", host, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: string(body)}
}

// TestProxySwapsOnlyForTheBoundHost calls through the broker over real TLS as a pod does: the
// upstream sees the real value exactly when the placeholder is sent to its bound host, in an
// allowed header, from its pod, before its release; every other call is refused in the API's
// error shape, counted by reason, and never reaches the upstream. The client never sees a real
// value.
func TestProxySwapsOnlyForTheBoundHost(t *testing.T) {
	e := newEnv(t, nil)
	pA := e.mint(t, "lease-1", "ANTHROPIC_API_KEY", realAnthropic, anthropicBinding, "127.0.0.1")
	pOpenAI := e.mint(t, "lease-1", "OPENAI_API_KEY", realOpenAI, openaiBinding, "127.0.0.1")
	pPod2 := e.mint(t, "lease-2", "ANTHROPIC_API_KEY", realAnthropic, anthropicBinding, "127.0.0.2")
	pGone := e.mint(t, "lease-3", "ANTHROPIC_API_KEY", realAnthropic, anthropicBinding, "127.0.0.1")
	pLease4 := e.mint(t, "lease-4", "ANTHROPIC_API_KEY", realAnthropic, anthropicBinding, "127.0.0.1")
	if _, err := e.store.Release(t.Context(), "company-a", "lease-3"); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name       string
		from       string
		h2         bool
		host       string
		header     http.Header
		wantStatus int
		// forwarded: the upstream must see wantHeader = wantValue
		wantHeader, wantValue string
		// refused: the error body's type and the reason counted
		wantType   string
		wantReason broker.Reason
	}{
		{
			name: "x-api-key at its bound host", from: "127.0.0.1", host: anthropicHost,
			header:     http.Header{"X-Api-Key": {pA.Reveal()}, "Connection": {"X-Hop"}, "X-Hop": {"1"}, "Keep-Alive": {"timeout=5"}, "Proxy-Authorization": {"Basic cG9kOnBvZA=="}, "X-Forwarded-For": {"6.6.6.6"}, "Accept-Encoding": {"gzip, br"}},
			wantStatus: 200, wantHeader: "X-Api-Key", wantValue: realAnthropic,
		},
		{
			name: "Authorization Bearer over HTTP/2", from: "127.0.0.1", h2: true, host: anthropicHost,
			header:     http.Header{"Authorization": {"Bearer " + pA.Reveal()}},
			wantStatus: 200, wantHeader: "Authorization", wantValue: "Bearer " + realAnthropic,
		},
		{
			name: "OpenAI key at its host", from: "127.0.0.1", host: openaiHost,
			header:     http.Header{"Authorization": {"Bearer " + pOpenAI.Reveal()}},
			wantStatus: 200, wantHeader: "Authorization", wantValue: "Bearer " + realOpenAI,
		},
		{
			name: "a grant bound to 127.0.0.2, called from it", from: "127.0.0.2", host: anthropicHost,
			header:     http.Header{"X-Api-Key": {pPod2.Reveal()}},
			wantStatus: 200, wantHeader: "X-Api-Key", wantValue: realAnthropic,
		},
		{
			name: "the Anthropic placeholder sent to another bound host", from: "127.0.0.1", host: openaiHost,
			header:     http.Header{"Authorization": {"Bearer " + pA.Reveal()}},
			wantStatus: 403, wantType: "invalid_request_error", wantReason: broker.ReasonWrongHost,
		},
		{
			name: "a grant bound to 127.0.0.2, called from 127.0.0.1", from: "127.0.0.1", host: anthropicHost,
			header:     http.Header{"X-Api-Key": {pPod2.Reveal()}},
			wantStatus: 403, wantType: "permission_error", wantReason: broker.ReasonWrongPeer,
		},
		{
			name: "after its lease's release", from: "127.0.0.1", host: anthropicHost,
			header:     http.Header{"X-Api-Key": {pGone.Reveal()}},
			wantStatus: 401, wantType: "authentication_error", wantReason: broker.ReasonReleased,
		},
		{
			name: "a header its binding does not allow", from: "127.0.0.1", host: openaiHost,
			header:     http.Header{"Api-Key": {pOpenAI.Reveal()}},
			wantStatus: 403, wantType: "invalid_request_error", wantReason: broker.ReasonWrongHeader,
		},
		{
			name: "no placeholder, a key of the agent's own", from: "127.0.0.1", host: anthropicHost,
			header:     http.Header{"X-Api-Key": {"sk-ant-agents-own-key"}},
			wantStatus: 401, wantType: "authentication_error", wantReason: broker.ReasonMissing,
		},
		{
			name: "a placeholder that is not one", from: "127.0.0.1", host: anthropicHost,
			header:     http.Header{"X-Api-Key": {"kcph_forged"}},
			wantStatus: 401, wantType: "authentication_error", wantReason: broker.ReasonMalformed,
		},
		{
			name: "an unknown placeholder", from: "127.0.0.1", host: anthropicHost,
			header:     http.Header{"X-Api-Key": {pA.Reveal()[:30] + strings.Repeat("A", broker.PlaceholderLen-30)}},
			wantStatus: 401, wantType: "authentication_error", wantReason: broker.ReasonUnknown,
		},
		{
			name: "placeholders of two leases", from: "127.0.0.1", host: anthropicHost,
			header:     http.Header{"X-Api-Key": {pA.Reveal()}, "Authorization": {"Bearer " + pLease4.Reveal()}},
			wantStatus: 403, wantType: "permission_error", wantReason: broker.ReasonMixed,
		},
		{
			name: "a Host other than the connection's server name", from: "127.0.0.1", host: anthropicHost,
			header:     http.Header{"X-Api-Key": {pA.Reveal()}, "Host": {openaiHost}},
			wantStatus: 421, wantType: "invalid_request_error", wantReason: broker.ReasonMisdirected,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(e.up.received())
			var counted float64
			if tc.wantReason != "" {
				counted = e.refusals(t, tc.wantReason)
			}
			resp := call(t, e.client(t, tc.from, tc.h2), tc.host, "/v1/messages", tc.header)
			if resp.status != tc.wantStatus {
				t.Fatalf("status %d (%s), want %d", resp.status, resp.body, tc.wantStatus)
			}
			for _, secret := range []string{realAnthropic, realOpenAI} {
				if strings.Contains(resp.body, secret) || strings.Contains(fmtHeader(resp.header), secret) {
					t.Fatal("the client received a real value")
				}
			}
			got := e.up.received()[before:]
			if tc.wantReason != "" {
				if len(got) != 0 {
					t.Fatalf("a refused call reached the upstream: %v", got)
				}
				checkRefusal(t, resp, tc.host, tc.wantType, tc.wantReason)
				if n := e.refusals(t, tc.wantReason); n != counted+1 {
					t.Errorf("kubeclip_broker_refusals_total{reason=%q} went from %v to %v, want one more", tc.wantReason, counted, n)
				}
				return
			}
			if len(got) != 1 {
				t.Fatalf("the upstream got %d calls, want 1", len(got))
			}
			seen := got[0]
			if v := seen.Get(tc.wantHeader); v != tc.wantValue {
				t.Errorf("the upstream's %s is not the real value (%d bytes, placeholder %v)", tc.wantHeader, len(v), broker.LooksLikePlaceholder(strings.TrimPrefix(v, "Bearer ")))
			}
			if h := seen.Get("X-Test-Host"); h != tc.host {
				t.Errorf("the upstream's Host %q, want %q", h, tc.host)
			}
			if ae := seen.Get("Accept-Encoding"); ae != "identity" {
				t.Errorf("the upstream's Accept-Encoding %q, want identity", ae)
			}
			for _, h := range []string{"X-Hop", "Keep-Alive", "Proxy-Authorization", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", "Forwarded"} {
				if v, ok := seen[h]; ok {
					t.Errorf("the upstream got %s: %v; want it stripped", h, v)
				}
			}
		})
	}
}

func fmtHeader(h http.Header) string {
	var b strings.Builder
	_ = h.Write(&b)
	return b.String()
}

// checkRefusal checks a refusal's body: the API's error shape (Anthropic's, OpenAI's for its
// host) whose message is the reason's, naming no value.
func checkRefusal(t *testing.T, resp response, host, wantType string, reason broker.Reason) {
	t.Helper()
	if ct := resp.header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var msg, typ string
	if host == openaiHost {
		var b struct {
			Error struct{ Message, Type, Code string } `json:"error"`
		}
		if err := json.Unmarshal([]byte(resp.body), &b); err != nil {
			t.Fatalf("an OpenAI error body: %v: %s", err, resp.body)
		}
		msg, typ = b.Error.Message, b.Error.Type
		if b.Error.Code != "kubeclip_"+string(reason) {
			t.Errorf("code %q, want kubeclip_%s", b.Error.Code, reason)
		}
	} else {
		var b struct {
			Type  string `json:"type"`
			Error struct{ Type, Message string }
		}
		if err := json.Unmarshal([]byte(resp.body), &b); err != nil || b.Type != "error" {
			t.Fatalf("an Anthropic error body: %v: %s", err, resp.body)
		}
		msg, typ = b.Error.Message, b.Error.Type
	}
	if typ != wantType || msg != reason.Message() {
		t.Errorf("error type %q message %q, want %q %q", typ, msg, wantType, reason.Message())
	}
}

// TestProxyRefusesUnboundHostsAtTheHandshake: a pod that points another name at the broker
// gets no certificate, so it never sends a request there.
func TestProxyRefusesUnboundHostsAtTheHandshake(t *testing.T) {
	e := newEnv(t, nil)
	for _, name := range []string{"attacker.example", "generativelanguage.googleapis.com"} {
		conn, err := tls.Dial("tcp", e.proxyAddr, &tls.Config{ServerName: name, RootCAs: e.install.Pool()})
		if err == nil {
			_ = conn.Close()
			t.Errorf("the handshake for %s succeeded", name)
		}
	}
}

// recorder is an Observer that records what it is shown, and rejects calls when reject is set.
type recorder struct {
	reject *proxy.Rejection

	mu     sync.Mutex
	calls  []proxy.Call
	status int
	body   bytes.Buffer
	ended  []error
}

func (r *recorder) Begin(_ context.Context, c proxy.Call) (proxy.Exchange, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls = append(r.calls, c)
	if r.reject != nil {
		return nil, r.reject
	}
	return r, nil
}

func (r *recorder) Response(status int, _ http.Header) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.status = status
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.body.Write(p)
}

func (r *recorder) End(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended = append(r.ended, err)
}

func (r *recorder) snapshot() (calls []proxy.Call, status int, body string, ended []error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]proxy.Call(nil), r.calls...), r.status, r.body.String(), append([]error(nil), r.ended...)
}

// TestProxyStreamsServerSentEvents: the first event of a stream reaches the client while the
// upstream is still holding the rest back (it waits for the client to have it, so a proxy that
// buffered would deliver nothing until the upstream gave up 10 s later); the observer sees the
// whole body, as the client got it, and the call's end.
func TestProxyStreamsServerSentEvents(t *testing.T) {
	obs := &recorder{}
	e := newEnv(t, obs)
	p := e.mint(t, "lease-1", "ANTHROPIC_API_KEY", realAnthropic, anthropicBinding, "127.0.0.1")
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, "https://"+anthropicHost+"/v1/stream", strings.NewReader(`{"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Api-Key", p.Reveal())
	start := time.Now()
	resp, err := e.client(t, "127.0.0.1", false).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	br := bufio.NewReader(resp.Body)
	var first strings.Builder
	for !strings.HasSuffix(first.String(), "\n\n") {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("reading the first event: %v (got %q)", err, first.String())
		}
		first.WriteString(line)
	}
	firstAt := time.Since(start)
	if e.up.finished.Load() {
		t.Fatalf("the first event arrived after the upstream finished (%s): the response was buffered", firstAt)
	}
	if first.String() != sseFirst {
		t.Fatalf("first event %q, want %q", first.String(), sseFirst)
	}
	close(e.up.release)
	rest, err := io.ReadAll(br)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("first event after %s, while the upstream still held the rest", firstAt)
	if string(rest) != sseRest {
		t.Fatalf("rest %q, want %q", rest, sseRest)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		calls, status, body, ended := obs.snapshot()
		if len(ended) > 0 {
			if len(calls) != 1 || calls[0].Grant.Company != "company-a" || calls[0].Grant.Key != "ANTHROPIC_API_KEY" || calls[0].Host != anthropicHost {
				t.Errorf("observer's calls %+v, want company-a's ANTHROPIC_API_KEY call to %s", calls, anthropicHost)
			}
			if got := calls[0].Request.Header.Get("X-Api-Key"); got != p.Reveal() {
				t.Error("the observer was shown something else than the pod's request (its placeholder)")
			}
			if status != 200 || body != sseFirst+sseRest || len(ended) != 1 || ended[0] != nil {
				t.Errorf("observer saw status %d, body %q, ends %v; want 200, the whole stream, one nil end", status, body, ended)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the observer's End was not called")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestObserverRejects: a budget's rejection answers the agent in the API's shape with its
// status and message, and the call never reaches the upstream.
func TestObserverRejects(t *testing.T) {
	msg := "kubeclip broker: company-a spent its 1000000 tokens for today"
	e := newEnv(t, &recorder{reject: &proxy.Rejection{Status: http.StatusTooManyRequests, Message: msg}})
	p := e.mint(t, "lease-1", "ANTHROPIC_API_KEY", realAnthropic, anthropicBinding, "127.0.0.1")
	resp := call(t, e.client(t, "127.0.0.1", false), anthropicHost, "/v1/messages", http.Header{"X-Api-Key": {p.Reveal()}})
	want := `{"type":"error","error":{"type":"rate_limit_error","message":"` + msg + `"}}`
	if resp.status != http.StatusTooManyRequests || resp.body != want {
		t.Errorf("got %d %s, want 429 %s", resp.status, resp.body, want)
	}
	if n := len(e.up.received()); n != 0 {
		t.Errorf("the upstream got %d calls, want none", n)
	}
}

// TestUpstreamDown: a bound host that cannot be reached answers 502 in the API's shape at
// once, and the observer is told.
func TestUpstreamDown(t *testing.T) {
	obs := &recorder{}
	e := newEnv(t, obs)
	p := e.mint(t, "lease-1", "ANTHROPIC_API_KEY", realAnthropic, anthropicBinding, "127.0.0.1")
	e.up.srv.Close()
	resp := call(t, e.client(t, "127.0.0.1", false), anthropicHost, "/v1/messages", http.Header{"X-Api-Key": {p.Reveal()}})
	if resp.status != http.StatusBadGateway || !strings.Contains(resp.body, `"api_error"`) || !strings.Contains(resp.body, anthropicHost+" could not be reached") {
		t.Errorf("got %d %s, want a 502 api_error naming the host", resp.status, resp.body)
	}
	if _, _, _, ended := obs.snapshot(); len(ended) != 1 || ended[0] == nil {
		t.Errorf("observer ends %v, want one error", ended)
	}
}

// BenchmarkCall times one small model call (POST, JSON answer, keep-alive HTTP/1.1 over TLS)
// straight to the upstream and through the broker, in the same run: the difference is what
// the broker adds (resolve, swap, a second TLS hop on loopback).
func BenchmarkCall(b *testing.B) {
	e := newEnv(b, nil)
	p := e.mint(b, "lease-1", "ANTHROPIC_API_KEY", realAnthropic, anthropicBinding, "127.0.0.1")
	direct := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, e.up.srv.Listener.Addr().String())
		},
		TLSClientConfig: &tls.Config{RootCAs: e.upRoots},
	}
	b.Cleanup(direct.CloseIdleConnections)
	for _, bc := range []struct {
		name   string
		client *http.Client
		key    string
	}{
		{"direct", &http.Client{Transport: direct}, realAnthropic},
		{"broker", e.client(b, "127.0.0.1", false), p.Reveal()},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				resp := call(b, bc.client, anthropicHost, "/v1/messages", http.Header{"X-Api-Key": {bc.key}})
				if resp.status != http.StatusOK {
					b.Fatalf("status %d: %s", resp.status, resp.body)
				}
			}
		})
	}
}
