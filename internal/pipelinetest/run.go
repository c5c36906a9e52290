package pipelinetest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// Run is one acquired run under test, with the events collected for it so far.
type Run struct {
	t   *testing.T
	env *Env

	CompanyID string
	AgentID   string
	RunID     string

	mu     sync.Mutex
	events []events.Received
	cond   chan struct{} // closed and replaced whenever an event arrives
}

// NewRun returns the handle of a fresh run of companyID/agentID without publishing anything or
// collecting its events (see PublishAcquire and Collect).
func (e *Env) NewRun(t *testing.T, companyID, agentID string) *Run {
	return &Run{t: t, env: e, CompanyID: companyID, AgentID: agentID, RunID: NewID("run"), cond: make(chan struct{})}
}

// Acquire publishes an acquire for a fresh run of companyID/agentID and starts collecting its
// events until the test ends.
func (e *Env) Acquire(t *testing.T, companyID, agentID string, cfg json.RawMessage) *Run {
	t.Helper()
	r := e.NewRun(t, companyID, agentID)
	r.PublishAcquire(cfg, true)
	r.Collect()
	return r
}

// Request is the run's acquire request.
func (r *Run) Request(cfg json.RawMessage) events.AcquireRequest {
	return events.AcquireRequest{
		RunID: r.RunID, CompanyID: r.CompanyID, EnvironmentID: "e2e", AgentID: r.AgentID, Config: cfg,
	}
}

// PublishAcquire publishes the run's acquire, through the Publisher (with its message id) or
// raw (no message id, so JetStream cannot deduplicate it).
func (r *Run) PublishAcquire(cfg json.RawMessage, withMsgID bool) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := r.Request(cfg)
	if withMsgID {
		pub, _ := events.NewPublisher(events.PublisherOptions{JS: r.env.JS, Subjects: r.env.Subjects})
		if _, err := pub.Publish(ctx, req); err != nil {
			r.t.Fatalf("publishing acquire: %v", err)
		}
		return
	}
	subj, _ := r.env.Subjects.Lease(r.CompanyID, events.LeaseAcquire)
	data, _ := json.Marshal(req)
	if _, err := r.env.JS.Publish(ctx, subj, data); err != nil {
		r.t.Fatalf("publishing acquire: %v", err)
	}
}

// Release publishes a release (or destroy) of the run's lease.
func (r *Run) Release(lease string, destroy bool) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pub, _ := events.NewPublisher(events.PublisherOptions{JS: r.env.JS, Subjects: r.env.Subjects})
	req := events.ReleaseRequest{RunID: r.RunID, CompanyID: r.CompanyID, ProviderLeaseID: lease, Destroy: destroy}
	if _, err := pub.Publish(ctx, req); err != nil {
		r.t.Fatalf("publishing release: %v", err)
	}
}

// Collect follows the run's events in the background until the test ends. A follow cut short
// (NATS restarted under it) resumes after the last event it delivered.
func (r *Run) Collect() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	r.t.Cleanup(func() {
		cancel()
		<-done
	})
	go func() {
		defer close(done)
		var next uint64
		for ctx.Err() == nil {
			_ = events.Follow(ctx, r.env.JS, r.env.Subjects, r.CompanyID, r.RunID, events.FollowOptions{StartSeq: next}, func(rec events.Received) error {
				if rec.StreamSeq != 0 && rec.StreamSeq < next {
					return nil // delivered before the follow restarted
				}
				next = rec.StreamSeq + 1
				r.mu.Lock()
				r.events = append(r.events, rec)
				close(r.cond)
				r.cond = make(chan struct{})
				r.mu.Unlock()
				return nil
			})
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
}

// Events returns the events collected so far, in stream order.
func (r *Run) Events() []events.Received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]events.Received(nil), r.events...)
}

// WaitFor waits until pred holds for the events so far and returns them; it fails the test
// after timeout.
func (r *Run) WaitFor(timeout time.Duration, what string, pred func([]events.Received) bool) []events.Received {
	r.t.Helper()
	evs, ok := r.Await(timeout, pred)
	if !ok {
		r.t.Fatalf("run %s: no %s within %s; events so far:\n%s", r.RunID, what, timeout, Describe(evs))
	}
	return evs
}

// Await waits until pred holds for the events so far, or timeout passes, and returns them and
// whether pred held. It never fails the test.
func (r *Run) Await(timeout time.Duration, pred func([]events.Received) bool) ([]events.Received, bool) {
	deadline := time.After(timeout)
	for {
		r.mu.Lock()
		evs := append([]events.Received(nil), r.events...)
		cond := r.cond
		r.mu.Unlock()
		if pred(evs) {
			return evs, true
		}
		select {
		case <-cond:
		case <-deadline:
			return evs, false
		}
	}
}

// Has is a WaitFor predicate: an event of type T arrived.
func Has[T events.Event](evs []events.Received) bool {
	for _, e := range evs {
		if _, ok := e.Event.(T); ok {
			return true
		}
	}
	return false
}

// WaitKind waits for the run's first event of type T and returns it.
func WaitKind[T events.Event](r *Run, timeout time.Duration) T {
	r.t.Helper()
	var zero T
	evs := r.WaitFor(timeout, fmt.Sprintf("%T event", zero), Has[T])
	for _, e := range evs {
		if v, ok := e.Event.(T); ok {
			return v
		}
	}
	return zero
}

// All returns every event of type T received so far.
func All[T events.Event](r *Run) []T {
	return Only[T](r.Events())
}

// Only returns the events of type T among evs.
func Only[T events.Event](evs []events.Received) []T {
	var out []T
	for _, e := range evs {
		if v, ok := e.Event.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// ReceivedAt returns when the stream stored the run's first event matching pred.
func (r *Run) ReceivedAt(t *testing.T, pred func(events.Event) bool) time.Time {
	t.Helper()
	for _, e := range r.Events() {
		if pred(e.Event) {
			return e.Published
		}
	}
	t.Fatalf("run %s: no matching event", r.RunID)
	return time.Time{}
}

// AssertResultLast checks that exactly one result was published and no log chunk after it.
func (r *Run) AssertResultLast(t *testing.T) {
	t.Helper()
	results, lastLog, resultAt := 0, -1, -1
	for i, e := range r.Events() {
		switch e.Event.(type) {
		case events.RunResultEvent:
			results++
			resultAt = i
		case events.RunLogEvent:
			lastLog = i
		}
	}
	if results != 1 {
		t.Errorf("%d result events, want exactly 1", results)
	}
	if lastLog > resultAt {
		t.Errorf("a log chunk (event %d) came after the result (event %d)", lastLog, resultAt)
	}
}

// Describe renders events for a failure message, one line each, payloads cut at 300 bytes.
func Describe(evs []events.Received) string {
	var b strings.Builder
	for _, e := range evs {
		data, _ := json.Marshal(e.Event)
		if len(data) > 300 {
			data = append(data[:300], "..."...)
		}
		fmt.Fprintf(&b, "  #%d %T %s\n", e.StreamSeq, e.Event, data)
	}
	return b.String()
}
