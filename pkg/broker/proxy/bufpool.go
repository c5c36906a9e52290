package proxy

import (
	"net/http/httputil"
	"sync"
)

// copyBufferSize is the size of the buffers the ReverseProxy copies response bodies through:
// its own default. A read fills at most one buffer before the write and flush that follow, so
// an SSE event reaches the agent as soon as it is read whatever the size; 32 KiB keeps a large
// JSON body to few reads.
const copyBufferSize = 32 << 10

// bufferPool lends the ReverseProxy its copy buffers. Without one, every call allocates a new
// 32 KiB buffer for its body and leaves it to the collector; pooled, a buffer returns when its
// call's body is copied and the next call reuses it. A call holds its buffer while its body
// streams, so open streams still hold one each: the pool saves the allocation per call, not
// the memory of a stream in flight.
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
