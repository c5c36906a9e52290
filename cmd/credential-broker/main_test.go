package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/ca"
	"github.com/kubeclip/kubeclip/pkg/broker/mintclient"
	"github.com/kubeclip/kubeclip/pkg/broker/mintproto"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// TestMain is also the broker's main when the test binary is started as a broker replica
// (startBrokerProcess), so a test can SIGKILL a replica as a node or an OOM kill would.
func TestMain(m *testing.M) {
	if os.Getenv(brokerProcessEnv) == "1" {
		os.Exit(app.Main(component, run))
	}
	goleak.VerifyTestMain(m)
}

// realValue is the brokered key's real value: the upstream must see it, and nothing else.
const realValue = "sk-ant-api03-REALVALUE-0123456789abcdefghijklmnopqrstuvwxyz"

// files writes what the broker reads: a CA for hosts, a sealing key, and bindings (when not
// empty). It returns their paths.
type files struct{ caCert, caKey, sealingKey, bindings string }

func writeFiles(t *testing.T, hosts []string, bindingsJSON string) files {
	t.Helper()
	dir := t.TempDir()
	authority, err := ca.Generate(ca.Options{Hosts: hosts})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := authority.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	sealing := make([]byte, broker.SealingKeyLen)
	if _, err := rand.Read(sealing); err != nil {
		t.Fatal(err)
	}
	f := files{
		caCert: filepath.Join(dir, "ca.crt"), caKey: filepath.Join(dir, "ca.key"),
		sealingKey: filepath.Join(dir, "sealing.key"),
	}
	write := func(path string, data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(f.caCert, authority.CertPEM())
	write(f.caKey, keyPEM)
	write(f.sealingKey, sealing)
	if bindingsJSON != "" {
		f.bindings = filepath.Join(dir, "bindings.json")
		write(f.bindings, []byte(bindingsJSON))
	}
	return f
}

func (f files) args() []string {
	a := []string{"--ca-cert", f.caCert, "--ca-key", f.caKey, "--sealing-key", f.sealingKey}
	if f.bindings != "" {
		a = append(a, "--bindings", f.bindings)
	}
	return a
}

// TestSettings pins the refusals that happen before anything connects: each names the flag and
// its environment variable (and the field of the bindings file), and exits 2.
func TestSettings(t *testing.T) {
	all := []string{"api.anthropic.com", "api.openai.com", "generativelanguage.googleapis.com"}
	good := writeFiles(t, all, "")
	anthropicOnly := writeFiles(t, []string{"api.anthropic.com"}, "")
	bad := func(bindings string) files { f := good; f.bindings = writeFiles(t, all, bindings).bindings; return f }
	short := good
	short.sealingKey = filepath.Join(t.TempDir(), "short")
	if err := os.WriteFile(short.sealingKey, []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		args     []string
		wantCode int
		wantErr  string
	}{
		{name: "help", args: []string{"--help"}, wantCode: 0},
		{name: "nothing", wantCode: 2, wantErr: "--ca-cert (KUBECLIP_BROKER_CA_CERT) is required"},
		{name: "no sealing key", args: []string{"--ca-cert", good.caCert, "--ca-key", good.caKey}, wantCode: 2, wantErr: "--sealing-key (KUBECLIP_BROKER_SEALING_KEY) is required"},
		{name: "sealing key too short", args: short.args(), wantCode: 2, wantErr: "must be 32 bytes, got 10"},
		{name: "CA short of a default host", args: anthropicOnly.args(), wantCode: 2, wantErr: "--ca-cert (KUBECLIP_BROKER_CA_CERT): the installation CA's name constraints [api.anthropic.com] do not cover api.openai.com"},
		{name: "unknown field", args: bad(`{"ANTHROPIC_API_KEY": {"hosts": ["api.anthropic.com"], "headers": ["x-api-key"], "errors": "anthropic", "upstream": {}}}`).args(), wantCode: 2, wantErr: `unknown field "upstream"`},
		{name: "field spelled in another case", args: bad(`{"ANTHROPIC_API_KEY": {"Hosts": ["api.anthropic.com"], "headers": ["x-api-key"], "errors": "anthropic"}}`).args(), wantCode: 2, wantErr: "ANTHROPIC_API_KEY.Hosts"},
		{name: "unknown header", args: bad(`{"ANTHROPIC_API_KEY": {"hosts": ["api.anthropic.com"], "headers": ["cookie"], "errors": "anthropic"}}`).args(), wantCode: 2, wantErr: `--bindings (KUBECLIP_BROKER_BINDINGS): ` + "" + `ANTHROPIC_API_KEY.headers: "cookie" is not one of`},
		{name: "unknown error shape", args: bad(`{"ANTHROPIC_API_KEY": {"hosts": ["api.anthropic.com"], "headers": ["x-api-key"], "errors": "xml"}}`).args(), wantCode: 2, wantErr: `ANTHROPIC_API_KEY.errors: "xml" is not one of`},
		{name: "no hosts", args: bad(`{"ANTHROPIC_API_KEY": {"hosts": [], "headers": ["x-api-key"], "errors": "anthropic"}}`).args(), wantCode: 2, wantErr: "ANTHROPIC_API_KEY.hosts: must name 1 to 8 hosts"},
		{name: "upstream of another host", args: bad(`{"ANTHROPIC_API_KEY": {"hosts": ["api.anthropic.com"], "headers": ["x-api-key"], "errors": "anthropic", "upstreams": {"api.openai.com": "127.0.0.1:1"}}}`).args(), wantCode: 2, wantErr: `ANTHROPIC_API_KEY.upstreams: "api.openai.com" is not one of the key's hosts`},
		{name: "a host's shapes disagree", args: bad(`{"A_KEY": {"hosts": ["api.openai.com"], "headers": ["authorization"], "errors": "openai"}, "B_KEY": {"hosts": ["api.openai.com"], "headers": ["authorization"], "errors": "anthropic"}}`).args(), wantCode: 2, wantErr: "B_KEY.hosts[0]: api.openai.com is bound by A_KEY too"},
		{name: "key not an env name", args: bad(`{"1KEY": {"hosts": ["api.openai.com"], "headers": ["authorization"], "errors": "openai"}}`).args(), wantCode: 2, wantErr: `"1KEY": "1KEY" must be an environment variable name`},
		{name: "no keys", args: bad(`{}`).args(), wantCode: 2, wantErr: "no brokered key"},
		{name: "negative request rate", args: append(good.args(), "--company-requests-per-second", "-1"), wantCode: 2, wantErr: "--company-requests-per-second (KUBECLIP_BROKER_COMPANY_REQUESTS_PER_SECOND) must be a number ≥ 0"},
		{name: "burst without a rate", args: append(good.args(), "--company-request-burst", "5"), wantCode: 2, wantErr: "--company-request-burst (KUBECLIP_BROKER_COMPANY_REQUEST_BURST) needs --company-requests-per-second (KUBECLIP_BROKER_COMPANY_REQUESTS_PER_SECOND)"},
		{name: "negative token budget", args: append(good.args(), "--company-tokens-per-day", "-5"), wantCode: 2, wantErr: "--company-tokens-per-day (KUBECLIP_BROKER_COMPANY_TOKENS_PER_DAY) must be ≥ 0"},
		{name: "quota past the store", args: append(good.args(), "--grants-per-company", "100000"), wantCode: 2, wantErr: "--grants-per-company (KUBECLIP_BROKER_GRANTS_PER_COMPANY) is 100000 grants per company"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), tc.args, func(string) (string, bool) { return "", false }, &stdout, &stderr)
			if got := app.ExitCode(err); got != tc.wantCode {
				t.Fatalf("exit %d (%v), want %d", got, err, tc.wantCode)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("error %v, want it to say %q", err, tc.wantErr)
			}
			if tc.wantCode == 0 && !strings.Contains(stdout.String(), "--bindings") {
				t.Errorf("--help does not list --bindings:\n%s", stdout.String())
			}
		})
	}
}

