package paperclip

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// The credential broker end to end (issue 27): the suite runs kubeclip's credential broker
// (pt.Options.Broker) with ANTHROPIC_API_KEY bound to api.anthropic.com, whose address the
// operator's override points at modelUpstream, a TLS server in this process standing in for
// Anthropic's API. Every pod of the suite resolves api.anthropic.com to the broker and trusts
// its installation CA (pt.Options.BrokerPods).

const (
	// anthropicHost is the bound host the stub calls by name.
	anthropicHost = "api.anthropic.com"
	// brokeredKey is the brokered key's name.
	brokeredKey = "ANTHROPIC_API_KEY"
	// anthropicKeyPrefix starts every Anthropic API key: public, so the stub's needle may
	// carry it.
	anthropicKeyPrefix = "sk-ant-api03-"
	// The stub's switches (tests/images/claude-stub): the model call and the secret search.
	stubModelCall    = "KUBECLIP_STUB_MODEL_CALL"
	stubSecretSearch = "KUBECLIP_STUB_SECRET_SEARCH"
	// usageTimeout bounds the wait for the broker's usage event after the run's release: its
	// releaser reads the released event and publishes at once (--usage-flush bounds the rest).
	usageTimeout = 15 * time.Second
)

// credBroker is the suite's credential broker (TestMain).
var credBroker *pt.Broker

// upstream is the suite's stand-in for api.anthropic.com: its address and certificate are fixed
// in TestMain (the broker's bindings and --upstream-ca name them before the broker starts); a
// test serves on it with serveModelUpstream.
var upstream struct {
	addr    string
	cert    tls.Certificate
	certPEM []byte
}

// prepareUpstream reserves a loopback port and makes a self-signed certificate for
// api.anthropic.com: the broker checks the upstream's certificate for the bound host's name
// whatever address the override gives.
func prepareUpstream() error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	upstream.addr = l.Addr().String()
	l.Close()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: anthropicHost}, DNSNames: []string{anthropicHost},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return err
	}
	upstream.certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	upstream.cert = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	return nil
}

// suiteBroker is the suite's broker: ANTHROPIC_API_KEY at api.anthropic.com, reached at the
// upstream's address, listening where the cluster's pods reach this machine.
func suiteBroker() (*pt.Broker, error) {
	if err := prepareUpstream(); err != nil {
		return nil, fmt.Errorf("preparing the model API's stand-in: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	addr, err := pt.PodReachableAddress(ctx, clustertest.Kubeconfig())
	if err != nil {
		return nil, err
	}
	return pt.NewBroker(pt.BrokerOptions{
		Address: addr,
		Bindings: map[string]pt.BrokerBinding{brokeredKey: {
			Hosts: []string{anthropicHost}, Headers: []string{"x-api-key", "authorization"}, Errors: "anthropic",
			Upstreams: map[string]string{anthropicHost: upstream.addr},
		}},
		UpstreamCA: upstream.certPEM,
	})
}

// upstreamCall is what the stand-in saw of one call: never the key itself.
type upstreamCall struct {
	Path string
	// RealKey: x-api-key was the test's key; Placeholder: it was a broker placeholder (the swap
	// did not happen).
	RealKey, Placeholder bool
	// Usage is what the stand-in's response stated.
	Usage events.ModelUsage
	Text  string
	// At is when the call reached the stand-in.
	At time.Time
}

// modelUpstream serves the Anthropic Messages API's streamed shape: each call gets random
// token counts (so only a meter that reads them can match) and a reply text with a nonce.
type modelUpstream struct {
	srv *http.Server
	key []byte

	mu    sync.Mutex
	calls []upstreamCall
}

// serveModelUpstream serves on the suite's upstream address until the test ends, expecting key.
func serveModelUpstream(t *testing.T, key string) *modelUpstream {
	t.Helper()
	u := &modelUpstream{key: []byte(key)}
	ln, err := net.Listen("tcp", upstream.addr)
	if err != nil {
		t.Fatalf("serving the model API's stand-in on %s: %v", upstream.addr, err)
	}
	u.srv = &http.Server{Handler: http.HandlerFunc(u.serve), ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = u.srv.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{upstream.cert}, MinVersion: tls.VersionTLS12}))
	}()
	t.Cleanup(func() {
		_ = u.srv.Close()
		<-done
	})
	return u
}

