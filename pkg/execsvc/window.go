package execsvc

import (
	"context"
	"errors"
	"sync"
	"time"
)

// errClientGone ends a session whose client stopped acknowledging output.
var errClientGone = errors.New("the client stopped acknowledging output")

// window is a session's flow control: the output sent beyond the client's last ack.
type window struct {
	mu      sync.Mutex
	acked   uint64
	sent    []sentChunk
	bytes   int
	changed chan struct{} // closed and replaced on every ack
}

type sentChunk struct {
	seq uint64
	n   int
}

// newWindow starts with everything up to acked acknowledged: an attach from seq k holds k-1.
func newWindow(acked uint64) *window {
	return &window{acked: acked, changed: make(chan struct{})}
}

// ack records that the client holds every seq up to seq.
func (w *window) ack(seq uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if seq <= w.acked {
		return
	}
	w.acked = seq
	i := 0
	for i < len(w.sent) && w.sent[i].seq <= seq {
		w.bytes -= w.sent[i].n
		i++
	}
	w.sent = w.sent[i:]
	close(w.changed)
	w.changed = make(chan struct{})
}

// add records a chunk sent.
func (w *window) add(seq uint64, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.sent = append(w.sent, sentChunk{seq: seq, n: n})
	w.bytes += n
}

// wait blocks until n more bytes fit under limit (a chunk always goes when nothing is
// outstanding). It gives up with errClientGone when no ack came for patience.
func (w *window) wait(ctx context.Context, n, limit int, patience time.Duration) error {
	timer := time.NewTimer(patience)
	defer timer.Stop()
	for {
		w.mu.Lock()
		fits := w.bytes == 0 || w.bytes+n <= limit
		changed := w.changed
		w.mu.Unlock()
		if fits {
			return nil
		}
		select {
		case <-changed:
			timer.Reset(patience)
		case <-timer.C:
			return errClientGone
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
