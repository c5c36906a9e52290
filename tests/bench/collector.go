package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// collector reads every run event with one ordered consumer (new events only) and records when
// the bench received each run's created, ready, terminal status, result and released events and
// each of its log lines. It also subscribes (core NATS) to the internal dispatch subjects, to see when the
// tenant-worker handed each run to the dispatcher.
type collector struct {
	mu      sync.Mutex
	runs    map[string]*runEvents
	changed chan struct{} // closed and replaced whenever a run changes
	done    chan struct{}
	err     error
	// skipLogs holds runs whose log events are not decoded or recorded: (h)'s synthetic runs,
	// whose 100k events would otherwise cost the bench a decode each while it sets them up.
	skipLogs map[string]bool
	// answers are the answers of reusable leases ((n)) to the requests that named themselves:
	// a lease is released and resumed many times under its one run id.
	answers map[answerKey]answer
}

// answerKey names the answer to one request of a reusable lease.
type answerKey struct {
	runID string
	kind  events.RunKind
	// id is the request's releaseId or resumeId; a destroy's released names none.
	id string
}

// answer is when an answer arrived and, for a resumed, what the resume found.
type answer struct {
	at   time.Time
	from events.ResumedFrom
}

// runEvents is what the bench received of one run; times are receive times.
type runEvents struct {
	dispatched time.Time
	created    time.Time
	// lease and namespace are the created event's providerLeaseId and namespace.
	lease, namespace string
	// warm is the created event's warm: the lease bound a warm pod of its company's pool.
	warm bool
	// ready is the first status Running/Ready: an exec-capable lease's pod accepts exec.
	ready time.Time
	// released is the released event (release or destroy done: commands and pod gone).
	released time.Time
	// ended is the first status event saying Succeeded or Failed: the run-watcher decided the
	// run is over and is reading the log's tail before it publishes the result.
	ended   time.Time
	result  time.Time
	outcome events.Outcome
	failed  string
	// lines maps a log line (timestamp and text, as the kubelet sent them) to when the event
	// carrying it arrived.
	lines map[logKey]time.Time
}

// logKey identifies a log line of a run.
type logKey struct {
	ts   string
	text string
}

// errRunFailed is wrapped by waits for a run that answered with a failed event.
var errRunFailed = errors.New("run failed")

// startCollector creates the consumer, so events published after it returns are seen, and
// reads it until ctx is done.
func startCollector(ctx context.Context, js jetstream.JetStream, s events.Subjects) (*collector, error) {
	cons, err := js.OrderedConsumer(ctx, s.RunStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{s.RunAll()},
		DeliverPolicy:  jetstream.DeliverNewPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("creating the run event consumer: %w", err)
	}
	it, err := cons.Messages()
	if err != nil {
		return nil, fmt.Errorf("reading run events: %w", err)
	}
	c := newCollector()
	sub, err := js.Conn().Subscribe(events.DispatchAll(), c.recordDispatch)
	if err != nil {
		it.Stop()
		return nil, fmt.Errorf("subscribing to %s: %w", events.DispatchAll(), err)
	}
	go func() {
		defer close(c.done)
		defer it.Stop()
		err := c.read(ctx, it, s)
		if uerr := sub.Unsubscribe(); uerr != nil && !errors.Is(uerr, nats.ErrConnectionClosed) {
			err = errors.Join(err, fmt.Errorf("unsubscribing from dispatch subjects: %w", uerr))
		}
		c.finish(err)
	}()
	return c, nil
}

// newCollector is a collector that has received nothing yet.
func newCollector() *collector {
	return &collector{
		runs: map[string]*runEvents{}, changed: make(chan struct{}), done: make(chan struct{}),
		skipLogs: map[string]bool{}, answers: map[answerKey]answer{},
	}
}

// recordDispatch notes when a run's dispatch request went by.
func (c *collector) recordDispatch(m *nats.Msg) {
	at := time.Now()
	_, runID, err := events.ParseDispatchSubject(m.Subject)
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	setOnce(&c.runLocked(runID).dispatched, at)
}

func (c *collector) read(ctx context.Context, it jetstream.MessagesContext, s events.Subjects) error {
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		now := time.Now()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("reading run events: %w", err)
		}
		if c.skipped(s, m.Subject()) {
			continue
		}
		ev, err := s.DecodeRunEvent(m.Subject(), m.Data())
		if err != nil {
			continue // not the bench's business: the contract tests cover decoding
		}
		c.record(ev, now)
	}
}

// skipLogsOf makes the collector pass over runID's log events without decoding them; its other
// events are still recorded.
func (c *collector) skipLogsOf(runID string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.skipLogs[runID] = true
}