func (u *modelUpstream) serve(w http.ResponseWriter, r *http.Request) {
	got := []byte(r.Header.Get("x-api-key"))
	call := upstreamCall{
		Path:        r.URL.Path,
		RealKey:     subtle.ConstantTimeCompare(got, u.key) == 1,
		Placeholder: bytes.HasPrefix(got, []byte("kcph_")),
		Usage: events.ModelUsage{
			Key: brokeredKey, Host: anthropicHost, Format: events.UsageFormatAnthropicMessages, Calls: 1,
			InputTokens: 100 + mrand.Int64N(900), OutputTokens: 10 + mrand.Int64N(90),
			CacheReadTokens: mrand.Int64N(500), CacheWriteTokens: mrand.Int64N(50),
		},
		Text: "upstream reply " + rand.Text()[:12],
		At:   time.Now(),
	}
	u.mu.Lock()
	u.calls = append(u.calls, call)
	u.mu.Unlock()
	if r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprint(w, `{"type":"error","error":{"type":"not_found_error","message":"the stand-in serves POST /v1/messages"}}`)
		return
	}
	if !call.RealKey {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key (the model API's stand-in)"}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	us := call.Usage
	half := len(call.Text) / 2
	for _, ev := range []string{
		fmt.Sprintf(`{"type":"message_start","message":{"id":"msg_upstream_01","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"usage":{"input_tokens":%d,"cache_creation_input_tokens":%d,"cache_read_input_tokens":%d,"output_tokens":1}}}`, us.InputTokens, us.CacheWriteTokens, us.CacheReadTokens),
		`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
		fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%q}}`, call.Text[:half]),
		fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%q}}`, call.Text[half:]),
		`{"type":"content_block_stop","index":0}`,
		fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":%d}}`, us.OutputTokens),
		`{"type":"message_stop"}`,
	} {
		var typ struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal([]byte(ev), &typ)
		fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ.Type, ev)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
}

func (u *modelUpstream) seen() []upstreamCall {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]upstreamCall(nil), u.calls...)
}

// newAnthropicKey is a fresh key in Anthropic's shape: the value the search looks for.
func newAnthropicKey() string {
	b := make([]byte, 70)
	_, _ = rand.Read(b)
	return anthropicKeyPrefix + base64.RawURLEncoding.EncodeToString(b)[:93] + "AA"
}

// needleOf is the stub's search needle for value: its SHA-256, length and public prefix.
func needleOf(value string) string {
	sum := sha256.Sum256([]byte(value))
	return fmt.Sprintf("%s:%d:%s", hex.EncodeToString(sum[:]), len(value), anthropicKeyPrefix)
}

// searchTally and searchReport are the stub's system/kubeclip_secret_search line
// (tests/images/claude-stub/search.go).
type searchTally struct {
	Matches      int `json:"matches"`
	Placeholders int `json:"placeholders"`
}

type searchReport struct {
	EnvVars          int         `json:"envVars"`
	Env              searchTally `json:"env"`
	Files            int         `json:"files"`
	FileBytes        int64       `json:"fileBytes"`
	Unreadable       int         `json:"unreadable"`
	OverBudget       bool        `json:"overBudget"`
	FileTally        searchTally `json:"fileTally"`
	MatchPaths       []string    `json:"matchPaths"`
	PlaceholderPaths []string    `json:"placeholderPaths"`
	Processes        int         `json:"processes"`
	ProcsUnreadable  int         `json:"procsUnreadable"`
	Environ          searchTally `json:"environ"`
	Cmdline          searchTally `json:"cmdline"`
	SearchDurationMS int64       `json:"searchDurationMs"`
}

