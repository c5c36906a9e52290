package broker_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/pkg/broker"
)

// resolveAsync runs ResolveWait for an unbound grant's placeholder from peer in the
// background; the answer comes with how long it took.
type waited struct {
	res  broker.Resolved
	err  error
	took time.Duration
	at   time.Time // when it was answered
}

func resolveAsync(ctx context.Context, c *broker.Cache, wait time.Duration, p broker.Placeholder, peer netip.Addr) <-chan waited {
	out := make(chan waited, 1)
	go func() {
		start := time.Now()
		res, err := c.ResolveWait(ctx, wait, p.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, peer)
		out <- waited{res, err, time.Since(start), time.Now()}
	}()
	return out
}

// TestResolveWaitForTheBinding: a grant bound to no pod yet resolves from no address at once;
// a request that comes first waits for the binding, and is then answered against the pod it
// names: its pod's request gets the value, another address's is refused wrong_peer. A request
// whose binding does not come within its wait is refused unbound, after the wait and not before;
// one whose client goes away returns at once; one whose grant is released meanwhile is refused
// released.
func TestResolveWaitForTheBinding(t *testing.T) {
	ctx := t.Context()
	_, kv := grantsBucket(t)
	sealer := newSealer(t)
	st := newStore(t, kv, sealer, 100)
	c := startCache(t, kv, sealer)

	p := mint(t, st, mintReq("company-a", "lease-1", netip.Addr{}))
	eventually(t, "the cache to hold the grant", func() bool { return c.Len() == 1 })
	if _, err := c.Resolve(p.Reveal(), "api.anthropic.com", broker.HeaderXAPIKey, podIP); reasonOf(err) != broker.ReasonUnbound {
		t.Fatalf("an unbound grant from its future pod, without waiting: %v; want refused unbound", err)
	}

	t.Run("bound while waiting", func(t *testing.T) {
		fromPod := resolveAsync(ctx, c, 10*time.Second, p, podIP)
		fromOther := resolveAsync(ctx, c, 10*time.Second, p, otherIP)
		// Both are waiting: neither answered before the binding.
		time.Sleep(50 * time.Millisecond)
		select {
		case w := <-fromPod:
			t.Fatalf("the pod's request answered before the binding: %v", w.err)
		case w := <-fromOther:
			t.Fatalf("another address's request answered before the binding: %v", w.err)
		default:
		}
		bindAt := time.Now()
		if n, err := st.BindRun(ctx, "company-a", "run-lease-1", podIP); err != nil || n != 1 {
			t.Fatalf("BindRun: %d, %v; want 1", n, err)
		}
		pod, other := <-fromPod, <-fromOther
		if pod.err != nil || pod.res.Value.Reveal() != realValue {
			t.Errorf("the pod's request after the binding: %v (value ok %v)", pod.err, pod.res.Value.Reveal() == realValue)
		}
		if reasonOf(other.err) != broker.ReasonWrongPeer {
			t.Errorf("another address's request after the binding: %v; want wrong_peer", other.err)
		}
		t.Logf("bind_start_to_answer_pod\t%v\tbind_start_to_answer_other\t%v\twaited_pod\t%v\twaited_other\t%v",
			pod.at.Sub(bindAt).Round(time.Microsecond), other.at.Sub(bindAt).Round(time.Microsecond), pod.took.Round(time.Microsecond), other.took.Round(time.Microsecond))
	})

	q := mint(t, st, mintReq("company-a", "lease-2", netip.Addr{}))
	eventually(t, "the cache to hold the second grant", func() bool { return c.Len() == 2 })

	t.Run("never bound", func(t *testing.T) {
		const wait = 300 * time.Millisecond
		w := <-resolveAsync(ctx, c, wait, q, podIP)
		if reasonOf(w.err) != broker.ReasonUnbound {
			t.Fatalf("a grant never bound: %v; want refused unbound", w.err)
		}
		if w.took < wait {
			t.Errorf("refused after %v, before its wait of %v", w.took, wait)
		}
		t.Logf("unbound_refused_after\t%v\twait\t%v", w.took.Round(time.Microsecond), wait)
	})

	t.Run("client gone", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		ch := resolveAsync(cctx, c, time.Minute, q, podIP)
		time.Sleep(20 * time.Millisecond)
		cancel()
		select {
		case w := <-ch:
			if reasonOf(w.err) != broker.ReasonUnbound {
				t.Errorf("a request whose client went away: %v; want refused unbound", w.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a request whose client went away still waits")
		}
	})

	t.Run("released while waiting", func(t *testing.T) {
		ch := resolveAsync(ctx, c, time.Minute, q, podIP)
		time.Sleep(20 * time.Millisecond)
		if n, err := st.Release(ctx, "company-a", "lease-2"); err != nil || n != 1 {
			t.Fatalf("Release: %d, %v", n, err)
		}
		select {
		case w := <-ch:
			if reasonOf(w.err) != broker.ReasonReleased {
				t.Errorf("a request whose grant was released while it waited: %v; want released", w.err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a request whose grant was released still waits")
		}
	})
}