func (c *collector) skipped(s events.Subjects, subject string) bool {
	_, runID, kind, err := s.ParseRunSubject(subject)
	if err != nil || kind != events.KindLog {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.skipLogs[runID]
}

// finish stores why reading stopped and wakes every waiter.
func (c *collector) finish(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.err = err
	close(c.changed)
	c.changed = make(chan struct{})
}

// wait returns once reading stopped (ctx of startCollector done).
func (c *collector) wait() error {
	<-c.done
	return c.err
}

func (c *collector) record(ev events.Event, at time.Time) {
	_, runID := ev.IDs()
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.runLocked(runID)
	switch e := ev.(type) {
	case events.RunCreatedEvent:
		setOnce(&r.created, at)
		r.lease, r.namespace, r.warm = e.ProviderLeaseID, e.Namespace, e.Warm
	case events.RunStatusEvent:
		if e.Phase == events.PhaseSucceeded || e.Phase == events.PhaseFailed {
			setOnce(&r.ended, at)
		}
		if e.Phase == events.PhaseRunning && e.Reason == events.ReasonReady {
			setOnce(&r.ready, at)
		}
	case events.RunReleasedEvent:
		setOnce(&r.released, at)
		c.answerLocked(answerKey{runID, events.KindReleased, e.ReleaseID}, answer{at: at})
	case events.RunResumedEvent:
		c.answerLocked(answerKey{runID, events.KindResumed, e.ResumeID}, answer{at: at, from: e.From})
	case events.RunResultEvent:
		setOnce(&r.result, at)
		r.outcome = e.Outcome
	case events.RunFailedEvent:
		r.failed = fmt.Sprintf("%s: %s", e.Code, e.Message)
	case events.RunLogEvent:
		for _, l := range e.Lines {
			k := logKey{ts: l.TS, text: l.Text}
			if _, ok := r.lines[k]; !ok && !l.Partial {
				r.lines[k] = at
			}
		}
	default:
		return
	}
	close(c.changed)
	c.changed = make(chan struct{})
}

func (c *collector) runLocked(runID string) *runEvents {
	r, ok := c.runs[runID]
	if !ok {
		r = &runEvents{lines: map[logKey]time.Time{}}
		c.runs[runID] = r
	}
	return r
}

// answerLocked records the first answer to key's request.
func (c *collector) answerLocked(key answerKey, a answer) {
	if _, ok := c.answers[key]; !ok {
		c.answers[key] = a
	}
}

func setOnce(t *time.Time, v time.Time) {
	if t.IsZero() {
		*t = v
	}
}

// waitFor blocks until done holds for runID's events, the run failed, reading stopped, or ctx
// ends. done runs with the collector locked and must not block.
func (c *collector) waitFor(ctx context.Context, runID string, done func(*runEvents) bool) (runEvents, error) {
	for {
		c.mu.Lock()
		r := c.runLocked(runID)
		snapshot, ok, failed, readErr := *r, done(r), r.failed, c.err
		snapshot.lines = nil // guarded by mu: use lines()
		changed := c.changed
		c.mu.Unlock()
		switch {
		case ok:
			return snapshot, nil
		case failed != "":
			return snapshot, fmt.Errorf("run %s: %w: %s", runID, errRunFailed, failed)
		case readErr != nil:
			return snapshot, readErr
		}
		select {
		case <-ctx.Done():
			return snapshot, fmt.Errorf("waiting for run %s: %w", runID, context.Cause(ctx))
		case <-changed:
		}
	}
}

// created waits for the run's created event and returns when it arrived.
func (c *collector) created(ctx context.Context, runID string) (time.Time, error) {
	r, err := c.waitFor(ctx, runID, func(r *runEvents) bool { return !r.created.IsZero() })
	return r.created, err
}

// createdEvent waits for the run's created event and returns what was received of the run.
func (c *collector) createdEvent(ctx context.Context, runID string) (runEvents, error) {
	return c.waitFor(ctx, runID, func(r *runEvents) bool { return !r.created.IsZero() })
}

// ready waits for the run's status Running/Ready event (an exec-capable lease's pod accepts
// exec) and returns when it arrived.
func (c *collector) ready(ctx context.Context, runID string) (time.Time, error) {
	r, err := c.waitFor(ctx, runID, func(r *runEvents) bool { return !r.ready.IsZero() })
	return r.ready, err
}

// released waits for the run's released event.
func (c *collector) released(ctx context.Context, runID string) error {
	_, err := c.waitFor(ctx, runID, func(r *runEvents) bool { return !r.released.IsZero() })
	return err
}

// answer waits for the answer to a request of a reusable lease that named itself (key.id:
// its releaseId or resumeId; "" for a destroy's released), or its failed event.
func (c *collector) answer(ctx context.Context, key answerKey) (answer, error) {
	var got answer
	_, err := c.waitFor(ctx, key.runID, func(*runEvents) bool {
		a, ok := c.answers[key] // waitFor holds c.mu
		got = a
		return ok
	})
	return got, err
}

// result waits for the run's result event.
func (c *collector) result(ctx context.Context, runID string) (runEvents, error) {
	return c.waitFor(ctx, runID, func(r *runEvents) bool { return !r.result.IsZero() })
}

// snapshot returns what was received of runID so far, without its lines.
func (c *collector) snapshot(runID string) runEvents {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := *c.runLocked(runID)
	r.lines = nil
	return r
}

// lines returns a copy of the run's log lines and their receive times.
func (c *collector) lines(runID string) map[logKey]time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[logKey]time.Time, len(c.runLocked(runID).lines))
	for k, v := range c.runLocked(runID).lines {
		out[k] = v
	}
	return out
}

// countCreated waits until every run in ids has its created or failed event and returns the
// last created time, how many were created and how many failed.
func (c *collector) countCreated(ctx context.Context, ids []string) (last time.Time, created, failed int, err error) {
	for {
		c.mu.Lock()
		last, created, failed = time.Time{}, 0, 0
		for _, id := range ids {
			r := c.runLocked(id)
			switch {
			case !r.created.IsZero():
				created++
				if r.created.After(last) {
					last = r.created
				}
			case r.failed != "":
				failed++
			}
		}
		changed, readErr := c.changed, c.err
		c.mu.Unlock()
		if created+failed == len(ids) {
			return last, created, failed, nil
		}
		if readErr != nil {
			return last, created, failed, readErr
		}
		select {
		case <-ctx.Done():
			return last, created, failed, fmt.Errorf("waiting for %d created events (%d so far): %w", len(ids), created, context.Cause(ctx))
		case <-changed:
		}
	}
}