// lockedBuffer is the broker's stderr: the test reads it while the broker writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// anthropicUpstream stands in for api.anthropic.com: TLS on loopback with a certificate for
// that name from a CA of its own (the broker trusts it through --upstream-ca), answering
// /v1/messages with a Messages response whose usage the meter must read: streamed when the
// request asks for it, else a JSON body.
type anthropicUpstream struct {
	srv  *httptest.Server
	mu   sync.Mutex
	keys []string // the x-api-key of every request
	// stated is the usage the upstream stated in the responses it finished, summed.
	stated tally
}

// tally is usage summed: calls and the four token counts.
type tally struct{ Calls, InputTokens, OutputTokens, CacheReadTokens, CacheWriteTokens int64 }

// The usage each response states: upstreamStream's, and upstreamBody's (input 31, output 9,
// cache reads 6, cache writes 4).
var (
	streamUsage = tally{Calls: 1, InputTokens: 25, OutputTokens: 17, CacheReadTokens: 3}
	bodyUsage   = tally{Calls: 1, InputTokens: 31, OutputTokens: 9, CacheReadTokens: 6, CacheWriteTokens: 4}
)

const upstreamBody = `{"id":"msg_2","type":"message","role":"assistant","model":"claude-test","content":[{"type":"text","text":"hi"}],` +
	`"stop_reason":"end_turn","usage":{"input_tokens":31,"cache_creation_input_tokens":4,"cache_read_input_tokens":6,"output_tokens":9}}`

