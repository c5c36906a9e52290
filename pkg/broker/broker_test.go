package broker_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/broker"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// realValue looks like an Anthropic key; tests search for it where it must not be.
const realValue = "sk-ant-api03-REAL-VALUE-never-leaves-the-broker-0123456789"

var anthropic = broker.Binding{Hosts: []string{"api.anthropic.com"}, Headers: []broker.Header{broker.HeaderXAPIKey, broker.HeaderAuthorization}}

// testBucketOptions size the bucket for a 1 GiB store, as natstest's servers allow.
var testBucketOptions = broker.BucketOptions{StoreBytes: 1 << 30}

func newSealer(t testing.TB) *broker.Sealer {
	t.Helper()
	key := make([]byte, broker.SealingKeyLen)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	s, err := broker.NewSealer(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// grantsBucket starts a nats-server and makes the grants bucket on it.
func grantsBucket(t testing.TB) (*server.Server, jetstream.KeyValue) {
	t.Helper()
	srv, _, js := natstest.Start(t)
	kv, err := js.CreateKeyValue(context.Background(), testBucketOptions.Config())
	if err != nil {
		t.Fatalf("creating the grants bucket: %v", err)
	}
	return srv, kv
}

func newStore(t testing.TB, kv jetstream.KeyValue, s *broker.Sealer, quota int) *broker.Store {
	t.Helper()
	st, err := broker.NewStore(broker.StoreOptions{KV: kv, Sealer: s, GrantsPerCompany: quota})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// startCache runs a Cache on kv until the test ends and returns it once it is ready.
func startCache(t testing.TB, kv jetstream.KeyValue, s *broker.Sealer) *broker.Cache {
	t.Helper()
	c, err := broker.NewCache(broker.CacheOptions{KV: kv, Sealer: s, Log: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Cache.Run: %v", err)
		}
	})
	select {
	case <-c.Ready():
	case err := <-done:
		t.Fatalf("Cache.Run ended before it was ready: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the cache was not ready after 10 s")
	}
	return c
}

func mintReq(company, lease string, peer netip.Addr) broker.MintRequest {
	return broker.MintRequest{Company: company, Run: "run-" + lease, Lease: lease, Key: "ANTHROPIC_API_KEY", Binding: anthropic, Peer: peer, Value: realValue}
}

func mint(t testing.TB, st *broker.Store, r broker.MintRequest) broker.Placeholder {
	t.Helper()
	p, _, err := st.Mint(context.Background(), r)
	if err != nil {
		t.Fatalf("Mint: %v", err)
	}
	return p
}

// eventually polls cond every millisecond until it holds or 10 s pass.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func reasonOf(err error) broker.Reason {
	r, _ := broker.RefusalReason(err)
	return r
}

var (
	podIP   = netip.MustParseAddr("10.1.2.3")
	otherIP = netip.MustParseAddr("10.1.2.4")
)

// TestResolve mints grants into a real bucket and resolves their placeholders through a cache
// watching it: the right request gets the real value, each wrong one the refusal that names
// what is wrong.
func TestResolve(t *testing.T) {
	_, kv := grantsBucket(t)
	sealer := newSealer(t)
	st := newStore(t, kv, sealer, 100)
	c := startCache(t, kv, sealer)

	bound := mint(t, st, mintReq("company-a", "lease-1", podIP))
	unbound := mint(t, st, mintReq("company-a", "lease-2", netip.Addr{}))
	released := mint(t, st, mintReq("company-a", "lease-3", podIP))
	if n, err := st.Release(t.Context(), "company-a", "lease-3"); err != nil || n != 1 {
		t.Fatalf("Release: %d, %v; want 1 grant deleted", n, err)
	}
	eventually(t, "the cache to hold the two live grants", func() bool { return c.Len() == 2 })

	wrongSecret := bound.Reveal()[:broker.PlaceholderLen-43] + base64.RawURLEncoding.EncodeToString(make([]byte, 32))
	var otherID [16]byte
	unknownID := broker.PlaceholderPrefix + base64.RawURLEncoding.EncodeToString(otherID[:]) + bound.Reveal()[len(broker.PlaceholderPrefix)+22:]
	for _, tc := range []struct {
		name        string
		placeholder string
		host        string
		header      broker.Header
		peer        netip.Addr
		want        broker.Reason // "" : resolves
	}{
		{name: "bound grant from its pod", placeholder: bound.Reveal(), host: "api.anthropic.com", header: broker.HeaderXAPIKey, peer: podIP},
		{name: "IPv4-mapped peer", placeholder: bound.Reveal(), host: "api.anthropic.com", header: broker.HeaderAuthorization, peer: netip.AddrFrom16(podIP.As16())},
		{name: "unbound grant", placeholder: unbound.Reveal(), host: "api.anthropic.com", header: broker.HeaderXAPIKey, peer: podIP, want: broker.ReasonUnbound},
		{name: "unbound grant from another pod", placeholder: unbound.Reveal(), host: "api.anthropic.com", header: broker.HeaderXAPIKey, peer: otherIP, want: broker.ReasonUnbound},
		{name: "unbound grant to another bound host", placeholder: unbound.Reveal(), host: "api.openai.com", header: broker.HeaderXAPIKey, peer: podIP, want: broker.ReasonWrongHost},
		{name: "another pod", placeholder: bound.Reveal(), host: "api.anthropic.com", header: broker.HeaderXAPIKey, peer: otherIP, want: broker.ReasonWrongPeer},
		{name: "another bound host", placeholder: bound.Reveal(), host: "api.openai.com", header: broker.HeaderXAPIKey, peer: podIP, want: broker.ReasonWrongHost},
		{name: "a header the binding does not allow", placeholder: bound.Reveal(), host: "api.anthropic.com", header: broker.HeaderGoogAPIKey, peer: podIP, want: broker.ReasonWrongHeader},
		{name: "released", placeholder: released.Reveal(), host: "api.anthropic.com", header: broker.HeaderXAPIKey, peer: podIP, want: broker.ReasonReleased},
		{name: "wrong secret", placeholder: wrongSecret, host: "api.anthropic.com", header: broker.HeaderXAPIKey, peer: podIP, want: broker.ReasonUnknown},
		{name: "unknown id", placeholder: unknownID, host: "api.anthropic.com", header: broker.HeaderXAPIKey, peer: podIP, want: broker.ReasonUnknown},
		{name: "malformed", placeholder: bound.Reveal()[:40], host: "api.anthropic.com", header: broker.HeaderXAPIKey, peer: podIP, want: broker.ReasonMalformed},
		{name: "a real key", placeholder: realValue, host: "api.anthropic.com", header: broker.HeaderXAPIKey, peer: podIP, want: broker.ReasonMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := c.Resolve(tc.placeholder, tc.host, tc.header, tc.peer)
			if tc.want != "" {
				if reasonOf(err) != tc.want {
					t.Fatalf("Resolve: %v, want refusal %q", err, tc.want)
				}
				if strings.Contains(err.Error(), realValue) || strings.Contains(err.Error(), tc.placeholder) {
					t.Fatalf("the refusal quotes a secret: %v", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			if got.Value.Reveal() != realValue || got.Grant.Company != "company-a" || got.Grant.Key != "ANTHROPIC_API_KEY" {
				t.Fatalf("Resolve = grant %+v, value ok %v", got.Grant, got.Value.Reveal() == realValue)
			}
		})
	}
}

func TestPlaceholderText(t *testing.T) {
	_, kv := grantsBucket(t)
	st := newStore(t, kv, newSealer(t), 10)
	p, g, err := st.Mint(t.Context(), mintReq("company-a", "lease-1", netip.Addr{}))
	if err != nil {
		t.Fatal(err)
	}
	text := p.Reveal()
	if len(text) != broker.PlaceholderLen || !strings.HasPrefix(text, "kcph_") || p.ID() != g.ID {
		t.Fatalf("placeholder %d bytes, id %s (grant %s); want %d bytes starting kcph_", len(text), p.ID(), g.ID, broker.PlaceholderLen)
	}
	back, err := broker.ParsePlaceholder(text)
	if err != nil || back != p {
		t.Fatalf("ParsePlaceholder(Reveal()) = %v, %v; want the placeholder back", back, err)
	}
	secret := text[len(text)-43:]
	for _, s := range []string{p.String(), g.ID.String()} {
		if strings.Contains(s, secret) {
			t.Errorf("%q shows the placeholder's secret part", s)
		}
	}
	for _, bad := range []string{"", "kcph_", text + "A", text[:len(text)-1], "xxxx" + text[4:], text[:27] + "-" + text[28:], text[:len(text)-1] + "!"} {
		if _, err := broker.ParsePlaceholder(bad); reasonOf(err) != broker.ReasonMalformed {
			t.Errorf("ParsePlaceholder(%q): %v, want malformed", bad, err)
		}
	}
}

// TestStoredGrantHoldsNoSecret reads the bucket as anyone with NATS access could: neither the
// real value nor the placeholder's secret part is there, in any encoding.
func TestStoredGrantHoldsNoSecret(t *testing.T) {
	_, kv := grantsBucket(t)
	st := newStore(t, kv, newSealer(t), 10)
	p := mint(t, st, mintReq("company-a", "lease-1", podIP))
	keys, err := kv.Keys(t.Context())
	if err != nil || len(keys) != 1 {
		t.Fatalf("Keys: %v, %v", keys, err)
	}
	e, err := kv.Get(t.Context(), keys[0])
	if err != nil {
		t.Fatal(err)
	}
	stored := string(e.Value()) + keys[0]
	secret := p.Reveal()[len(p.Reveal())-43:]
	for what, s := range map[string]string{
		"the value": realValue, "the value in base64": base64.StdEncoding.EncodeToString([]byte(realValue))[:40],
		"the placeholder": p.Reveal(), "its secret part": secret,
	} {
		if strings.Contains(stored, s) {
			t.Errorf("the stored grant holds %s", what)
		}
	}
	if want := "company-a.lease-1." + p.ID().String(); keys[0] != want {
		t.Errorf("key %q, want %q", keys[0], want)
	}
}

// TestReleaseStopsEveryReplicaWithinASecond runs two replicas' caches on one bucket, each on
// its own connection, and releases a lease through one replica's store: the other replica
// refuses the placeholder within a second (the bound). It measures the time from the
// release's start to the other cache's first refusal, several times.
func TestReleaseStopsEveryReplicaWithinASecond(t *testing.T) {
	srv, kvA := grantsBucket(t)
	_, jsB := natstest.Connect(t, srv)
	kvB, err := jsB.KeyValue(t.Context(), broker.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	sealer := newSealer(t)
	storeA := newStore(t, kvA, sealer, 100)
	cacheA, cacheB := startCache(t, kvA, sealer), startCache(t, kvB, sealer)

	const rounds = 20
	var took []time.Duration
	for i := range rounds {
		lease := "lease-" + string(rune('a'+i))
		p := mint(t, storeA, mintReq("company-a", lease, podIP))
		for _, c := range []*broker.Cache{cacheA, cacheB} {
			eventually(t, "both caches to resolve the new grant", func() bool {
				_, err := c.Resolve(p.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, podIP)
				return err == nil
			})
		}
		start := time.Now()
		if n, err := storeA.Release(t.Context(), "company-a", lease); err != nil || n != 1 {
			t.Fatalf("Release: %d, %v", n, err)
		}
		for {
			_, err := cacheB.Resolve(p.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, podIP)
			if reasonOf(err) == broker.ReasonReleased {
				break
			}
			if err != nil {
				t.Fatalf("replica B: %v, want released", err)
			}
			if time.Since(start) > time.Second {
				t.Fatalf("replica B still resolves a grant released %s ago", time.Since(start))
			}
			time.Sleep(100 * time.Microsecond)
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	t.Logf("release → other replica refuses (%d rounds): min %s  median %s  max %s", rounds, took[0], took[rounds/2], took[rounds-1])
}

// TestCacheLoadsWhatItMissed starts a replica after grants were minted and released: it
// resolves the live grant from the bucket's initial values and refuses the released one as
// released (its marker is still there), as a restarted broker does.
func TestCacheLoadsWhatItMissed(t *testing.T) {
	_, kv := grantsBucket(t)
	sealer := newSealer(t)
	st := newStore(t, kv, sealer, 10)
	live := mint(t, st, mintReq("company-a", "lease-1", podIP))
	gone := mint(t, st, mintReq("company-a", "lease-2", podIP))
	if _, err := st.Release(t.Context(), "company-a", "lease-2"); err != nil {
		t.Fatal(err)
	}
	c := startCache(t, kv, sealer)
	if _, err := c.Resolve(live.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, podIP); err != nil {
		t.Errorf("the live grant: %v", err)
	}
	if _, err := c.Resolve(gone.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, podIP); reasonOf(err) != broker.ReasonReleased {
		t.Errorf("the released grant: %v, want released", err)
	}
}

// TestCacheFailsClosed: a cache that has not loaded, or whose watch ended, refuses as
// unavailable rather than answering from what it last knew; one whose sealing key is not the
// minting broker's refuses as unavailable too.
func TestCacheFailsClosed(t *testing.T) {
	_, kv := grantsBucket(t)
	sealer := newSealer(t)
	st := newStore(t, kv, sealer, 10)
	p := mint(t, st, mintReq("company-a", "lease-1", podIP))

	c, err := broker.NewCache(broker.CacheOptions{KV: kv, Sealer: sealer})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resolve(p.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, podIP); reasonOf(err) != broker.ReasonUnavailable {
		t.Errorf("before Run: %v, want unavailable", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	<-c.Ready()
	if _, err := c.Resolve(p.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, podIP); err != nil {
		t.Errorf("while running: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := c.Resolve(p.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, podIP); reasonOf(err) != broker.ReasonUnavailable {
		t.Errorf("after Run: %v, want unavailable", err)
	}

	foreign := startCache(t, kv, newSealer(t))
	if _, err := foreign.Resolve(p.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, podIP); reasonOf(err) != broker.ReasonUnavailable {
		t.Errorf("another sealing key: %v, want unavailable", err)
	}
}

func TestGrantsPerCompanyQuota(t *testing.T) {
	_, kv := grantsBucket(t)
	st := newStore(t, kv, newSealer(t), 3)
	for i := range 3 {
		mint(t, st, mintReq("company-a", "lease-"+string(rune('1'+i)), netip.Addr{}))
	}
	_, _, err := st.Mint(t.Context(), mintReq("company-a", "lease-4", netip.Addr{}))
	var qe *broker.QuotaError
	if !errors.As(err, &qe) || qe.Company != "company-a" || qe.Held != 3 || qe.Quota != 3 {
		t.Fatalf("the 4th grant: %v, want a QuotaError for company-a holding 3 of 3", err)
	}
	if !strings.Contains(err.Error(), `"company-a"`) || !strings.Contains(err.Error(), "GrantsPerCompany") {
		t.Errorf("the error does not name the company and the setting: %v", err)
	}
	mint(t, st, mintReq("company-b", "lease-1", netip.Addr{})) // another company is not held back
	if _, err := st.Release(t.Context(), "company-a", "lease-1"); err != nil {
		t.Fatal(err)
	}
	mint(t, st, mintReq("company-a", "lease-4", netip.Addr{})) // a release frees its place
}

// TestReleaseDeletesOnlyTheLease: a lease's release deletes its grants (every key) and no other
// lease's, not even one whose id starts like it, nor another company's of the same lease id.
func TestReleaseDeletesOnlyTheLease(t *testing.T) {
	_, kv := grantsBucket(t)
	sealer := newSealer(t)
	st := newStore(t, kv, sealer, 10)
	c := startCache(t, kv, sealer)
	openai := mintReq("company-a", "lease-1", podIP)
	openai.Key, openai.Binding = "OPENAI_API_KEY", broker.Binding{Hosts: []string{"api.openai.com"}, Headers: []broker.Header{broker.HeaderAuthorization}}
	gone := []broker.Placeholder{mint(t, st, mintReq("company-a", "lease-1", podIP)), mint(t, st, openai)}
	kept := []broker.Placeholder{mint(t, st, mintReq("company-a", "lease-10", podIP)), mint(t, st, mintReq("company-b", "lease-1", podIP))}
	n, err := st.Release(t.Context(), "company-a", "lease-1")
	if err != nil || n != 2 {
		t.Fatalf("Release: %d, %v; want 2", n, err)
	}
	eventually(t, "the cache to drop the lease's grants", func() bool { return c.Len() == 2 })
	for _, p := range kept {
		if _, err := c.Resolve(p.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, podIP); err != nil {
			t.Errorf("another lease's grant: %v", err)
		}
	}
	if _, err := c.Resolve(gone[1].Reveal(), "api.openai.com", broker.HeaderAuthorization, podIP); reasonOf(err) != broker.ReasonReleased {
		t.Errorf("the lease's second grant: %v, want released", err)
	}
	if n, err := st.Release(t.Context(), "company-a", "lease-1"); err != nil || n != 0 {
		t.Errorf("a repeated release: %d, %v; want 0, nil", n, err)
	}
}

func TestBindPeer(t *testing.T) {
	_, kv := grantsBucket(t)
	sealer := newSealer(t)
	st := newStore(t, kv, sealer, 10)
	c := startCache(t, kv, sealer)
	p := mint(t, st, mintReq("company-a", "lease-1", netip.Addr{}))
	if n, err := st.BindPeer(t.Context(), "company-a", "lease-1", podIP); err != nil || n != 1 {
		t.Fatalf("BindPeer: %d, %v", n, err)
	}
	eventually(t, "the cache to see the binding", func() bool {
		_, err := c.Resolve(p.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, otherIP)
		return reasonOf(err) == broker.ReasonWrongPeer
	})
	if _, err := c.Resolve(p.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, podIP); err != nil {
		t.Errorf("from the bound pod: %v", err)
	}
	if _, err := st.Release(t.Context(), "company-a", "lease-1"); err != nil {
		t.Fatal(err)
	}
	if n, err := st.BindPeer(t.Context(), "company-a", "lease-1", otherIP); err != nil || n != 0 {
		t.Errorf("binding a released lease: %d, %v; want 0, nil", n, err)
	}
}

func TestMintValidates(t *testing.T) {
	_, kv := grantsBucket(t)
	st := newStore(t, kv, newSealer(t), 10)
	ok := mintReq("company-a", "lease-1", netip.Addr{})
	for _, tc := range []struct {
		name   string
		change func(*broker.MintRequest)
		want   string
	}{
		{"company not a token", func(r *broker.MintRequest) { r.Company = "a.b" }, "company"},
		{"no run", func(r *broker.MintRequest) { r.Run = "" }, "run"},
		{"lease with a wildcard", func(r *broker.MintRequest) { r.Lease = "l*" }, "lease"},
		{"key not an env name", func(r *broker.MintRequest) { r.Key = "1KEY" }, "key"},
		{"empty value", func(r *broker.MintRequest) { r.Value = "" }, "value"},
		{"value with a newline", func(r *broker.MintRequest) { r.Value = realValue + "\r\nX-Evil: 1" }, "value"},
		{"value too long", func(r *broker.MintRequest) { r.Value = strings.Repeat("k", broker.MaxValueBytes+1) }, "value"},
		{"a placeholder as the value", func(r *broker.MintRequest) { r.Value = "kcph_" + realValue }, "value"},
		{"no hosts", func(r *broker.MintRequest) { r.Binding.Hosts = nil }, "binding.hosts"},
		{"an IP as host", func(r *broker.MintRequest) { r.Binding.Hosts = []string{"10.0.0.1"} }, "binding.hosts"},
		{"unknown header", func(r *broker.MintRequest) { r.Binding.Headers = []broker.Header{"cookie"} }, "binding.headers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			r.Binding = broker.Binding{Hosts: slices.Clone(ok.Binding.Hosts), Headers: slices.Clone(ok.Binding.Headers)}
			tc.change(&r)
			_, _, err := st.Mint(t.Context(), r)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Mint: %v, want an error naming %s", err, tc.want)
			}
			if strings.Contains(err.Error(), realValue) {
				t.Fatalf("the error quotes the value: %v", err)
			}
		})
	}
}

func TestLoadSealingKey(t *testing.T) {
	dir := t.TempDir()
	good, short := filepath.Join(dir, "key"), filepath.Join(dir, "short")
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, key, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(short, append(key[:31:31], '\n', '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := broker.LoadSealingKey(good); err != nil {
		t.Errorf("a 32-byte key: %v", err)
	}
	_, err := broker.LoadSealingKey(short)
	if err == nil || !strings.Contains(err.Error(), short) || !strings.Contains(err.Error(), "got 33") {
		t.Errorf("a 33-byte key: %v, want an error naming the path and the length", err)
	}
	if _, err := broker.LoadSealingKey(filepath.Join(dir, "absent")); err == nil {
		t.Error("a missing key file: no error")
	}
}

func TestRefusalsAnswerWithAStatusAndAMessage(t *testing.T) {
	seen := map[int]bool{}
	for _, r := range broker.Reasons() {
		if st := r.Status(); st < 400 || st == 500 {
			t.Errorf("%s: status %d, want its own 4xx or 503", r, st)
		}
		seen[r.Status()] = true
		if m := r.Message(); !strings.HasPrefix(m, "kubeclip broker: ") || strings.Contains(m, "refused (") {
			t.Errorf("%s: message %q is not from the table", r, m)
		}
	}
	if broker.Reason("nonsense").Status() != 500 {
		t.Error("a reason outside the table does not answer 500")
	}
}

// TestBucketConfig pins the bucket's settings the package comments argue for.
func TestBucketConfig(t *testing.T) {
	cfg := broker.BucketOptions{}.Config()
	if cfg.Bucket != "KUBECLIP_GRANTS" || cfg.History != 1 || cfg.Storage != jetstream.FileStorage || cfg.TTL != 7*24*time.Hour || cfg.LimitMarkerTTL != time.Hour {
		t.Errorf("config %+v: want KUBECLIP_GRANTS, history 1, file storage, TTL 7 days, markers kept an hour", cfg)
	}
	if want := int64(8<<30) / 1000 * 10; cfg.MaxBytes != want {
		t.Errorf("MaxBytes %d, want 10‰ of the default 8 GiB store, %d", cfg.MaxBytes, want)
	}
	if q := (broker.BucketOptions{}).GrantQuota(); q != 1747 {
		t.Errorf("default GrantQuota %d, want 1747 (85,899,340 bytes / 4 companies / 12 KiB)", q)
	}
	if err := (broker.BucketOptions{}).CheckGrantQuota("--grants-per-company", 1748); err == nil || !strings.Contains(err.Error(), "--grants-per-company") {
		t.Errorf("CheckGrantQuota over the fit: %v, want an error naming the flag", err)
	}
	if err := (broker.BucketOptions{}).CheckGrantQuota("--grants-per-company", 1000); err != nil {
		t.Errorf("CheckGrantQuota within the fit: %v", err)
	}
}

// TestExpiredGrantStopsResolving: a grant whose release never came expires with the bucket's
// TTL (a lease's longest life; a second here), and the server's expiry marker reaches the
// watching caches like a release does.
func TestExpiredGrantStopsResolving(t *testing.T) {
	_, _, js := natstest.Start(t)
	opts := testBucketOptions
	opts.GrantTTL = time.Second
	kv, err := js.CreateKeyValue(t.Context(), opts.Config())
	if err != nil {
		t.Fatal(err)
	}
	sealer := newSealer(t)
	st := newStore(t, kv, sealer, 10)
	c := startCache(t, kv, sealer)
	p := mint(t, st, mintReq("company-a", "lease-1", podIP))
	start := time.Now()
	eventually(t, "the grant to expire", func() bool {
		_, err := c.Resolve(p.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, podIP)
		return reasonOf(err) == broker.ReasonReleased
	})
	t.Logf("a grant with a 1 s TTL stopped resolving %s after its mint", time.Since(start))
}

// TestRepeatedMintAtFullQuota: a repeated mint adds no grant, so a company at its quota still
// gets its lease's placeholder again; and a mint under another sealing key cannot take over a
// grant it cannot open.
func TestRepeatedMintAtFullQuota(t *testing.T) {
	_, kv := grantsBucket(t)
	sealer := newSealer(t)
	st := newStore(t, kv, sealer, 2)
	first := mint(t, st, mintReq("company-a", "lease-1", netip.Addr{}))
	mint(t, st, mintReq("company-a", "lease-2", netip.Addr{}))
	again, g, err := st.Mint(t.Context(), mintReq("company-a", "lease-1", netip.Addr{}))
	if err != nil || again.Reveal() != first.Reveal() || g.ID != first.ID() {
		t.Fatalf("the repeated mint at a full quota: grant %s, %v; want the first placeholder", g.ID, err)
	}
	foreign := newStore(t, kv, newSealer(t), 2)
	if _, _, err := foreign.Mint(t.Context(), mintReq("company-a", "lease-1", netip.Addr{})); err == nil {
		// Another sealing key derives other grant ids: it makes its own grant, and the quota
		// refuses it.
		t.Fatal("a store under another sealing key minted past the quota")
	}
}