// TestPaperclipBroker is issue 27's first acceptance point: a company whose agent has
// ANTHROPIC_API_KEY in its environment runs an agent through the real Paperclip server on
// kubeclip with the key brokered (the plugin's settings.brokeredKeys). The stub calls
// https://api.anthropic.com/v1/messages with the key its environment holds, trusting
// NODE_EXTRA_CA_CERTS; the call goes through the broker to the stand-in, which must see the
// real key. The stub's environment holds a placeholder instead; its search of its environment,
// every file it can read and every process's environ and cmdline finds the real value nowhere,
// and neither does a search of everything kubeclip's NATS carried meanwhile. The broker's usage
// events for the run add up to exactly what the stand-in stated.
func TestPaperclipBroker(t *testing.T) {
	began := time.Now()
	cs := clustertest.Clientset(t)
	key := newAnthropicKey()
	up := serveModelUpstream(t, key)
	pc := startServer(t)
	pt.CleanupTenant(t, cs, pc.CompanyID)
	pc.configurePlugin(t, map[string]any{"natsUrl": env.NATS.URL(), "brokeredKeys": []string{brokeredKey}})
	brokered := pc.createEnvironment(t, "kubeclip-brokered", environmentConfig("pod", false))
	pc.useEnvironment(t, brokered.ID)
	pc.setAgentEnv(t, map[string]string{brokeredKey: key, stubModelCall: "1", stubSecretSearch: needleOf(key)})

	refusedBefore := brokerRefusals(t)
	grants := watchGrants(t)
	wire := watchWire(t)
	runStart := time.Now()
	runID := pc.invoke(t)
	// kubeclip's NATS traffic from before the run to its usage events, searched however the
	// test ends (a deferred call runs after t.Fatal too).
	defer func() {
		ws := searchWire(wire.messages(), key)
		t.Logf("NATS search (1 account: the suite's server has no other): messages %d bytes %d matches %d (subjects %v) placeholders %d",
			ws.messages, ws.bytes, ws.matches, ws.matchSubjects, ws.placeholders)
		if ws.messages == 0 {
			t.Errorf("the NATS search saw no message during the run")
		}
		if ws.matches != 0 {
			t.Errorf("the real key crossed kubeclip's NATS %d times, on %v", ws.matches, ws.matchSubjects)
		}
	}()

	// The pod's side, reported before the run's other checks so a failed run still says what
	// its pod held: the stub's search, and its environment reports.
	pc.waitRun(t, runID, runTimeout)
	lines := stubLines(stdoutChunks(pc.runLog(t, runID)))
	search := secretSearch(t, runID, lines)
	t.Logf("pod search: env vars %d matches %d placeholders %d | files %d bytes %d unreadable %d over budget %t matches %d placeholders %d | processes %d unreadable %d environ matches %d placeholders %d cmdline matches %d placeholders %d | %d ms",
		search.EnvVars, search.Env.Matches, search.Env.Placeholders,
		search.Files, search.FileBytes, search.Unreadable, search.OverBudget, search.FileTally.Matches, search.FileTally.Placeholders,
		search.Processes, search.ProcsUnreadable, search.Environ.Matches, search.Environ.Placeholders, search.Cmdline.Matches, search.Cmdline.Placeholders,
		search.SearchDurationMS)
	t.Logf("pod search: files holding the value %v; holding a placeholder %v", search.MatchPaths, search.PlaceholderPaths)
	// The real value is nowhere in the pod, and the search looked where it would have been: it
	// read files and processes, and found the placeholder in the environment it has instead.
	if search.Env.Matches+search.FileTally.Matches+search.Environ.Matches+search.Cmdline.Matches != 0 {
		t.Errorf("the real key is in the pod: environment %d, files %d %v, /proc/*/environ %d, /proc/*/cmdline %d",
			search.Env.Matches, search.FileTally.Matches, search.MatchPaths, search.Environ.Matches, search.Cmdline.Matches)
	}
	if search.Env.Placeholders == 0 || search.Environ.Placeholders == 0 || search.Files < 100 || search.Processes < 2 || search.OverBudget {
		t.Errorf("the pod search is not a search: %d placeholders in its environment, %d in /proc/*/environ, %d files, %d processes, over budget %t; want a placeholder in both, hundreds of files, the agent and its parents",
			search.Env.Placeholders, search.Environ.Placeholders, search.Files, search.Processes, search.OverBudget)
	}
	checkPlaceholderInEnv(t, runID, lines, key)

	// The stub's lines: its prompt, GET /api/agents/me, the model's answer, Done.
	checkRun(t, pc, cs, runID, runWant{name: "brokered", env: brokered, source: "on_demand", backend: "pod", live: true, apiCalls: 2})
	runWall := time.Since(runStart)
	rec := pc.run(t, runID)

	// The stand-in saw one call, with the real key, and its answer is the run's result.
	calls := up.seen()
	if len(calls) != 1 || !calls[0].RealKey || calls[0].Placeholder || calls[0].Path != "/v1/messages" {
		t.Fatalf("the model API's stand-in saw %d calls %+v; want one POST /v1/messages with the real key", len(calls), calls)
	}
	call := calls[0]
	if rec.Result == nil || !strings.Contains(rec.Result.Result, fmt.Sprintf("answered %q", call.Text)) || rec.Result.IsError {
		t.Errorf("run %s: result %+v, want the stub's success naming the stand-in's answer %q", runID, rec.Result, call.Text)
	}
	t.Logf("broker run %s: wall %s (run %s), stand-in calls %d, real key at the stand-in %t", runID, time.Since(began).Round(time.Millisecond), runWall.Round(time.Millisecond), len(calls), call.RealKey)

	// The broker's meter: the run's usage events add up to what the stand-in stated.
	lease := pc.leaseOf(t, brokered.ID, runID, runTimeout)
	usage, usageEvents := brokerUsage(t, lease.Metadata.Kubeclip.CompanyID, lease.Metadata.Kubeclip.RunID, call.Usage)
	t.Logf("usage: stand-in in %d out %d cache read %d cache write %d | broker %+v in %d events",
		call.Usage.InputTokens, call.Usage.OutputTokens, call.Usage.CacheReadTokens, call.Usage.CacheWriteTokens, usage, usageEvents)
	if diff := cmp.Diff([]events.ModelUsage{call.Usage}, usage); diff != "" {
		t.Errorf("run %s: the broker's usage (%d events) differs from the stand-in's (-stand-in +broker):\n%s", runID, usageEvents, diff)
	}
	// The one call was swapped, not refused.
	if refused := brokerRefusals(t) - refusedBefore; refused != 0 {
		t.Errorf("the broker refused %v calls during the run, want none", refused)
	}
	checkGrantsBound(t, pc, runID, lease.Metadata.Kubeclip.CompanyID, lease.Metadata.Kubeclip.RunID, grants, call.At)
}