func addUsage(sum *tally, u tally) {
	sum.Calls += u.Calls
	sum.InputTokens += u.InputTokens
	sum.OutputTokens += u.OutputTokens
	sum.CacheReadTokens += u.CacheReadTokens
	sum.CacheWriteTokens += u.CacheWriteTokens
}

// The upstream's usage: message_start states input 25 (and cache reads 3), message_delta the
// cumulative output 17.
const upstreamStream = "event: message_start\n" +
	`data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-test","content":[],"usage":{"input_tokens":25,"cache_read_input_tokens":3,"cache_creation_input_tokens":0,"output_tokens":1}}}` + "\n\n" +
	"event: content_block_delta\n" +
	`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hello"}}` + "\n\n" +
	"event: message_delta\n" +
	`data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":17}}` + "\n\n" +
	"event: message_stop\n" +
	`data: {"type":"message_stop"}` + "\n\n"

func startAnthropicUpstream(t *testing.T, dir string) (*anthropicUpstream, string) {
	t.Helper()
	u := &anthropicUpstream{}
	var caFile string
	u.srv, caFile = serveAsAnthropic(t, dir, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.keys = append(u.keys, r.Header.Get("X-Api-Key"))
		u.mu.Unlock()
		req, _ := io.ReadAll(r.Body)
		stated := bodyUsage
		if bytes.Contains(req, []byte(`"stream":true`)) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			for _, ev := range strings.SplitAfter(upstreamStream, "\n\n") {
				_, _ = io.WriteString(w, ev)
				w.(http.Flusher).Flush()
			}
			stated = streamUsage
		} else {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, upstreamBody)
		}
		u.mu.Lock()
		addUsage(&u.stated, stated)
		u.mu.Unlock()
	}))
	return u, caFile
}

