package proxy

import (
	"net/http/httputil"
	"sync"
)

// copyBufferSize is the size of the buffers the ReverseProxy copies response bodies through,
// a quarter of its own default (32 KiB). A call holds its buffer for as long as its body
// streams, so a held SSE stream holds one: at 8 KiB the broker's heap in use per open stream
// fell from 71–73 KiB to 47–49 KiB at 1,000 open streams (KUBECLIP_BENCH_PHASES=p make bench; docs/performance.md).
// A read fills at most one buffer before the write and flush that follow, so an SSE event
// (well under 8 KiB) reaches the agent as soon as it is read; a large JSON body takes more,
// smaller writes.
const copyBufferSize = 8 << 10

// bufferPool lends the ReverseProxy its copy buffers. Without one, every call allocates a new
// 32 KiB buffer for its body and leaves it to the collector; pooled, a buffer returns when its
// call's body is copied and the next call reuses it. Open streams still hold one each: the pool
// saves the allocation per call, the smaller size the memory of a stream in flight.
type bufferPool struct{ pool sync.Pool }

var _ httputil.BufferPool = (*bufferPool)(nil)

func newBufferPool() *bufferPool {
	return &bufferPool{pool: sync.Pool{New: func() any { b := make([]byte, copyBufferSize); return &b }}}
}

func (p *bufferPool) Get() []byte { return *p.pool.Get().(*[]byte) }

// Put takes back a buffer of the pool's size only, so the pool holds no other.
func (p *bufferPool) Put(b []byte) {
	if cap(b) != copyBufferSize {
		return
	}
	b = b[:copyBufferSize]
	p.pool.Put(&b)
}
