package meter

import (
	"io"
	"sync"
)

// Body wraps a response body so that every byte read from it is also written to m, and calls
// done once with m's result when the body ends: at EOF, at a read error (the upstream went
// away: Complete is false), or at Close before either (the agent went away). Install it in
// httputil.ReverseProxy.ModifyResponse as resp.Body = meter.Body(resp.Body, meter.ForResponse(resp), report).
//
// The bytes read are returned as the underlying body returned them. Body deliberately does not
// implement io.WriterTo, so a copy cannot bypass Read. Read and Close may be called from
// different goroutines; done is called without any lock held.
func Body(body io.ReadCloser, m *Meter, done func(Usage)) io.ReadCloser {
	return &meteredBody{rc: body, m: m, done: done}
}

type meteredBody struct {
	rc   io.ReadCloser
	done func(Usage)

	mu       sync.Mutex
	m        *Meter
	finished bool
}

func (b *meteredBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.mu.Lock()
	if n > 0 && !b.finished {
		_, _ = b.m.Write(p[:n]) // never fails
	}
	b.mu.Unlock()
	if err != nil {
		b.finish()
	}
	return n, err
}

func (b *meteredBody) Close() error {
	err := b.rc.Close()
	b.finish()
	return err
}

func (b *meteredBody) finish() {
	b.mu.Lock()
	if b.finished {
		b.mu.Unlock()
		return
	}
	b.finished = true
	u := b.m.Result()
	b.mu.Unlock()
	if b.done != nil {
		b.done(u)
	}
}