// serveAsAnthropic serves h over TLS on loopback with a certificate for api.anthropic.com from
// a CA of its own, written to dir (the file the broker's --upstream-ca takes). The server is
// closed when the test ends.
func serveAsAnthropic(t *testing.T, dir string, h http.Handler) (*httptest.Server, string) {
	t.Helper()
	authority, err := ca.Generate(ca.Options{Hosts: []string{"api.anthropic.com"}})
	if err != nil {
		t.Fatal(err)
	}
	issuer, err := ca.NewIssuer(ca.IssuerOptions{CA: authority, Hosts: []string{"api.anthropic.com"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{GetCertificate: issuer.GetCertificate, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	caFile := filepath.Join(dir, "upstream-ca.crt")
	if err := os.WriteFile(caFile, authority.CertPEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	return srv, caFile
}

func (u *anthropicUpstream) statedUsage() tally {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.stated
}

func (u *anthropicUpstream) seen() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.keys...)
}

// connectAs connects as one of the shipped users, on its inbox prefix.
func connectAs(t *testing.T, url, user, prefix string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url, natstest.User(user), nats.CustomInboxPrefix(prefix))
	if err != nil {
		t.Fatalf("connecting as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// TestEndToEnd runs the broker as its binary does (run, flags, a real nats-server with the
// shipped users and permissions, the broker on its own user, TLS over loopback): a placeholder
// minted over NATS by the plugin's user (twice: one grant), a streamed Messages call through the
// broker that reaches the upstream with the real value and is metered, then the lease's released
// event on the run stream, after which the placeholder is refused within a second. The broker's
// log never holds the value or the placeholder.
func TestEndToEnd(t *testing.T) {
	start := time.Now()
	srv := natstest.StartWithAuth(t, "../../"+natstest.ShippedAuthConf)
	ctx := t.Context()
	// The other workers create the streams; the broker's user may not.
	_, js := connectAs(t, srv.ClientURL(), "kubeclip", inbox.WorkersPrefix)
	if err := events.EnsureStreams(ctx, js, events.Options{StoreBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	up, upstreamCA := startAnthropicUpstream(t, dir)
	f := writeFiles(t, []string{"api.anthropic.com"}, fmt.Sprintf(
		`{"ANTHROPIC_API_KEY": {"hosts": ["api.anthropic.com"], "headers": ["x-api-key", "authorization"], "errors": "anthropic", "upstreams": {"api.anthropic.com": %q}}}`,
		up.srv.Listener.Addr().String()))
	ports := natstest.FreePorts(t, 2)
	listen, opsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])), net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	args := append(f.args(), "--nats-url", srv.ClientURL(), "--nats-user", "broker", "--listen", listen, "--ops-addr", opsAddr,
		"--upstream-ca", upstreamCA, "--store-bytes", strconv.Itoa(1<<30), "--log-level", "debug", "--usage-flush", usageFlush.String())
	var stderr lockedBuffer
	startBroker(t, args, opsAddr, &stderr)
	opsClient := &http.Client{Timeout: 2 * time.Second}
	defer opsClient.CloseIdleConnections()
	ready := time.Since(start)

	// Mint, as the plugin does: the broker's key, then the value sealed to it, core NATS
	// requests from the plugin's inbox prefix.
	client, _ := connectAs(t, srv.ClientURL(), "paperclip", inbox.PaperclipPrefix)
	minter, err := mintclient.New(mintclient.Options{NATS: client, InboxPrefix: inbox.PaperclipPrefix})
	if err != nil {
		t.Fatal(err)
	}
	mintOnce := func() mintproto.MintReply {
		t.Helper()
		key, err := minter.Key(ctx)
		if err != nil {
			t.Fatalf("the broker's key: %v", err)
		}
		reply, err := minter.Mint(ctx, key, mintclient.Lease{CompanyID: "company-a", RunID: "run-1", LeaseID: "lease-1"}, "ANTHROPIC_API_KEY", realValue)
		if err != nil {
			t.Fatalf("mint: %v", err)
		}
		return reply
	}
	mintStart := time.Now()
	first := mintOnce()
	mintTook := time.Since(mintStart)
	again := mintOnce()
	if again.Placeholder != first.Placeholder || again.GrantID != first.GrantID {
		t.Errorf("a repeated mint answered grant %s, the first %s (or another placeholder)", again.GrantID, first.GrantID)
	}
	_, brokerJS := connectAs(t, srv.ClientURL(), "broker", inbox.BrokerPrefix) // only its user reads the grants
	kv, err := brokerJS.KeyValue(ctx, broker.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	keys, err := kv.Keys(ctx)
	if err != nil || len(keys) != 1 {
		t.Fatalf("the grants bucket holds %v (%v), want the one grant", keys, err)
	}
	// The run-watcher names the run's pod, here the loopback address the agent calls from.
	bindPod(t, js, "company-a", "run-1", "127.0.0.1")

	// The call, as the claude CLI makes it: api.anthropic.com by its name (the pod's hosts file
	// points it at the broker), trusting the installation CA.
	caPEM, err := os.ReadFile(f.caCert)
	if err != nil {
		t.Fatal(err)
	}
	authority, err := ca.Parse(caPEM, mustRead(t, f.caKey))
	if err != nil {
		t.Fatal(err)
	}
	agent := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: authority.Pool(), MinVersion: tls.VersionTLS12},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, listen) // hostAliases: api.anthropic.com → the broker
		},
	}}
	defer agent.CloseIdleConnections()
	// The run's usage events, as `kubeclip runs follow` reads them (the CLI's user).
	_, cliJS := connectAs(t, srv.ClientURL(), "cli", inbox.CLIPrefix)
	usage := followUsage(t, cliJS, "company-a", "run-1")
	callAs := func(stream bool) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://api.anthropic.com/v1/messages", strings.NewReader(fmt.Sprintf(`{"model":"claude-test","stream":%t,"max_tokens":64,"messages":[]}`, stream)))
		req.Header.Set("X-Api-Key", first.Placeholder)
		req.Header.Set("Content-Type", "application/json")
		resp, err := agent.Do(req)
		if err != nil {
			t.Fatalf("calling through the broker: %v", err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("reading the response: %v", err)
		}
		return resp.StatusCode, string(body)
	}
	call := func() (int, string) { t.Helper(); return callAs(true) }
	callStart := time.Now()
	status, body := call()
	callTook := time.Since(callStart)
	if status != http.StatusOK || body != upstreamStream {
		t.Fatalf("through the broker: %d %q, want 200 and the upstream's stream as it sent it", status, body)
	}
	if seen := up.seen(); len(seen) != 1 || seen[0] != realValue {
		t.Fatalf("the upstream saw x-api-key %d times, the real value: %v", len(seen), len(seen) == 1 && seen[0] == realValue)
	}

	// Usage, from the upstream's stream: input 25, cache reads 3, output 17 (the last
	// cumulative count), in metrics without any company or run label.
	var metrics map[string]float64
	eventually(t, "the call's usage in /metrics", 5*time.Second, func() bool {
		metrics = scrape(t, opsClient, opsAddr)
		return metrics[`kubeclip_broker_calls_total{format="anthropic_messages",outcome="metered"}`] == 1
	})
	for series, want := range map[string]float64{
		`kubeclip_broker_usage_tokens_total{format="anthropic_messages",kind="input"}`:       25,
		`kubeclip_broker_usage_tokens_total{format="anthropic_messages",kind="output"}`:      17,
		`kubeclip_broker_usage_tokens_total{format="anthropic_messages",kind="cache_read"}`:  3,
		`kubeclip_broker_usage_tokens_total{format="anthropic_messages",kind="cache_write"}`: 0,
		`kubeclip_broker_mints_total{result="ok"}`:                                           2,
	} {
		if got := metrics[series]; got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	for series := range metrics {
		if strings.Contains(series, "company-a") || strings.Contains(series, "run-1") {
			t.Errorf("a metric is labelled with a company or run id: %s", series)
		}
	}

	// Usage on the run stream: the streamed call's, then a call answered with a JSON body, each
	// exactly as the upstream stated it.
	if status, body := callAs(false); status != http.StatusOK || body != upstreamBody {
		t.Fatalf("a non-streamed call through the broker: %d %q", status, body)
	}
	usage.waitSum(t, "the two calls' usage events", up.statedUsage)
	if got, want := usage.sum(), (tally{Calls: 2, InputTokens: 25 + 31, OutputTokens: 17 + 9, CacheReadTokens: 3 + 6, CacheWriteTokens: 4}); got != want {
		t.Errorf("the usage events of a streamed and a JSON call add up to %+v, want %+v", got, want)
	}

	// A flood: floodCalls calls from floodWorkers at once make about one event per flush.
	floodStart := time.Now()
	beforeFlood := usage.count()
	var wg sync.WaitGroup
	var floodFailed atomic.Int64
	for w := range floodWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < floodCalls; i += floodWorkers {
				if status, _ := callAs(i%2 == 0); status != http.StatusOK {
					floodFailed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	floodTook := time.Since(floodStart)
	if n := floodFailed.Load(); n > 0 {
		t.Fatalf("%d of the flood's calls failed", n)
	}
	usage.waitSum(t, "the flood's usage events", up.statedUsage)
	settled := time.Since(floodStart)
	floodEvents := usage.count() - beforeFlood
	if limit := int(settled/usageFlush) + 2; floodEvents > limit {
		t.Errorf("%d calls in %s made %d usage events, want at most %d (one per %s flush, settled after %s)", floodCalls, floodTook, floodEvents, limit, usageFlush, settled)
	}

	// The lease ends right after one more call: its usage comes with the release, not a flush
	// later.
	if status, _ := callAs(false); status != http.StatusOK {
		t.Fatalf("the last call: %d", status)
	}
	beforeRelease := usage.count()

	// The lease ends: its released event on the run stream, as the dispatcher publishes it.
	ev, _ := json.Marshal(events.RunReleasedEvent{RunID: "run-1", CompanyID: "company-a", At: time.Now(), ProviderLeaseID: "lease-1", State: events.ReleaseStopped})
	relSubject, err := events.Subjects{}.Run("company-a", "run-1", events.KindReleased)
	if err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	if _, err := js.Publish(ctx, relSubject, ev); err != nil {
		t.Fatal(err)
	}
	var refusedAfter time.Duration
	eventually(t, "the placeholder to be refused after the release", 10*time.Second, func() bool {
		status, body = call()
		refusedAfter = time.Since(released)
		return status == http.StatusUnauthorized
	})
	var refusal struct {
		Type  string `json:"type"`
		Error struct{ Type, Message string }
	}
	if err := json.Unmarshal([]byte(body), &refusal); err != nil || refusal.Type != "error" || refusal.Error.Type != "authentication_error" || !strings.Contains(refusal.Error.Message, "released") {
		t.Errorf("the refusal after release: %s, want Anthropic's error shape saying released", body)
	}
	if refusedAfter > time.Second {
		t.Errorf("the placeholder was refused %s after its release event, want within 1 s", refusedAfter)
	}
	releaseEvent := usage.waitAfter(t, beforeRelease, 5*time.Second)
	releaseFlushed := releaseEvent.published.Sub(released)
	if releaseFlushed > usageFlush/2 {
		t.Errorf("the usage of the call before the release was stored %s after the release, want well within the %s flush", releaseFlushed, usageFlush)
	}
	// The calls that raced the release reached the upstream; none after the refusal does.
	before := len(up.seen())
	if status, _ := call(); status != http.StatusUnauthorized {
		t.Errorf("a call after the refusal: %d, want 401", status)
	}
	if n := len(up.seen()); n != before {
		t.Errorf("the upstream got %d calls after the placeholder was refused", n-before)
	}

	// In all, the run's usage events add up to what the upstream stated, exactly: one meter
	// (one replica), seqs 1, 2, 3, … without gaps, every row the grant's key, host and format.
	usage.waitSum(t, "every call's usage", up.statedUsage)
	total := usage.sum()
	evs := usage.all()
	for i, e := range evs {
		if e.ev.Meter != evs[0].ev.Meter || e.ev.Seq != uint64(i+1) {
			t.Errorf("usage event %d: meter %s seq %d, want meter %s seq %d", i, e.ev.Meter, e.ev.Seq, evs[0].ev.Meter, i+1)
		}
		for _, row := range e.ev.Usage {
			if row.Key != "ANTHROPIC_API_KEY" || row.Host != "api.anthropic.com" || row.Format != events.UsageFormatAnthropicMessages || len(row.Unmetered) != 0 {
				t.Errorf("usage event %d has row %+v, want the grant's key at api.anthropic.com, anthropic_messages, all metered", i, row)
			}
		}
	}
	metrics = scrape(t, opsClient, opsAddr)
	if got := metrics[`kubeclip_broker_usage_events_total{result="stored"}`]; got != float64(len(evs)) {
		t.Errorf("kubeclip_broker_usage_events_total{result=stored} = %v, want the %d events the stream holds", got, len(evs))
	}
	if got := metrics[`kubeclip_broker_usage_events_total{result="failed"}`]; got != 0 {
		t.Errorf("%v usage publishes failed", got)
	}

	logs := stderr.String()
	secretPart := first.Placeholder[len(first.Placeholder)-43:]
	for what, s := range map[string]string{"the real value": realValue, "the placeholder's secret part": secretPart} {
		if strings.Contains(logs, s) {
			t.Errorf("the broker's log holds %s", what)
		}
	}
	// On its shipped user the broker lacks nothing (the self-check would log each missing
	// permission as an error) and nothing failed.
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, `"level":"error"`) {
			t.Errorf("the broker logged an error: %s", line)
		}
	}
	if !regexp.MustCompile(`"run_id":"run-1".*"input_tokens":25.*"output_tokens":17`).MatchString(logs) {
		t.Errorf("no debug line with the call's usage and run id in the broker's log")
	}
	for _, e := range evs {
		for _, s := range []string{realValue, secretPart} {
			if strings.Contains(string(e.raw), s) {
				t.Errorf("usage event %d holds a secret", e.ev.Seq)
			}
		}
	}
	t.Logf("ready_after\tmint\tstreamed_call\trefused_after_release\ttotal")
	t.Logf("%s\t%s\t%s\t%s\t%s", ready.Round(time.Millisecond), mintTook.Round(time.Microsecond), callTook.Round(time.Microsecond), refusedAfter.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	t.Logf("calls\tusage_events\tflood_calls\tflood_took\tflood_events\tflush\trelease_to_usage\tinput\toutput\tcache_read\tcache_write\tupstream_stated")
	t.Logf("%d\t%d\t%d\t%s\t%d\t%s\t%s\t%d\t%d\t%d\t%d\t%d/%d/%d/%d",
		total.Calls, len(evs), floodCalls, floodTook.Round(time.Millisecond), floodEvents, usageFlush, releaseFlushed.Round(time.Millisecond),
		total.InputTokens, total.OutputTokens, total.CacheReadTokens, total.CacheWriteTokens,
		up.statedUsage().InputTokens, up.statedUsage().OutputTokens, up.statedUsage().CacheReadTokens, up.statedUsage().CacheWriteTokens)
}

// The usage part of TestEndToEnd: the broker flushes every usageFlush (longer than the
// default, so a release's flush is told from a tick's), and a flood of floodCalls calls.
const (
	usageFlush   = 2 * time.Second
	floodCalls   = 400
	floodWorkers = 8
)

// usageFollower collects a run's usage events as the CLI follows a run (events.Follow).
type usageFollower struct {
	mu  sync.Mutex
	evs []followedUsage
}

type followedUsage struct {
	ev        events.RunUsageEvent
	raw       []byte
	published time.Time
}

func followUsage(t *testing.T, js jetstream.JetStream, company, run string) *usageFollower {
	t.Helper()
	f := &usageFollower{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- events.Follow(ctx, js, events.Subjects{}, company, run, events.FollowOptions{}, func(r events.Received) error {
			if r.Err != nil {
				return fmt.Errorf("%s does not decode: %w", r.Subject, r.Err)
			}
			if ev, ok := r.Event.(events.RunUsageEvent); ok {
				raw, _ := json.Marshal(ev)
				f.mu.Lock()
				f.evs = append(f.evs, followedUsage{ev: ev, raw: raw, published: r.Published})
				f.mu.Unlock()
			}
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("following the run: %v", err)
		}
	})
	return f
}

func (f *usageFollower) all() []followedUsage {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]followedUsage(nil), f.evs...)
}

