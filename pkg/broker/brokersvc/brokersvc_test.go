package brokersvc_test

import (
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/brokersvc"
	"github.com/kubeclip/kubeclip/pkg/broker/mintproto"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const realValue = "sk-ant-api03-REALVALUE-0123456789"

var anthropic = broker.Binding{Hosts: []string{"api.anthropic.com"}, Headers: []broker.Header{broker.HeaderXAPIKey}}

type env struct {
	srv    *server.Server
	sealer *broker.Sealer
	js     jetstream.JetStream
	kv     jetstream.KeyValue
	store  *broker.Store
	cache  *broker.Cache
}

func newEnv(t *testing.T, quota int) env {
	t.Helper()
	srv, _, js := natstest.Start(t)
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
	store, err := broker.NewStore(broker.StoreOptions{KV: kv, Sealer: sealer, GrantsPerCompany: quota})
	if err != nil {
		t.Fatal(err)
	}
	cache, err := broker.NewCache(broker.CacheOptions{KV: kv, Sealer: sealer, Log: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	run(t, cache)
	return env{srv: srv, sealer: sealer, js: js, kv: kv, store: store, cache: cache}
}

// run runs w until the test ends, and waits for it.
func run(t *testing.T, w interface {
	Run(context.Context) error
	Ready() <-chan struct{}
}) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	select {
	case <-w.Ready():
	case err := <-done:
		t.Fatalf("Run ended before it was ready: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("not ready after 10 s")
	}
}

func startMint(t *testing.T, e env) (*brokersvc.Mint, *prometheus.Registry) {
	t.Helper()
	nc, _ := natstest.Connect(t, e.srv)
	reg := prometheus.NewRegistry()
	m, err := brokersvc.NewMint(brokersvc.MintOptions{
		NATS: nc, Store: e.store, Bindings: map[string]broker.Binding{"ANTHROPIC_API_KEY": anthropic}, Key: e.sealer.MintKey(),
		Replies: inbox.MustRule(inbox.PaperclipPrefix, inbox.WorkersMintPrefix), Registerer: reg, Log: zerolog.New(zerolog.NewTestWriter(t)),
	})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m)
	return m, reg
}

func client(t *testing.T, srv *server.Server) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(srv.ClientURL(), nats.CustomInboxPrefix(inbox.PaperclipPrefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func request(t *testing.T, nc *nats.Conn, subject string, body []byte) mintproto.MintReply {
	t.Helper()
	msg, err := nc.Request(subject, body, 5*time.Second)
	if err != nil {
		t.Fatalf("request: %v", err)
	}
	var r mintproto.MintReply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// mintBody is a mint request for company-a's run-1 sealed to the broker of e.
func (e env) mintBody(t *testing.T, lease, key, value string) []byte {
	return e.mintBodyFor(t, "company-a", "run-1", lease, key, value)
}

// mintBodyFor is a mint request sealed to the broker of e for the company and run given.
func (e env) mintBodyFor(t *testing.T, company, run, lease, key, value string) []byte {
	t.Helper()
	return sealedBody(t, e.sealer.MintKey().PublicKey(), mintproto.AAD(company, run, lease, key), lease, key, value)
}

// sealedBody is a mint request for lease and key whose value is sealed to pub under aad.
func sealedBody(t *testing.T, pub *ecdh.PublicKey, aad []byte, lease, key, value string) []byte {
	t.Helper()
	s, err := mintproto.Seal(pub, aad, []byte(value))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(mintproto.MintRequest{LeaseID: lease, Key: key, EphemeralKey: s.EphemeralKey, Nonce: s.Nonce, Ciphertext: s.Ciphertext})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestMintAnswers: every refusal names its field (or the budget) and its code, and never
// quotes the value; a good request gets a placeholder that resolves to the value.
func TestMintAnswers(t *testing.T) {
	e := newEnv(t, 2)
	startMint(t, e)
	nc := client(t, e.srv)
	for _, lease := range []string{"lease-full-1", "lease-full-2"} {
		if _, _, err := e.store.Mint(t.Context(), broker.MintRequest{Company: "company-full", Run: "r", Lease: lease, Key: "ANTHROPIC_API_KEY", Binding: anthropic, Value: realValue}); err != nil {
			t.Fatal(err)
		}
	}
	good := "paperclip.broker.company-a.run-1.mint"
	other, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sealed := e.mintBody(t, "l", "ANTHROPIC_API_KEY", realValue)
	field := func(doc []byte, extra string) []byte { // doc with one more member
		return append(append(doc[:len(doc)-1:len(doc)-1], ","+extra...), '}')
	}
	for _, tc := range []struct {
		name, subject string
		body          []byte
		wantCode      mintproto.Code
		wantField     string
		wantMessage   string
	}{
		{"not JSON", good, []byte(`{"ciphertext":"` + realValue), mintproto.CodeInvalidRequest, "", "not a valid JSON object"},
		{"unknown field", good, field(sealed, `"secret":1`), mintproto.CodeInvalidRequest, "secret", "not a field"},
		{"the value in clear", good, []byte(`{"leaseId":"l","key":"ANTHROPIC_API_KEY","value":"` + realValue + `"}`), mintproto.CodeInvalidRequest, "value", "never sent in clear"},
		{"the value in clear beside a sealed one", good, field(sealed, `"value":"`+realValue+`"`), mintproto.CodeInvalidRequest, "value", "never sent in clear"},
		{"field in another case", good, []byte(`{"leaseId":"l","KEY":"ANTHROPIC_API_KEY"}`), mintproto.CodeInvalidRequest, "KEY", ""},
		{"ciphertext twice", good, field(sealed, `"ciphertext":"AAAA"`), mintproto.CodeInvalidRequest, "ciphertext", ""},
		{"ciphertext not a string", good, []byte(`{"leaseId":"l","key":"ANTHROPIC_API_KEY","ciphertext":12}`), mintproto.CodeInvalidRequest, "ciphertext", "must be a string"},
		{"no lease", good, e.mintBody(t, "", "ANTHROPIC_API_KEY", realValue), mintproto.CodeInvalidRequest, "leaseId", "must not be empty"},
		{"lease with a dot", good, e.mintBody(t, "a.b", "ANTHROPIC_API_KEY", realValue), mintproto.CodeInvalidRequest, "leaseId", "must not contain"},
		{"nothing sealed", good, []byte(`{"leaseId":"l","key":"ANTHROPIC_API_KEY"}`), mintproto.CodeInvalidRequest, "ephemeralKey", "X25519 public key"},
		{"no value", good, e.mintBody(t, "l", "ANTHROPIC_API_KEY", ""), mintproto.CodeInvalidRequest, "ciphertext", "non-empty value"},
		{"sealed to another key", good, sealedBody(t, other.PublicKey(), mintproto.AAD("company-a", "run-1", "l", "ANTHROPIC_API_KEY"), "l", "ANTHROPIC_API_KEY", realValue), mintproto.CodeInvalidRequest, "ciphertext", "does not open"},
		{"sealed for another lease", good, sealedBody(t, e.sealer.MintKey().PublicKey(), mintproto.AAD("company-a", "run-1", "lease-other", "ANTHROPIC_API_KEY"), "l", "ANTHROPIC_API_KEY", realValue), mintproto.CodeInvalidRequest, "ciphertext", "does not open"},
		{"sealed for another company", good, e.mintBodyFor(t, "company-b", "run-1", "l", "ANTHROPIC_API_KEY", realValue), mintproto.CodeInvalidRequest, "ciphertext", "does not open"},
		{"sealed for another run", good, e.mintBodyFor(t, "company-a", "run-2", "l", "ANTHROPIC_API_KEY", realValue), mintproto.CodeInvalidRequest, "ciphertext", "does not open"},
		{"sealed for another key", good, sealedBody(t, e.sealer.MintKey().PublicKey(), mintproto.AAD("company-a", "run-1", "l", "OPENAI_API_KEY"), "l", "ANTHROPIC_API_KEY", realValue), mintproto.CodeInvalidRequest, "ciphertext", "does not open"},
		{"value with a header injection", good, e.mintBody(t, "l", "ANTHROPIC_API_KEY", realValue+"\r\nX-Evil: 1"), mintproto.CodeInvalidRequest, "ciphertext", "printable ASCII"},
		{"a placeholder as the value", good, e.mintBody(t, "l", "ANTHROPIC_API_KEY", "kcph_"+realValue), mintproto.CodeInvalidRequest, "ciphertext", "placeholder"},
		{"key not brokered", good, e.mintBody(t, "l", "OPENAI_API_KEY", realValue), mintproto.CodeUnknownKey, "key", `"OPENAI_API_KEY" is not a brokered key`},
		{"run with a wildcard-free but too long id", "paperclip.broker.company-a." + strings.Repeat("r", events.MaxTokenLen+1) + ".mint", e.mintBody(t, "l", "ANTHROPIC_API_KEY", realValue), mintproto.CodeInvalidRequest, "subject", ""},
		{"quota", "paperclip.broker.company-full.run-9.mint", e.mintBodyFor(t, "company-full", "run-9", "lease-3", "ANTHROPIC_API_KEY", realValue), mintproto.CodeQuotaExceeded, "", `company "company-full" holds 2 credential broker grants, its quota (GrantsPerCompany) is 2`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := request(t, nc, tc.subject, tc.body)
			if r.Error == nil {
				t.Fatalf("answered %+v, want a refusal", r.GrantID)
			}
			if r.Placeholder != "" {
				t.Errorf("a refusal carries a placeholder")
			}
			if r.Error.Code != tc.wantCode || r.Error.Field != tc.wantField || !strings.Contains(r.Error.Message, tc.wantMessage) {
				t.Errorf("refusal %+v, want code %s, field %q, a message saying %q", r.Error, tc.wantCode, tc.wantField, tc.wantMessage)
			}
			if strings.Contains(r.Error.Message, realValue) || strings.Contains(r.Error.Message, "REALVALUE") {
				t.Errorf("the refusal quotes the value: %s", r.Error.Message)
			}
		})
	}
	r := request(t, nc, good, e.mintBody(t, "lease-1", "ANTHROPIC_API_KEY", realValue))
	if r.Error != nil || !strings.HasPrefix(r.Placeholder, broker.PlaceholderPrefix) || len(r.Hosts) != 1 || r.Hosts[0] != "api.anthropic.com" {
		t.Fatalf("a good mint: %+v", r)
	}
	pod := netip.MustParseAddr("10.0.0.1")
	if _, err := e.store.BindRun(t.Context(), "company-a", "run-1", pod); err != nil { // the run-watcher's status
		t.Fatal(err)
	}
	var res broker.Resolved
	eventually(t, "the placeholder to resolve", func() bool {
		var err error
		res, err = e.cache.Resolve(r.Placeholder, "api.anthropic.com", broker.HeaderXAPIKey, pod)
		return err == nil
	})
	if res.Value.Reveal() != realValue || res.Grant.Company != "company-a" || res.Grant.Run != "run-1" || res.Grant.Lease != "lease-1" {
		t.Errorf("the placeholder resolved to grant %+v (the real value: %v)", res.Grant, res.Value.Reveal() == realValue)
	}
}

// TestMintAnswersOnlyClientInboxes: a request whose reply subject is not a client inbox is
// dropped (kubeclip would otherwise publish a placeholder where the client chose) and counted.
func TestMintAnswersOnlyClientInboxes(t *testing.T) {
	e := newEnv(t, 10)
	_, reg := startMint(t, e)
	nc := client(t, e.srv)
	sub, err := nc.SubscribeSync("paperclip.run.company-a.run-1.created")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("paperclip.broker.company-a.run-1.mint", "paperclip.run.company-a.run-1.created", e.mintBody(t, "lease-1", "ANTHROPIC_API_KEY", realValue)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the dropped request to be counted", func() bool {
		return counter(t, reg, "kubeclip_broker_mints_total", "unanswerable") == 1
	})
	if m, err := sub.NextMsg(100 * time.Millisecond); err == nil {
		t.Fatalf("the broker answered onto a run subject: %s", m.Data)
	}
	if keys, _ := e.kv.ListKeys(t.Context()); keys != nil {
		for k := range keys.Keys() {
			t.Errorf("a dropped request minted grant %s", k)
		}
	}
}

// TestMintIsIdempotent: the same mint sent many times at once (a redelivery, a retry, a
// duplicate) makes one grant and answers each with its placeholder; a mint with another value
// for the lease's key keeps the grant and its placeholder and replaces the value.
func TestMintIsIdempotent(t *testing.T) {
	e := newEnv(t, 10)
	startMint(t, e)
	nc := client(t, e.srv)
	const n = 8
	replies := make([]mintproto.MintReply, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			replies[i] = request(t, nc, "paperclip.broker.company-a.run-1.mint", e.mintBody(t, "lease-1", "ANTHROPIC_API_KEY", realValue))
		})
	}
	wg.Wait()
	for i, r := range replies {
		if r.Error != nil || r.Placeholder != replies[0].Placeholder || r.GrantID != replies[0].GrantID {
			t.Errorf("mint %d: grant %s (error %v), want the first's %s and its placeholder", i, r.GrantID, r.Error, replies[0].GrantID)
		}
	}
	if got := countKeys(t, e.kv); got != 1 {
		t.Fatalf("%d concurrent mints made %d grants, want 1", n, got)
	}
	if _, err := e.store.BindRun(t.Context(), "company-a", "run-1", netip.MustParseAddr("10.0.0.1")); err != nil { // the run-watcher's status
		t.Fatal(err)
	}
	rotated := request(t, nc, "paperclip.broker.company-a.run-1.mint", e.mintBody(t, "lease-1", "ANTHROPIC_API_KEY", realValue+"-ROTATED"))
	if rotated.Error != nil || rotated.Placeholder != replies[0].Placeholder {
		t.Fatalf("a mint with a rotated value: %+v, want the lease's placeholder", rotated)
	}
	eventually(t, "the rotated value to resolve", func() bool {
		res, err := e.cache.Resolve(rotated.Placeholder, "api.anthropic.com", broker.HeaderXAPIKey, netip.MustParseAddr("10.0.0.1"))
		return err == nil && res.Value.Reveal() == realValue+"-ROTATED"
	})
	other := request(t, nc, "paperclip.broker.company-a.run-1.mint", e.mintBody(t, "lease-2", "ANTHROPIC_API_KEY", realValue))
	if other.Error != nil || other.GrantID == replies[0].GrantID || other.Placeholder == replies[0].Placeholder {
		t.Errorf("another lease's mint shares the first lease's grant")
	}
	if got := countKeys(t, e.kv); got != 2 {
		t.Errorf("%d grants after two leases' mints, want 2", got)
	}
}

// TestReleaserEndsGrants: each event that ends a lease or a run releases exactly its grants
// through the shared consumer, within a second; a failed release or resume ends nothing.
func TestReleaserEndsGrants(t *testing.T) {
	e := newEnv(t, 20)
	ctx := t.Context()
	if err := events.EnsureStreams(ctx, e.js, events.Options{StoreBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	rel, err := brokersvc.NewReleaser(brokersvc.ReleaserOptions{JetStream: e.js, Store: e.store, Log: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	run(t, rel)
	mint := func(company, run, lease string) broker.Placeholder {
		p, _, err := e.store.Mint(ctx, broker.MintRequest{Company: company, Run: run, Lease: lease, Key: "ANTHROPIC_API_KEY", Binding: anthropic, Value: realValue, Peer: netip.MustParseAddr("10.0.0.1")})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	resolves := func(p broker.Placeholder) bool {
		_, err := e.cache.Resolve(p.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, netip.MustParseAddr("10.0.0.1"))
		return err == nil
	}
	publish := func(company, run string, kind events.RunKind, payload any) time.Time {
		subj, err := events.Subjects{}.Run(company, run, kind)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := json.Marshal(payload)
		at := time.Now()
		if _, err := e.js.Publish(ctx, subj, data); err != nil {
			t.Fatal(err)
		}
		return at
	}
	for _, tc := range []struct {
		name    string
		kind    events.RunKind
		payload func(company, run string) any
		ends    bool
	}{
		{"released", events.KindReleased, func(c, r string) any {
			return events.RunReleasedEvent{CompanyID: c, RunID: r, ProviderLeaseID: "lease-" + r, State: events.ReleaseStopped}
		}, true},
		{"result", events.KindResult, func(c, r string) any {
			return events.RunResultEvent{CompanyID: c, RunID: r, Outcome: events.OutcomeSucceeded}
		}, true},
		{"suspended", events.KindSuspended, func(c, r string) any {
			return events.RunSuspendedEvent{CompanyID: c, RunID: r, ProviderLeaseID: "lease-" + r, Generation: 1, VolumeClaim: "lease-" + r + "-home"}
		}, true},
		{"failed acquire", events.KindFailed, func(c, r string) any {
			return events.RunFailedEvent{CompanyID: c, RunID: r, Code: events.CodeInternal, Request: events.LeaseAcquire}
		}, true},
		{"failed release", events.KindFailed, func(c, r string) any {
			return events.RunFailedEvent{CompanyID: c, RunID: r, Code: events.CodeInternal, Request: events.LeaseRelease}
		}, false},
		// The receipt of a release of a lease the company did not have names the lease the
		// request named, which may be a live one of the company's: it ends nothing.
		{"unknown released", events.KindReleased, func(c, r string) any {
			return events.RunReleasedEvent{CompanyID: c, RunID: r, ProviderLeaseID: "lease-" + r, State: events.ReleaseDestroyed, Unknown: true}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := "run-" + strings.ReplaceAll(tc.name, " ", "-")
			mine := mint("company-a", r, "lease-"+r)
			others := []broker.Placeholder{mint("company-a", r+"-other", "lease-"+r+"-other"), mint("company-b", r, "lease-"+r)}
			eventually(t, "the grants to resolve", func() bool { return resolves(mine) && resolves(others[0]) && resolves(others[1]) })
			at := publish("company-a", r, tc.kind, tc.payload("company-a", r))
			if !tc.ends {
				// Published after it: once the marker's run ended, the first event was handled.
				marker := "run-marker-" + strings.ReplaceAll(tc.name, " ", "-")
				mp := mint("company-a", marker, "lease-"+marker)
				publish("company-a", marker, events.KindResult, events.RunResultEvent{CompanyID: "company-a", RunID: marker, Outcome: events.OutcomeSucceeded})
				eventually(t, "the marker run's grant to go", func() bool { return !resolves(mp) })
				if !resolves(mine) {
					t.Errorf("the %s event released the run's grant", tc.name)
				}
				return
			}
			eventually(t, "the run's grant to go", func() bool { return !resolves(mine) })
			took := time.Since(at)
			t.Logf("%s: refused %s after the event", tc.name, took.Round(time.Millisecond))
			if took > time.Second {
				t.Errorf("the grant went %s after its %s event, want within 1 s", took, tc.name)
			}
			for i, p := range others {
				if !resolves(p) {
					t.Errorf("the %s event released another run's grant (%d)", tc.name, i)
				}
			}
		})
	}
}

// countKeys counts the grants in kv: not the runs' remembered peers (broker.Store.BindRun).
func countKeys(t *testing.T, kv jetstream.KeyValue) int {
	t.Helper()
	keys, err := kv.Keys(t.Context())
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, k := range keys {
		if !strings.HasPrefix(k, "_b64_=peer.") {
			n++
		}
	}
	return n
}

func counter(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == label {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return -1
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestKeyAnswers: the key subject answers the broker's mint key (the one its sealing key
// derives, the same on every replica), into an allowed inbox only.
func TestKeyAnswers(t *testing.T) {
	e := newEnv(t, 10)
	startMint(t, e)
	nc := client(t, e.srv)
	msg, err := nc.Request("paperclip.broker.key", nil, 5*time.Second)
	if err != nil {
		t.Fatalf("asking the key: %v", err)
	}
	pub, err := mintproto.ParseKeyReply(msg.Data)
	if err != nil || !pub.Equal(e.sealer.MintKey().PublicKey()) {
		t.Fatalf("the key answer %s (%v) is not the broker's mint key", msg.Data, err)
	}
	other, err := nats.Connect(e.srv.ClientURL(), nats.CustomInboxPrefix(inbox.WorkersPrefix))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if m, err := other.Request("paperclip.broker.key", nil, 300*time.Millisecond); !errors.Is(err, nats.ErrTimeout) {
		t.Errorf("a key request from the workers' own inbox: %v, %v; want no answer", m, err)
	}
}

// TestReleaserBindsGrants: a status naming the pod's IP while the run goes on (Pending, Running)
// binds the run's grants to it, and only the run's; a status without an IP, or one that ends the
// run, binds nothing, and the grants stay unbound: they resolve from no address.
func TestReleaserBindsGrants(t *testing.T) {
	e := newEnv(t, 20)
	ctx := t.Context()
	if err := events.EnsureStreams(ctx, e.js, events.Options{StoreBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	rel, err := brokersvc.NewReleaser(brokersvc.ReleaserOptions{JetStream: e.js, Store: e.store, Log: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	run(t, rel)
	pod, other := netip.MustParseAddr("10.0.0.9"), netip.MustParseAddr("10.0.0.1")
	mint := func(company, run string) broker.Placeholder {
		p, _, err := e.store.Mint(ctx, broker.MintRequest{Company: company, Run: run, Lease: "lease-" + run, Key: "ANTHROPIC_API_KEY", Binding: anthropic, Value: realValue})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	reason := func(p broker.Placeholder, from netip.Addr) broker.Reason {
		_, err := e.cache.Resolve(p.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, from)
		if err == nil {
			return ""
		}
		r, _ := broker.RefusalReason(err)
		return r
	}
	pub, err := events.NewPublisher(events.PublisherOptions{JS: e.js})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		phase events.Phase
		ip    string
		binds bool
	}{
		{"running with its IP", events.PhaseRunning, pod.String(), true},
		{"pending with its IP", events.PhasePending, pod.String(), true},
		{"running without an IP", events.PhaseRunning, "", false},
		{"succeeded with its IP", events.PhaseSucceeded, pod.String(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := "run-" + strings.ReplaceAll(tc.name, " ", "-")
			mine, others := mint("company-a", r), []broker.Placeholder{mint("company-a", r+"-other"), mint("company-b", r)}
			eventually(t, "the cache to hold the grants, unbound", func() bool { return reason(mine, other) == broker.ReasonUnbound })
			if _, err := pub.Publish(ctx, events.RunStatusEvent{CompanyID: "company-a", RunID: r, Phase: tc.phase, PodIP: tc.ip}); err != nil {
				t.Fatal(err)
			}
			// Published after it: once the marker's run ended, the status was handled.
			marker := r + "-marker"
			mp := mint("company-a", marker)
			if _, err := pub.Publish(ctx, events.RunResultEvent{CompanyID: "company-a", RunID: marker, Outcome: events.OutcomeSucceeded}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the marker run's grant to go", func() bool { return reason(mp, other) == broker.ReasonReleased })
			wantOther, wantPod := broker.ReasonUnbound, broker.ReasonUnbound
			if tc.binds {
				wantOther, wantPod = broker.ReasonWrongPeer, ""
			}
			if got := reason(mine, other); got != wantOther {
				t.Errorf("the run's grant from another address: %q, want %q", got, wantOther)
			}
			if got := reason(mine, pod); got != wantPod {
				t.Errorf("the run's grant from its pod: %q, want %q", got, wantPod)
			}
			for i, p := range others {
				if got := reason(p, pod); got != broker.ReasonUnbound {
					t.Errorf("another run's grant (%d): %q, want it still unbound", i, got)
				}
			}
		})
	}
}

// TestReleaserBindsAResumedLease follows a reusable lease's grants through the run stream as
// its life writes it: bound to its first pod by the status, kept across a retained resume, and
// after a suspend (whose result ended the run's watch and its grants) bound to the new pod by
// the resumed event that names it, the only event that does. Its old pod's address, which
// Kubernetes may give another pod, is refused. Suspended again (no result this time), its
// grants end with the suspended event, and the next resume binds the lease's new grants. A resumed event naming no pod (a dispatcher
// before podIp) binds nothing: the lease's grants stay unbound and resolve from no address.
func TestReleaserBindsAResumedLease(t *testing.T) {
	e := newEnv(t, 20)
	ctx := t.Context()
	if err := events.EnsureStreams(ctx, e.js, events.Options{StoreBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	rel, err := brokersvc.NewReleaser(brokersvc.ReleaserOptions{JetStream: e.js, Store: e.store, Log: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	run(t, rel)
	pub, err := events.NewPublisher(events.PublisherOptions{JS: e.js})
	if err != nil {
		t.Fatal(err)
	}
	publish := func(ev events.Event) {
		t.Helper()
		if _, err := pub.Publish(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	const company, acquirer, lease = "company-a", "run-acquire", "pc-reusable"
	first, second, elsewhere := netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("10.0.0.8"), netip.MustParseAddr("10.0.0.1")
	// Every mint of the lease names the run that acquired it (the plugin's lease metadata).
	mint := func(key string) broker.Placeholder {
		t.Helper()
		p, _, err := e.store.Mint(ctx, broker.MintRequest{Company: company, Run: acquirer, Lease: lease, Key: key, Binding: anthropic, Value: realValue})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	reason := func(p broker.Placeholder, from netip.Addr) broker.Reason {
		_, err := e.cache.Resolve(p.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, from)
		r, _ := broker.RefusalReason(err)
		return r
	}
	// boundTo waits until p resolves from pod and is refused wrong_peer from each other address.
	boundTo := func(what string, p broker.Placeholder, pod netip.Addr, others ...netip.Addr) {
		t.Helper()
		start := time.Now()
		eventually(t, what+" to resolve from "+pod.String(), func() bool { return reason(p, pod) == "" })
		t.Logf("%s\tbound_to\t%s\tafter\t%v", what, pod, time.Since(start).Round(time.Millisecond))
		for _, o := range others {
			if got := reason(p, o); got != broker.ReasonWrongPeer {
				t.Errorf("%s from %s: %q, want wrong_peer", what, o, got)
			}
		}
	}

	// The acquire: the dispatcher's mint, then the run-watcher's status naming the first pod.
	p1 := mint("ANTHROPIC_API_KEY")
	publish(events.RunStatusEvent{CompanyID: company, RunID: acquirer, Phase: events.PhaseRunning, PodIP: first.String()})
	boundTo("the acquire's grant", p1, first, elsewhere)

	// Released and retained (the pod stays); the next run resumes it at once and mints again.
	publish(events.RunReleasedEvent{CompanyID: company, RunID: acquirer, ProviderLeaseID: lease, State: events.ReleaseStopped})
	eventually(t, "the released lease's grant to go", func() bool { return reason(p1, first) == broker.ReasonReleased })
	publish(events.RunResumedEvent{CompanyID: company, RunID: acquirer, ProviderLeaseID: lease, From: events.ResumedFromRetained, Generation: 0, Resumes: 1, PodIP: first.String()})
	p2 := mint("ANTHROPIC_API_KEY")
	boundTo("the retained resume's grant", p2, first, elsewhere)

	// The idle window ends: the suspend deletes the pod, the run-watcher's result ends the
	// run's watch and its grants.
	publish(events.RunResultEvent{CompanyID: company, RunID: acquirer, Outcome: events.OutcomeSucceeded})
	eventually(t, "the suspended lease's grant to go", func() bool { return reason(p2, first) == broker.ReasonReleased })

	// A resume onto a new pod: a mint racing the resumed event, and one after it.
	racing := mint("ANTHROPIC_API_KEY")
	publish(events.RunResumedEvent{CompanyID: company, RunID: acquirer, ProviderLeaseID: lease, From: events.ResumedFromSuspended, Generation: 1, Resumes: 2, PodIP: second.String()})
	boundTo("the grant minted as the lease resumed", racing, second, first, elsewhere)
	after := mint("OPENAI_API_KEY")
	boundTo("the grant minted after the resume", after, second, first, elsewhere)

	// Suspended again: the run's watch is over, so no result; the suspended event ends the
	// grants bound to the deleted pod, and forgets it: a mint before the next resume is
	// unbound, and that resume, onto a third pod, binds it there.
	publish(events.RunSuspendedEvent{CompanyID: company, RunID: acquirer, ProviderLeaseID: lease, Generation: 1, VolumeClaim: lease + "-home"})
	eventually(t, "the suspended pod's grants to go", func() bool { return reason(after, second) == broker.ReasonReleased })
	between := mint("ANTHROPIC_API_KEY")
	// The new grant has the released one's id (one per company, lease and key): until the
	// cache has its put, the id answers released.
	eventually(t, "the grant minted while suspended in the cache", func() bool {
		r := reason(between, second)
		return r != broker.ReasonUnknown && r != broker.ReasonReleased
	})
	if got := reason(between, second); got != broker.ReasonUnbound {
		t.Errorf("a grant minted while the lease is suspended, from its deleted pod's address: %q, want unbound", got)
	}
	third := netip.MustParseAddr("10.0.0.9")
	publish(events.RunResumedEvent{CompanyID: company, RunID: acquirer, ProviderLeaseID: lease, From: events.ResumedFromSuspended, Generation: 2, Resumes: 3, PodIP: third.String()})
	boundTo("the grant after a second resume onto a new pod", between, third, second, first)

	// A resumed event naming no pod binds nothing.
	const other = "run-other"
	unnamed, _, err := e.store.Mint(ctx, broker.MintRequest{Company: company, Run: other, Lease: "pc-other", Key: "ANTHROPIC_API_KEY", Binding: anthropic, Value: realValue})
	if err != nil {
		t.Fatal(err)
	}
	publish(events.RunResumedEvent{CompanyID: company, RunID: other, ProviderLeaseID: "pc-other", From: events.ResumedFromSuspended, Generation: 1, Resumes: 1})
	// Published after it: once the marker's run ended, the resumed event was handled.
	marker, _, err := e.store.Mint(ctx, broker.MintRequest{Company: company, Run: "run-marker", Lease: "lease-marker", Key: "ANTHROPIC_API_KEY", Binding: anthropic, Value: realValue})
	if err != nil {
		t.Fatal(err)
	}
	publish(events.RunResultEvent{CompanyID: company, RunID: "run-marker", Outcome: events.OutcomeSucceeded})
	eventually(t, "the marker run's grant to go", func() bool { return reason(marker, second) == broker.ReasonReleased })
	for _, from := range []netip.Addr{first, second, third, elsewhere} {
		if got := reason(unnamed, from); got != broker.ReasonUnbound {
			t.Errorf("a grant after a resumed event naming no pod, from %s: %q, want unbound", from, got)
		}
	}
}