// grantWrite is one write of a grant to KUBECLIP_GRANTS, as the test saw it: no value (those
// are sealed, and not read here).
type grantWrite struct {
	Key, Company, Run, Peer string
	At                      time.Time
}

// grantWatch records every grant written to KUBECLIP_GRANTS from now on (the suite's NATS has
// one account: the test reads the bucket as the broker does).
type grantWatch struct {
	mu     sync.Mutex
	writes []grantWrite
}

func watchGrants(t *testing.T) *grantWatch {
	t.Helper()
	js, err := jetstream.New(env.NC)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), "KUBECLIP_GRANTS")
	if err != nil {
		t.Fatalf("the grants bucket: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	w, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		cancel()
		t.Fatalf("watching the grants bucket: %v", err)
	}
	g := &grantWatch{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for e := range w.Updates() {
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var rec struct{ Company, Run, Peer string }
			if json.Unmarshal(e.Value(), &rec) != nil {
				continue
			}
			g.mu.Lock()
			g.writes = append(g.writes, grantWrite{Key: e.Key(), Company: rec.Company, Run: rec.Run, Peer: rec.Peer, At: e.Created()})
			g.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = w.Stop()
		cancel()
		<-done
	})
	return g
}

func (g *grantWatch) all() []grantWrite {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]grantWrite(nil), g.writes...)
}