func (f *usageFollower) count() int { return len(f.all()) }

// sum adds every row of every event so far.
func (f *usageFollower) sum() tally {
	var s tally
	for _, e := range f.all() {
		for _, row := range e.ev.Usage {
			addUsage(&s, tally{row.Calls, row.InputTokens, row.OutputTokens, row.CacheReadTokens, row.CacheWriteTokens})
		}
	}
	return s
}

// waitSum waits until the events add up to want() (at most 3 flushes): exactly, never more.
func (f *usageFollower) waitSum(t *testing.T, what string, want func() tally) {
	t.Helper()
	deadline := time.Now().Add(3 * usageFlush)
	for {
		got, w := f.sum(), want()
		switch {
		case got == w:
			return
		case got.Calls > w.Calls || got.InputTokens > w.InputTokens || got.OutputTokens > w.OutputTokens:
			t.Fatalf("%s: the usage events add up to %+v, more than the upstream stated, %+v", what, got, w)
		case time.Now().After(deadline):
			t.Fatalf("%s: the usage events add up to %+v after %s, the upstream stated %+v", what, got, 3*usageFlush, w)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitAfter waits for the event after the first n.
func (f *usageFollower) waitAfter(t *testing.T, n int, within time.Duration) followedUsage {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		if evs := f.all(); len(evs) > n {
			return evs[n]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no usage event after the first %d within %s", n, within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// scrape reads /metrics into series → value.
func scrape(t *testing.T, c *http.Client, addr string) map[string]float64 {
	t.Helper()
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scraping: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

// eventually polls cond every 10 ms until it holds or within passes.
func eventually(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
