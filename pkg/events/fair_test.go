package events_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// workCompany is the test stream's QueueKey: work.<company>.<run>.
func workCompany(subject string) string {
	t := strings.Split(subject, ".")
	if len(t) != 3 {
		return ""
	}
	return t[1]
}

// floodRecorder is a handler that takes a millisecond per message (a Kubernetes round trip's
// stand-in) and records, for company b's message, how many of company a's were handled before.
type floodRecorder struct {
	mu        sync.Mutex
	calls     map[string]int
	handledA  int
	aBeforeB  int
	bHandled  time.Time
	bHandledC chan struct{}
}

func newFloodRecorder() *floodRecorder {
	return &floodRecorder{calls: map[string]int{}, aBeforeB: -1, bHandledC: make(chan struct{})}
}

func (r *floodRecorder) handle(ctx context.Context, m jetstream.Msg) error {
	select {
	case <-time.After(time.Millisecond):
	case <-ctx.Done():
		return ctx.Err()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls[m.Subject()]++
	switch workCompany(m.Subject()) {
	case "a":
		r.handledA++
	case "b":
		if r.aBeforeB < 0 {
			r.aBeforeB, r.bHandled = r.handledA, time.Now()
			close(r.bHandledC)
		}
	}
	return nil
}

func (r *floodRecorder) state() (handledA int, calls map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := make(map[string]int, len(r.calls))
	for k, v := range r.calls {
		c[k] = v
	}
	return r.handledA, c
}

// TestFirstAttemptsAreServedPerCompany is issue 26 item 15 at the consume loop: company a
// publishes thousands of new requests, then company b one; with QueueKey, b's is handled while
// at least 90 % of a's are still waiting (before, in stream order, it was handled last). a's
// messages wait longer than the consumer's AckWait and are still handled exactly once (held
// messages get InProgress); stopping hands the held ones back unstarted, and another Consume
// handles each of them once.
func TestFirstAttemptsAreServedPerCompany(t *testing.T) {
	const flood = 3000
	f := newWorkFixture(t, func(c *jetstream.ConsumerConfig) {
		c.AckWait = time.Second // a's backlog takes longer than this to handle
		c.MaxAckPending = events.ConsumerMaxAckPending
	})
	ctx := t.Context()
	for i := range flood {
		if _, err := f.js.PublishAsync(fmt.Sprintf("work.a.r%d", i), []byte(`{"n":1}`)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-f.js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		t.Fatal("company a's requests were not all stored")
	}
	published := time.Now()
	if _, err := f.js.Publish(ctx, "work.b.r0", []byte(`{"n":1}`)); err != nil {
		t.Fatal(err)
	}

	rec := newFloodRecorder()
	opts := events.ConsumeOptions{Logger: testLogger(t).Level(1), Concurrency: 1, QueueKey: workCompany}
	stop := startConsume(t, f.cons, rec.handle, opts)
	select {
	case <-rec.bHandledC:
	case <-time.After(2 * time.Minute):
		t.Fatal("company b's request was not handled")
	}
	rec.mu.Lock()
	aBeforeB, bDelay := rec.aBeforeB, rec.bHandled.Sub(published)
	rec.mu.Unlock()
	t.Logf("company b's request handled after %s, behind %d of company a's %d", bDelay, aBeforeB, flood)
	if aBeforeB > flood/10 {
		t.Errorf("company b's request was handled after %d of company a's %d, want while at least 90%% were pending", aBeforeB, flood)
	}

	// Let a's backlog wait past the ack deadline, then stop with messages still held.
	// Half of them take at least 1.5 s (a millisecond each, one at a time): the rest were held
	// longer than the 1 s ack deadline.
	eventually(t, "half of company a's requests handled", func() bool {
		handled, _ := rec.state()
		return handled >= flood/2
	})
	if err := stop(); err != nil {
		t.Fatalf("Consume: %v", err)
	}
	if handled, _ := rec.state(); handled >= flood {
		t.Fatalf("all %d of company a's requests were handled before the stop; the test needs some held", flood)
	}

	// Another Consume (in stream order) handles what was handed back.
	startConsume(t, f.cons, rec.handle, events.ConsumeOptions{Logger: opts.Logger, Concurrency: 8})
	eventually(t, "every request handled", f.settledAll(t, flood+1))
	_, calls := rec.state()
	if len(calls) != flood+1 {
		t.Errorf("%d distinct requests handled, want %d", len(calls), flood+1)
	}
	for subj, n := range calls {
		if n != 1 {
			t.Errorf("%s handled %d times, want once (a held message was redelivered while it waited)", subj, n)
		}
	}
}

// TestFairQueuesAreBounded: with every handler slot busy, Consume holds at most QueueLimit
// messages, and no more payload than QueueBytes allows (one message over at most); the rest
// stay on the consumer, unpulled.
func TestFairQueuesAreBounded(t *testing.T) {
	const total = 100
	tests := []struct {
		name     string
		opts     events.ConsumeOptions
		wantHeld int
	}{
		{name: "by count", opts: events.ConsumeOptions{QueueLimit: 10}, wantHeld: 10},
		// 7-byte payloads, messages of at most 10 bytes: pulls shrink as the 50 bytes fill
		// (5, then 2, then one at a time) and stop once 8 are held (56 bytes, one over).
		{name: "by bytes", opts: events.ConsumeOptions{QueueBytes: 50, MaxMsgSize: 10}, wantHeld: 8},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newWorkFixture(t, func(c *jetstream.ConsumerConfig) { c.MaxAckPending = total })
			f.publish(t, total)
			release := make(chan struct{})
			opts := tc.opts
			opts.Logger, opts.Concurrency, opts.QueueKey = testLogger(t).Level(1), 1, workCompany
			stop := startConsume(t, f.cons, func(ctx context.Context, _ jetstream.Msg) error {
				select {
				case <-release:
				case <-ctx.Done():
				}
				return nil
			}, opts)
			want := tc.wantHeld + 1 // and the one being handled
			eventually(t, "the queues filled", func() bool { return f.info(t).NumAckPending >= want })
			if info := f.info(t); info.NumAckPending != want || info.NumPending != uint64(total-want) {
				t.Errorf("%d pulled and %d left on the consumer, want %d and %d", info.NumAckPending, info.NumPending, want, total-want)
			}
			close(release)
			eventually(t, "every message handled", f.settledAll(t, total))
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}