// checkGrantsBound checks the binding of the run's grants to its pod (issue 27: a placeholder
// from another pod is refused): the run stream names the pod's IP, every grant written for the
// run was bound to it before the stub's model call reached the stand-in (calledAt), and that
// call was answered (the test's other checks: no refusal, the real key at the stand-in), so the
// broker saw the call come from the pod's own address, not a node's masquerade.
func checkGrantsBound(t *testing.T, pc *server, runID, company, run string, grants *grantWatch, calledAt time.Time) {
	t.Helper()
	r := follow(t, pc, runID)
	pt.WaitKind[events.RunReleasedEvent](r, runTimeout)
	podIP := ""
	for _, e := range r.Events() {
		if ev, ok := e.Event.(events.RunStatusEvent); ok && ev.PodIP != "" && podIP == "" {
			podIP = ev.PodIP
		}
	}
	if podIP == "" {
		t.Errorf("run %s: no status event names its pod's IP\n%s", runID, pt.Describe(r.Events()))
		return
	}
	boundBefore := map[string]bool{} // grant key → bound to the pod before the call
	var unbound, elsewhere int
	for _, w := range grants.all() {
		if w.Company != company || w.Run != run {
			continue
		}
		if _, ok := boundBefore[w.Key]; !ok {
			boundBefore[w.Key] = false
		}
		switch {
		case w.Peer == "":
			unbound++
		case w.Peer != podIP:
			elsewhere++
		case !w.At.After(calledAt):
			boundBefore[w.Key] = true
		}
	}
	bound := 0
	for _, b := range boundBefore {
		if b {
			bound++
		}
	}
	t.Logf("grant binding: pod IP %s, grants %d, bound to it before the model call %d, writes unbound %d, bound elsewhere %d",
		podIP, len(boundBefore), bound, unbound, elsewhere)
	if len(boundBefore) == 0 || bound != len(boundBefore) || elsewhere != 0 {
		t.Errorf("run %s: %d grants, %d bound to its pod %s before the model call, %d writes bound to another address; want every grant bound to the pod first",
			runID, len(boundBefore), bound, podIP, elsewhere)
	}
}

