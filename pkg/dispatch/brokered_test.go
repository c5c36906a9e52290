package dispatch

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/brokersvc"
	"github.com/kubeclip/kubeclip/pkg/broker/mintclient"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

const brokeredValue = "sk-ant-api03-DISPATCH-REALVALUE-0123456789"

// startBroker runs the credential broker's real mint service (pkg/broker/brokersvc) on its own
// connection to the server js is on, answering the workers' mint inbox as cmd/credential-broker
// does; the cache resolves what it mints, and the store binds it as the broker's releaser would.
func startBroker(t *testing.T, js jetstream.JetStream) (*broker.Cache, *broker.Store) {
	t.Helper()
	ctx := t.Context()
	nc, err := nats.Connect(js.Conn().ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	bjs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := bjs.CreateKeyValue(ctx, broker.BucketOptions{StoreBytes: 1 << 30}.Config())
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
	store, err := broker.NewStore(broker.StoreOptions{KV: kv, Sealer: sealer, GrantsPerCompany: 10})
	if err != nil {
		t.Fatal(err)
	}
	log := zerolog.New(zerolog.NewTestWriter(t))
	cache, err := broker.NewCache(broker.CacheOptions{KV: kv, Sealer: sealer, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	mint, err := brokersvc.NewMint(brokersvc.MintOptions{
		NATS: nc, Store: store, Key: sealer.MintKey(), Log: log,
		Bindings: map[string]broker.Binding{"ANTHROPIC_API_KEY": {Hosts: []string{"api.anthropic.com"}, Headers: []broker.Header{broker.HeaderXAPIKey}}},
		Replies:  inbox.MustRule(inbox.PaperclipPrefix, inbox.WorkersMintPrefix),
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []interface {
		Run(context.Context) error
		Ready() <-chan struct{}
	}{cache, mint} {
		runCtx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(runCtx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
		select {
		case <-w.Ready():
		case err := <-done:
			t.Fatalf("a broker part ended before it was ready: %v", err)
		case <-time.After(10 * time.Second):
			t.Fatal("a broker part is not ready after 10 s")
		}
	}
	return cache, store
}

// wiretap records every message the server carries, as a capture of kubeclip's NATS traffic
// would; holding counts those that hold s.
type wiretap struct {
	mu   sync.Mutex
	msgs [][]byte
}

func tapAll(t *testing.T, js jetstream.JetStream) *wiretap {
	t.Helper()
	nc, err := nats.Connect(js.Conn().ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	w := &wiretap{}
	if _, err := nc.Subscribe(">", func(m *nats.Msg) {
		b := append([]byte(m.Subject+" "+m.Reply+" "), m.Data...)
		w.mu.Lock()
		w.msgs = append(w.msgs, b)
		w.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return w
}

func (w *wiretap) holding(s string) (msgs, hits int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range w.msgs {
		if bytes.Contains(m, []byte(s)) {
			hits++
		}
	}
	return len(w.msgs), hits
}

// brokeredEnv is the dispatcher's environment: a brokered key's real value, and a key that is
// not brokered.
func brokeredEnv(k string) (string, bool) {
	switch k {
	case "ANTHROPIC_API_KEY":
		return brokeredValue, true
	case "OPENAI_API_KEY":
		return "sk-openai-not-brokered", true
	}
	return "", false
}

// TestRunSecretCarriesPlaceholders (issue 27): with --brokered-keys, the run Secret the
// dispatcher renders holds the lease's placeholder for a brokered key, minted through the real
// broker, which resolves to the real value at the bound host for exactly this company, run and
// lease; a key that is not brokered keeps its value; a redelivered dispatch renders the same
// placeholder; and no message on the server, the mint's included, holds the real value.
func TestRunSecretCarriesPlaceholders(t *testing.T) {
	js, opts := unreachableOptions(t, nil)
	w := tapAll(t, js)
	cache, store := startBroker(t, js)
	minter, err := mintclient.New(mintclient.Options{NATS: js.Conn()})
	if err != nil {
		t.Fatal(err)
	}
	opts.BrokeredKeys, opts.Minter, opts.LookupEnv = []string{"ANTHROPIC_API_KEY"}, minter, brokeredEnv
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := lease.New(events.AcquireRequest{
		RunID: "run-brokered", CompanyID: "acme", EnvironmentID: "env", AgentID: "agent-1",
		AdapterType: "cursor_local", Config: json.RawMessage(`{"backend":"job"}`),
	}, time.Now(), d.opts.Operator)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(plan.Adapter.EnvKeys, "ANTHROPIC_API_KEY") || !slices.Contains(plan.Adapter.EnvKeys, "OPENAI_API_KEY") {
		t.Fatalf("the adapter's envKeys %v lack the keys this test puts in the Secret", plan.Adapter.EnvKeys)
	}
	spec := plan.RunSpec(policy.WorkloadName(d.opts.NewID()))
	wl, err := d.workload(lease.Record{Backend: string(policy.BackendJob)})
	if err != nil {
		t.Fatal(err)
	}
	secret, err := d.renderSecret(t.Context(), plan, spec, wl)
	if err != nil {
		t.Fatalf("rendering the run Secret: %v", err)
	}
	p := secret.StringData["ANTHROPIC_API_KEY"]
	if _, err := broker.ParsePlaceholder(p); err != nil {
		t.Fatalf("the Secret's ANTHROPIC_API_KEY is no placeholder: %v", err)
	}
	if got := secret.StringData["OPENAI_API_KEY"]; got != "sk-openai-not-brokered" {
		t.Errorf("a key that is not brokered changed in the Secret: %q", got)
	}
	doc, err := json.Marshal(secret)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(doc, []byte(brokeredValue)) {
		t.Fatal("the run Secret holds the brokered key's real value")
	}
	// The run-watcher reports the run's pod: its grants resolve from there only.
	if _, err := store.BindRun(t.Context(), "acme", "run-brokered", netip.MustParseAddr("10.0.0.9")); err != nil {
		t.Fatal(err)
	}
	var res broker.Resolved
	eventually(t, "the Secret's placeholder to resolve", func() bool {
		res, err = cache.Resolve(p, "api.anthropic.com", broker.HeaderXAPIKey, netip.MustParseAddr("10.0.0.9"))
		return err == nil
	})
	if res.Value.Reveal() != brokeredValue || res.Grant.Company != "acme" || res.Grant.Run != "run-brokered" || res.Grant.Lease != spec.WorkloadName {
		t.Errorf("the placeholder resolved to grant %+v (the real value: %v), want acme's run-brokered, lease %s", res.Grant, res.Value.Reveal() == brokeredValue, spec.WorkloadName)
	}
	again, err := d.renderSecret(t.Context(), plan, spec, wl)
	if err != nil || again.StringData["ANTHROPIC_API_KEY"] != p {
		t.Errorf("a redelivered dispatch's Secret: %v, want the same placeholder", err)
	}
	eventually(t, "the tap to see the mint's answer", func() bool { _, n := w.holding(p); return n > 0 })
	n, leaks := w.holding(brokeredValue)
	_, answers := w.holding(p)
	t.Logf("messages_seen\tholding_value\tholding_placeholder\n%d\t%d\t%d", n, leaks, answers)
	if leaks != 0 {
		t.Errorf("%d of %d messages on the server hold the real value", leaks, n)
	}
}

// TestBrokeredDispatchFailsNamingTheKey (issue 27): with no broker answering, a brokered
// dispatch fails at once with a `failed` event naming the key and never its value, the lease is
// failed, and not one create, update or patch reached the Kubernetes API: nothing was created
// half-way.
func TestBrokeredDispatchFailsNamingTheKey(t *testing.T) {
	// Creations and changes; a DELETE is the failure's best-effort cleanup of the workload name
	// the lease record holds (reportDispatchFailure), which finds nothing to delete.
	var writes, deletes atomic.Int64
	js, opts := unreachableOptions(t, func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			switch r.Method {
			case http.MethodGet:
			case http.MethodDelete:
				deletes.Add(1)
			default:
				writes.Add(1)
				t.Logf("kubernetes write: %s %s", r.Method, r.URL.Path)
			}
			return rt.RoundTrip(r)
		})
	})
	minter, err := mintclient.New(mintclient.Options{NATS: js.Conn(), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	opts.BrokeredKeys, opts.Minter, opts.LookupEnv = []string{"ANTHROPIC_API_KEY"}, minter, brokeredEnv
	startDispatcher(t, opts)()
	ctx := t.Context()

	ref := events.Ref("acme", "run-no-broker")
	leases, _ := js.KeyValue(ctx, lease.Bucket)
	if _, _, err := (lease.Records{KV: leases}).Create(ctx, lease.Record{RunID: ref.RunID, CompanyID: ref.CompanyID, AgentID: "agent-1", State: lease.StateRequested}); err != nil {
		t.Fatal(err)
	}
	tenants, _ := js.KeyValue(ctx, lease.TenantBucket)
	owner, _ := json.Marshal(lease.TenantRecord{CompanyID: "acme"})
	if _, err := tenants.Put(ctx, "paperclip-acme", owner); err != nil {
		t.Fatal(err)
	}
	pub, err := events.NewPublisher(events.PublisherOptions{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	req := events.DispatchRequest{Namespace: "paperclip-acme", AcquireRequest: events.AcquireRequest{
		RunID: ref.RunID, CompanyID: ref.CompanyID, EnvironmentID: "env", AgentID: "agent-1", Config: json.RawMessage(`{"backend":"job"}`),
	}}
	start := time.Now()
	if _, err := pub.Publish(ctx, planned(t, req)); err != nil {
		t.Fatal(err)
	}
	var failed events.RunFailedEvent
	err = events.Follow(ctx, js, events.Subjects{}, ref.CompanyID, ref.RunID, events.FollowOptions{}, func(r events.Received) error {
		if f, ok := r.Event.(events.RunFailedEvent); ok {
			failed = f
			return events.ErrStopFollowing
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	t.Logf("failed_after_ms\tkubernetes_writes\tkubernetes_deletes\tcode\n%d\t%d\t%d\t%s", took.Milliseconds(), writes.Load(), deletes.Load(), failed.Code)
	if failed.Code != events.CodeBackendUnavailable || !strings.Contains(failed.Message, "ANTHROPIC_API_KEY") || !strings.Contains(failed.Message, "no broker answers") {
		t.Errorf("failed = %s %q, want backend_unavailable naming ANTHROPIC_API_KEY and that no broker answers", failed.Code, failed.Message)
	}
	if strings.Contains(failed.Message, brokeredValue) || strings.Contains(failed.Message, "REALVALUE") {
		t.Errorf("the failure quotes the value: %q", failed.Message)
	}
	if n := writes.Load(); n != 0 {
		t.Errorf("%d creates, updates or patches reached the Kubernetes API, want none: a brokered dispatch fails before anything is created", n)
	}
	rec, _, err := (lease.Records{KV: leases}).Get(ctx, ref)
	if err != nil || rec.State != lease.StateFailed || rec.Failure != events.CodeBackendUnavailable {
		t.Errorf("lease after the failed mint: %+v (%v), want failed with backend_unavailable", rec, err)
	}
}

// TestBrokeredKeysNeedAMinter: brokered keys without a way to mint their placeholders are a
// wiring mistake New refuses, not a dispatcher that would put real values in Secrets.
func TestBrokeredKeysNeedAMinter(t *testing.T) {
	_, opts := unreachableOptions(t, nil)
	opts.BrokeredKeys = []string{"ANTHROPIC_API_KEY"}
	if _, err := New(opts); err == nil || !strings.Contains(err.Error(), "Options.Minter") {
		t.Errorf("New with brokered keys and no minter: %v, want an error naming Options.Minter", err)
	}
}
