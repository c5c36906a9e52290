package events

import (
	"context"
	"sync"
	"time"
)

// First attempts are served per company. A consumer delivers in stream order, so without more a
// company that publishes thousands of requests at once is ahead of every later company's first
// request until each of them has been handled (issue 26 item 15: 10,000 acquires delayed another
// company's first by 58 s to 1 min 55 s). With ConsumeOptions.QueueKey, Consume pulls ahead of
// its handlers into one in-memory queue per company, bounded in total (QueueLimit messages,
// QueueBytes of payload), and starts the next message from the next company in turn: a company
// alone gets every handler slot (work-conserving), and companies that compete share them evenly
// (max-min fair). A held message is still pending on the consumer, kept from its ack deadline by
// InProgress, and handed back unstarted on shutdown (never acked).
//
// The same queues serve the retry consumer (RetryConsumerConfig), so retries are shared out per
// company too: one mechanism, whichever consumer a request waits on.

// Fair-queue defaults.
const (
	// DefaultQueueBytes bounds the payload bytes Consume holds ahead of its handlers. A worker
	// runs two consumers (first attempts and retries) in a 256 MiB pod; 32 MiB each holds ten
	// thousand acquires of a few KiB, or 32 of the largest (1 MiB).
	DefaultQueueBytes = 32 << 20
	// fairFetchBatch is the most messages one pull asks for while the queues have room.
	fairFetchBatch = 256
)

// CompanyKey is the usual QueueKey: the company a request's subject names (lease requests, run
// events, dispatches; "" for any other subject, which then share one queue).
func CompanyKey(subject string) string {
	companyID, _ := MsgIDs(subject)
	return companyID
}

// fairQueue holds pulled messages, one FIFO per key, and hands them out one key at a time.
type fairQueue struct {
	mu     sync.Mutex
	queues map[string][]*delivery
	// order is the keys that hold messages, in turn order; next is the index of the next turn.
	order []string
	next  int
	held  int
	bytes int
	// room is signalled (never blocking) when a message leaves; ready when one arrives.
	room, ready chan struct{}
}

func newFairQueue() *fairQueue {
	return &fairQueue{queues: map[string][]*delivery{}, room: make(chan struct{}, 1), ready: make(chan struct{}, 1)}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// push adds d to key's queue; a key that held nothing takes its turn after the keys waiting.
func (q *fairQueue) push(key string, d *delivery) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.queues[key]) == 0 {
		q.order = append(q.order, key)
	}
	q.queues[key] = append(q.queues[key], d)
	q.held++
	q.bytes += len(d.m.Data())
	signal(q.ready)
}

// pop takes the oldest message of the key whose turn it is, or nil when nothing is held.
func (q *fairQueue) pop() *delivery {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.order) == 0 {
		return nil
	}
	q.next %= len(q.order)
	key := q.order[q.next]
	ds := q.queues[key]
	d := ds[0]
	ds[0] = nil
	if ds = ds[1:]; len(ds) == 0 {
		delete(q.queues, key)
		q.order = append(q.order[:q.next], q.order[q.next+1:]...)
	} else {
		q.queues[key] = ds
		q.next++
	}
	q.held--
	q.bytes -= len(d.m.Data())
	signal(q.room)
	return d
}

// free is how many more messages may be pulled: none once either bound is reached, and no more
// than the bytes left hold of messages of maxMsg bytes (at least one), so a pull overshoots
// maxBytes by one message at most.
func (q *fairQueue) free(limit, maxBytes, maxMsg int) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.bytes >= maxBytes {
		return 0
	}
	return max(min(limit-q.held, max((maxBytes-q.bytes)/maxMsg, 1)), 0)
}

// drain empties the queues and returns what they held.
func (q *fairQueue) drain() []*delivery {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []*delivery
	for _, key := range q.order {
		out = append(out, q.queues[key]...)
	}
	q.queues, q.order, q.next, q.held, q.bytes = map[string][]*delivery{}, nil, 0, 0, 0
	return out
}

// heldSince lists the messages held since before t.
func (q *fairQueue) heldSince(t time.Time) []*delivery {
	q.mu.Lock()
	defer q.mu.Unlock()
	var out []*delivery
	for _, ds := range q.queues {
		for _, d := range ds {
			if d.pulled.Before(t) {
				out = append(out, d)
			}
		}
	}
	return out
}

// pullFair is Consume's pull loop with QueueKey set: a fetcher fills the per-key queues while
// they have room, and each free handler slot starts the next key's oldest message. It returns
// the error that stopped pulling, after handing back (unstarted) every message still held.
func (l *consumeLoop) pullFair(ctx context.Context, start func(*delivery), slots chan struct{}) error {
	q := newFairQueue()
	pullCtx, stopPull := context.WithCancel(ctx)
	defer stopPull()
	var stopErr error
	var bg sync.WaitGroup
	bg.Add(2)
	go func() {
		defer bg.Done()
		defer stopPull()
		stopErr = l.fillQueues(pullCtx, q)
	}()
	go func() {
		defer bg.Done()
		l.keepHeldAlive(pullCtx, q)
	}()

serve:
	for {
		select {
		case slots <- struct{}{}:
		case <-pullCtx.Done():
			break serve
		}
		d := q.pop()
		for d == nil {
			select {
			case <-q.ready:
				d = q.pop()
			case <-pullCtx.Done():
				<-slots
				break serve
			}
		}
		start(d)
	}
	bg.Wait()
	// Held, never started: each goes back to the consumer at once (an immediate Nak, pullCtx
	// being done), for this or another replica, and its delivery does not count as an attempt
	// that failed.
	for _, d := range q.drain() {
		l.settle(pullCtx, d, errShutdown)
	}
	return stopErr
}

// fillQueues pulls into q while it has room, until ctx is done or pulling fails for good.
func (l *consumeLoop) fillQueues(ctx context.Context, q *fairQueue) error {
	for ctx.Err() == nil {
		n := min(q.free(l.opts.QueueLimit, l.opts.QueueBytes, l.opts.MaxMsgSize), fairFetchBatch)
		if n == 0 {
			select {
			case <-q.room:
			case <-ctx.Done():
			}
			continue
		}
		_, err := l.fetch(ctx, n, func(d *delivery) {
			d.pulled = time.Now()
			q.push(l.opts.QueueKey(d.m.Subject()), d)
		})
		if err := l.pullFailed(ctx, err); err != nil {
			return err
		}
	}
	return nil
}

// keepHeldAlive sends InProgress for every message held longer than KeepAliveInterval, every
// KeepAliveInterval, so none is redelivered while it waits for its turn.
func (l *consumeLoop) keepHeldAlive(ctx context.Context, q *fairQueue) {
	t := time.NewTicker(l.opts.KeepAliveInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			for _, d := range q.heldSince(now.Add(-l.opts.KeepAliveInterval)) {
				if err := d.m.InProgress(); err != nil {
					d.log.Warn().Err(err).Msg("extending the ack deadline of a held message failed; it may be redelivered")
				}
			}
		}
	}
}
