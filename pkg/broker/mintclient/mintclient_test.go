package mintclient_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/brokersvc"
	"github.com/kubeclip/kubeclip/pkg/broker/mintclient"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const realValue = "sk-ant-api03-MINTCLIENT-REALVALUE-0123456789"

var lease = mintclient.Lease{CompanyID: "company-a", RunID: "run-1", LeaseID: "lease-1"}

type env struct {
	srv   *server.Server
	kv    jetstream.KeyValue
	cache *broker.Cache
	store *broker.Store
	// sealer is the broker's sealing key.
	sealer *broker.Sealer
}

// newEnv is a real nats-server with the grants bucket and a loaded grant cache; the broker's
// mint service is started by startBroker.
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
	return env{srv: srv, kv: kv, cache: cache, store: store, sealer: sealer}
}

// startBroker runs the broker's real mint service, answering the plugin's and the workers'
// mint inboxes as cmd/credential-broker does.
func startBroker(t *testing.T, e env) {
	t.Helper()
	nc, _ := natstest.Connect(t, e.srv)
	m, err := brokersvc.NewMint(brokersvc.MintOptions{
		NATS: nc, Store: e.store, Key: e.sealer.MintKey(),
		Bindings: map[string]broker.Binding{"ANTHROPIC_API_KEY": {Hosts: []string{"api.anthropic.com"}, Headers: []broker.Header{broker.HeaderXAPIKey}}},
		Replies:  inbox.MustRule(inbox.PaperclipPrefix, inbox.WorkersMintPrefix),
		Log:      zerolog.New(zerolog.NewTestWriter(t)),
	})
	if err != nil {
		t.Fatal(err)
	}
	run(t, m)
}

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