// brokerRefusals is the broker's kubeclip_broker_refusals_total, all reasons.
func brokerRefusals(t *testing.T) float64 {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, credBroker.OpsURL+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("reading the broker's metrics: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the broker's metrics: %v", err)
	}
	var sum float64
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "kubeclip_broker_refusals_total") {
			continue
		}
		fields := strings.Fields(line)
		v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
		if err != nil {
			t.Fatalf("the broker's metric line %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

// secretSearch is the stub's one search report among lines.
func secretSearch(t *testing.T, runID string, lines []stubLine) searchReport {
	t.Helper()
	var out []searchReport
	for _, l := range lines {
		if l.Type != "system" || l.Subtype != "kubeclip_secret_search" {
			continue
		}
		var r searchReport
		if err := json.Unmarshal([]byte(l.Raw), &r); err != nil {
			t.Fatalf("run %s: the stub's search report %q: %v", runID, cut(l.Raw, 300), err)
		}
		out = append(out, r)
	}
	if len(out) != 1 {
		t.Fatalf("run %s: %d search reports from the stub, want 1 (is the cluster's sandbox image older than tests/images/claude-stub? hack/cluster/cluster.sh images)", runID, len(out))
	}
	return out[0]
}

// checkPlaceholderInEnv checks the pod's environment reports (the agent's and every sh's): each
// that has the brokered key has another value than the real one.
func checkPlaceholderInEnv(t *testing.T, runID string, lines []stubLine, key string) {
	t.Helper()
	reports, err := envReports(lines)
	if err != nil {
		t.Fatalf("run %s: %v", runID, err)
	}
	sum := sha256.Sum256([]byte(key))
	realSum := hex.EncodeToString(sum[:])
	withKey := 0
	for _, r := range reports {
		for _, kv := range r.SHA256 {
			if kv[0] != brokeredKey {
				continue
			}
			if r.Source == "claude" {
				withKey++
			}
			if kv[1] == realSum {
				t.Errorf("run %s: the %s environment in the pod holds the real %s", runID, r.Source, brokeredKey)
			}
		}
	}
	if withKey != 1 {
		t.Errorf("run %s: the agent's environment report has %s %d times, want once (its placeholder)", runID, brokeredKey, withKey)
	}
}

// brokerUsage sums the run's usage events once they reach want (or the timeout passes) and
// returns the rows by key, host and format, and how many events there were.
func brokerUsage(t *testing.T, companyID, runID string, want events.ModelUsage) ([]events.ModelUsage, int) {
	t.Helper()
	var rows []events.ModelUsage
	var n int
	deadline := time.Now().Add(usageTimeout)
	for {
		evs, err := pt.History(t.Context(), env, companyID, runID)
		if err != nil {
			t.Fatal(err)
		}
		usage := pt.Only[events.RunUsageEvent](evs)
		rows, n = sumUsage(usage), len(usage)
		if (len(rows) == 1 && cmp.Equal(rows[0], want)) || time.Now().After(deadline) {
			return rows, n
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// sumUsage adds up the events' rows per key, host and format (their counts are deltas).
func sumUsage(evs []events.RunUsageEvent) []events.ModelUsage {
	var out []events.ModelUsage
	for _, ev := range evs {
		for _, u := range ev.Usage {
			i := 0
			for ; i < len(out); i++ {
				if out[i].Key == u.Key && out[i].Host == u.Host && out[i].Format == u.Format {
					break
				}
			}
			if i == len(out) {
				out = append(out, events.ModelUsage{Key: u.Key, Host: u.Host, Format: u.Format})
			}
			o := &out[i]
			o.Calls += u.Calls
			o.InputTokens += u.InputTokens
			o.OutputTokens += u.OutputTokens
			o.CacheReadTokens += u.CacheReadTokens
			o.CacheWriteTokens += u.CacheWriteTokens
			for k, v := range u.Unmetered {
				if o.Unmetered == nil {
					o.Unmetered = map[string]int64{}
				}
				o.Unmetered[k] += v
			}
		}
	}
	return out
}

// wireSearch is what the search of NATS's traffic found.
type wireSearch struct {
	messages, matches, placeholders int
	bytes                           int64
	matchSubjects                   []string
}

// searchWire counts the real value and placeholders in every message's subject, headers and
// payload.
func searchWire(msgs []*nats.Msg, key string) wireSearch {
	var ws wireSearch
	for _, m := range msgs {
		var buf bytes.Buffer
		buf.WriteString(m.Subject)
		buf.WriteString(m.Reply)
		for k, vs := range m.Header {
			buf.WriteString(k)
			for _, v := range vs {
				buf.WriteString(v)
			}
		}
		buf.Write(m.Data)
		ws.messages++
		ws.bytes += int64(buf.Len())
		ws.placeholders += bytes.Count(buf.Bytes(), []byte("kcph_"))
		if n := bytes.Count(buf.Bytes(), []byte(key)); n > 0 {
			ws.matches += n
			if len(ws.matchSubjects) < 10 {
				ws.matchSubjects = append(ws.matchSubjects, m.Subject)
			}
		}
	}
	return ws
}
