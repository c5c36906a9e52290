package broker_test

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/broker"
)

// TestBindRun: a run's grants minted before its pod was known are bound by BindRun, a grant
// minted after it is born bound, a redelivered bind is harmless, the remembered peer takes no
// place of the company's quota, and the run's release forgets it (a later mint is unbound).
func TestBindRun(t *testing.T) {
	ctx := t.Context()
	_, kv := grantsBucket(t)
	sealer := newSealer(t)
	const quota = 2
	st := newStore(t, kv, sealer, quota)
	c := startCache(t, kv, sealer)

	// The dispatcher's mint, before the pod exists: unbound.
	before := mint(t, st, mintReq("company-a", "lease-1", netip.Addr{}))
	for range 2 { // the status event, then its redelivery
		if n, err := st.BindRun(ctx, "company-a", "run-lease-1", podIP); err != nil || n != 1 {
			t.Fatalf("BindRun: %d, %v; want 1 grant bound", n, err)
		}
	}
	// The plugin's mint at an execute, after the bind: another key of the same run's lease.
	r := mintReq("company-a", "lease-1", netip.Addr{})
	r.Key = "OPENAI_API_KEY"
	after, g, err := st.Mint(ctx, r)
	if err != nil {
		t.Fatalf("Mint after the bind (quota %d, one grant held): %v", quota, err)
	}
	if g.Peer != podIP {
		t.Errorf("a grant minted after its run's bind has peer %v, want %v", g.Peer, podIP)
	}
	for name, p := range map[string]broker.Placeholder{"minted before the bind": before, "minted after it": after} {
		eventually(t, "the cache to see "+name+" bound", func() bool {
			_, err := c.Resolve(p.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, otherIP)
			return reasonOf(err) == broker.ReasonWrongPeer
		})
		if _, err := c.Resolve(p.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, podIP); err != nil {
			t.Errorf("%s, from its pod: %v", name, err)
		}
	}
	// Another run's grants are not bound by this run's pod.
	other := mint(t, st, mintReq("company-b", "lease-9", netip.Addr{}))
	if _, err := st.BindRun(ctx, "company-a", "run-lease-9", podIP); err != nil {
		t.Fatal(err)
	}
	var err2 error
	eventually(t, "the cache to hold the other company's grant", func() bool {
		_, err2 = c.Resolve(other.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, otherIP)
		return reasonOf(err2) != broker.ReasonUnknown
	})
	if reasonOf(err2) != broker.ReasonUnbound {
		t.Errorf("another company's grant after a bind of a run of the same id: %v; want it still unbound", err2)
	}
	// The company holds its quota in grants: the remembered peers count for nothing.
	r.Key = "GEMINI_API_KEY"
	var qe *broker.QuotaError
	if _, _, err := st.Mint(ctx, r); !errors.As(err, &qe) || qe.Held != quota {
		t.Errorf("a third grant: %v; want the quota refused with %d held", err, quota)
	}

	if n, err := st.ReleaseRun(ctx, "company-a", "run-lease-1"); err != nil || n != 2 {
		t.Fatalf("ReleaseRun: %d, %v; want 2", n, err)
	}
	_, g, err = st.Mint(ctx, mintReq("company-a", "lease-1", netip.Addr{}))
	if err != nil {
		t.Fatal(err)
	}
	if g.Peer.IsValid() {
		t.Errorf("a grant minted after its run's release has peer %v: the remembered peer outlived the run", g.Peer)
	}
	if _, err := st.BindRun(ctx, "company-a", "run-lease-1", netip.Addr{}); err == nil {
		t.Error("BindRun without an address: no error")
	}
}