func newClient(t *testing.T, e env, timeout time.Duration) *mintclient.Client {
	t.Helper()
	nc, _ := natstest.Connect(t, e.srv)
	c, err := mintclient.New(mintclient.Options{NATS: nc, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// wiretap records every message the server carries (subject, reply, headers and data) on a
// connection of its own: what a capture of kubeclip's NATS traffic would see.
type wiretap struct {
	mu   sync.Mutex
	msgs [][]byte
}

func tap(t *testing.T, srv *server.Server) *wiretap {
	t.Helper()
	nc, _ := natstest.Connect(t, srv)
	w := &wiretap{}
	if _, err := nc.Subscribe(">", func(m *nats.Msg) {
		var b bytes.Buffer
		b.WriteString(m.Subject + " " + m.Reply + " ")
		for k, vs := range m.Header {
			b.WriteString(k + ":" + strings.Join(vs, ",") + " ")
		}
		b.Write(m.Data)
		w.mu.Lock()
		w.msgs = append(w.msgs, b.Bytes())
		w.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return w
}

// search counts the messages and those holding needle (or its base64).
func (w *wiretap) search(needle string) (msgs, hits int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	b64 := []byte(base64.StdEncoding.EncodeToString([]byte(needle)))
	for _, m := range w.msgs {
		if bytes.Contains(m, []byte(needle)) || bytes.Contains(m, b64) {
			hits++
		}
	}
	return len(w.msgs), hits
}

// TestPlaceholdersThroughTheBroker: the client mints through the real broker the placeholder
// that resolves to the real value at the bound host; every brokered value and every alias of
// it is replaced, other keys are kept; and no message on the server, requests, answers, the
// grant's KV writes, holds the value.
func TestPlaceholdersThroughTheBroker(t *testing.T) {
	e := newEnv(t, 10)
	w := tap(t, e.srv)
	startBroker(t, e)
	c := newClient(t, e, 0)
	env := map[string]string{"ANTHROPIC_API_KEY": realValue, "ANTHROPIC_ALIAS": realValue, "OTHER": "kept", "OPENAI_API_KEY": ""}
	got, err := c.Placeholders(t.Context(), lease, []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY"}, env)
	if err != nil {
		t.Fatalf("Placeholders: %v", err)
	}
	p := got["ANTHROPIC_API_KEY"]
	if _, err := broker.ParsePlaceholder(p); err != nil {
		t.Fatalf("ANTHROPIC_API_KEY is not a placeholder: %v", err)
	}
	if got["ANTHROPIC_ALIAS"] != p || got["OTHER"] != "kept" || got["OPENAI_API_KEY"] != "" {
		t.Errorf("aliases and other keys: ALIAS replaced %v, OTHER %q, OPENAI_API_KEY %q", got["ANTHROPIC_ALIAS"] == p, got["OTHER"], got["OPENAI_API_KEY"])
	}
	if env["ANTHROPIC_API_KEY"] != realValue {
		t.Error("Placeholders changed its argument")
	}
	// The run-watcher reports the run's pod: its grants resolve from there only.
	if _, err := e.store.BindRun(t.Context(), lease.CompanyID, lease.RunID, netip.MustParseAddr("10.0.0.1")); err != nil {
		t.Fatal(err)
	}
	var res broker.Resolved
	eventually(t, "the placeholder to resolve", func() bool {
		res, err = e.cache.Resolve(p, "api.anthropic.com", broker.HeaderXAPIKey, netip.MustParseAddr("10.0.0.1"))
		return err == nil
	})
	if res.Value.Reveal() != realValue || res.Grant.Company != lease.CompanyID || res.Grant.Run != lease.RunID || res.Grant.Lease != lease.LeaseID {
		t.Errorf("the placeholder resolved to grant %+v (the real value: %v)", res.Grant, res.Value.Reveal() == realValue)
	}
	// A placeholder is kept as it is: a redelivered dispatch's Secret would hold it already.
	again, err := c.Placeholders(t.Context(), lease, []string{"ANTHROPIC_API_KEY"}, got)
	if err != nil || again["ANTHROPIC_API_KEY"] != p {
		t.Errorf("a placeholder went through again: %v", err)
	}
	eventually(t, "the tap to see the mint's answer", func() bool {
		_, hits := w.search(p)
		return hits > 0
	})
	n, hits := w.search(realValue)
	_, mintHits := w.search(p)
	t.Logf("messages_seen\tholding_value\tholding_placeholder\n%d\t%d\t%d", n, hits, mintHits)
	if hits != 0 {
		t.Errorf("%d of %d messages on the server hold the real value", hits, n)
	}
	if mintHits == 0 {
		t.Error("the tap saw no answer holding the placeholder: it does not see the mint traffic, so its search proves nothing")
	}
}

// TestPlaceholdersFailClosed: a broker that is not there, or refuses, gives an *Error naming the
// key and never the value, and Meaning makes it a dispatch's terminal failure with the code that
// says whose it is.
func TestPlaceholdersFailClosed(t *testing.T) {
	env := map[string]string{"ANTHROPIC_API_KEY": realValue}
	t.Run("no broker", func(t *testing.T) {
		e := newEnv(t, 10)
		c := newClient(t, e, 2*time.Second)
		_, err := c.Placeholders(t.Context(), lease, []string{"ANTHROPIC_API_KEY"}, env)
		checkFailure(t, err, events.CodeBackendUnavailable, "no broker answers")
	})
	t.Run("key not bound at the broker", func(t *testing.T) {
		e := newEnv(t, 10)
		startBroker(t, e)
		c := newClient(t, e, 0)
		_, err := c.Placeholders(t.Context(), lease, []string{"OPENAI_API_KEY"}, map[string]string{"OPENAI_API_KEY": realValue})
		checkFailure(t, err, events.CodeInternal, "unknown_key")
	})
	t.Run("quota", func(t *testing.T) {
		e := newEnv(t, 1)
		startBroker(t, e)
		c := newClient(t, e, 0)
		if _, err := c.Placeholders(t.Context(), lease, []string{"ANTHROPIC_API_KEY"}, env); err != nil {
			t.Fatal(err)
		}
		second := mintclient.Lease{CompanyID: lease.CompanyID, RunID: "run-2", LeaseID: "lease-2"}
		_, err := c.Placeholders(t.Context(), second, []string{"ANTHROPIC_API_KEY"}, env)
		checkFailure(t, err, events.CodeQuotaExceeded, "quota")
	})
	t.Run("an answer only into the workers' mint inbox", func(t *testing.T) {
		// The broker answers nowhere else: a client using the workers' own inbox hears nothing.
		e := newEnv(t, 10)
		startBroker(t, e)
		nc, _ := natstest.Connect(t, e.srv)
		c, err := mintclient.New(mintclient.Options{NATS: nc, InboxPrefix: inbox.WorkersPrefix, Timeout: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Placeholders(t.Context(), lease, []string{"ANTHROPIC_API_KEY"}, env)
		checkFailure(t, err, events.CodeBackendUnavailable, "did not answer within")
	})
}

func checkFailure(t *testing.T, err error, wantCode events.Code, wantReason string) {
	t.Helper()
	var e *mintclient.Error
	if !errors.As(err, &e) || e.Key == "" {
		t.Fatalf("err = %v, want a *mintclient.Error naming the key", err)
	}
	if !strings.Contains(err.Error(), wantReason) || !strings.Contains(err.Error(), e.Key) {
		t.Errorf("err = %v, want it to name %s and say %q", err, e.Key, wantReason)
	}
	te, ok := events.AsTerminal(mintclient.Meaning(err))
	if !ok || te.Code != wantCode {
		t.Fatalf("Meaning(%v) = %v, want a terminal %s", err, te, wantCode)
	}
	for _, text := range []string{err.Error(), te.Public(), te.Error()} {
		if strings.Contains(text, realValue) || strings.Contains(text, "REALVALUE") {
			t.Errorf("a failure quotes the value: %s", text)
		}
	}
	if !strings.Contains(te.Public(), e.Key) {
		t.Errorf("the tenant's message %q does not name the key", te.Public())
	}
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
