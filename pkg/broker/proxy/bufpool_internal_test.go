package proxy

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/pkg/broker"
)

type noResolver struct{}

func (noResolver) ResolveWait(context.Context, time.Duration, string, string, broker.Header, netip.Addr) (broker.Resolved, error) {
	return broker.Resolved{}, &broker.RefusedError{Reason: broker.ReasonUnknown}
}

// TestBufferPool pins the ReverseProxy's copy buffers: pooled, of copyBufferSize, and a buffer
// of another size is not taken back. Streaming with the pool is TestProxyStreamsServerSentEvents's.
func TestBufferPool(t *testing.T) {
	p, err := New(Options{Routes: []Route{{Host: "api.anthropic.com"}}, Resolver: noResolver{}})
	if err != nil {
		t.Fatal(err)
	}
	pool, ok := p.rp.BufferPool.(*bufferPool)
	if !ok {
		t.Fatalf("the ReverseProxy's BufferPool is %T, want *bufferPool", p.rp.BufferPool)
	}
	b := pool.Get()
	if len(b) != copyBufferSize || cap(b) != copyBufferSize {
		t.Fatalf("a buffer of len %d cap %d, want %d", len(b), cap(b), copyBufferSize)
	}
	pool.Put(b[:10]) // as the ReverseProxy never does, a resliced buffer: taken back whole
	pool.Put(make([]byte, 4<<10))
	for range 100 {
		if b := pool.Get(); len(b) != copyBufferSize {
			t.Fatalf("the pool lent a buffer of %d bytes, want %d", len(b), copyBufferSize)
		}
	}
}
