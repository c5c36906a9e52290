package events_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

const (
	testStream   = "WORK"
	testConsumer = "worker"
)

// workFixture is a stream with one durable consumer set up like the workers' (explicit acks,
// a small MaxDeliver) but with test-sized timings.
type workFixture struct {
	srv  *server.Server
	js   jetstream.JetStream
	cons jetstream.Consumer
}

func newWorkFixture(t *testing.T, mod func(*jetstream.ConsumerConfig)) *workFixture {
	t.Helper()
	s, _, js := natstest.Start(t)
	ctx := t.Context()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: testStream, Subjects: []string{"work.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	cfg := jetstream.ConsumerConfig{
		Durable:    testConsumer,
		AckPolicy:  jetstream.AckExplicitPolicy,
		AckWait:    5 * time.Second,
		MaxDeliver: 3,
	}
	if mod != nil {
		mod(&cfg)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, testStream, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &workFixture{srv: s, js: js, cons: cons}
}

func (f *workFixture) publish(t *testing.T, n int) {
	t.Helper()
	for i := range n {
		if _, err := f.js.Publish(t.Context(), fmt.Sprintf("work.c1.r%d", i), []byte(`{"n":1}`)); err != nil {
			t.Fatal(err)
		}
	}
}

func (f *workFixture) info(t *testing.T) *jetstream.ConsumerInfo {
	t.Helper()
	info, err := f.cons.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// settledAll reports that the consumer has nothing pending, in flight or left to redeliver.
func (f *workFixture) settledAll(t *testing.T, n uint64) func() bool {
	return func() bool {
		info := f.info(t)
		return info.AckFloor.Stream == n && info.NumAckPending == 0 && info.NumPending == 0 && info.NumRedelivered == 0
	}
}

// startConsume runs Consume until the returned stop is called; stop returns Consume's error.
func startConsume(t *testing.T, cons jetstream.Consumer, h events.Handler, opts events.ConsumeOptions) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- events.Consume(ctx, cons, h, opts) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(30 * time.Second):
				t.Fatalf("Consume did not return after cancellation")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func attempt(m jetstream.Msg) uint64 {
	meta, err := m.Metadata()
	if err != nil {
		return 0
	}
	return meta.NumDelivered
}

// terminalRecorder is an OnTerminal that remembers what it was told.
type terminalRecorder struct {
	mu    sync.Mutex
	errs  []*events.TerminalError
	fails int // fail this many calls first
}

func (r *terminalRecorder) onTerminal(_ context.Context, _ jetstream.Msg, err *events.TerminalError) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, err)
	if r.fails > 0 {
		r.fails--
		return errors.New("publishing failed event: no responders")
	}
	return nil
}

func (r *terminalRecorder) got() []*events.TerminalError {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]*events.TerminalError(nil), r.errs...)
}

func TestConsumeAcksSuccess(t *testing.T) {
	f := newWorkFixture(t, nil)
	f.publish(t, 5)
	var calls atomic.Int32
	rec := &terminalRecorder{}
	stop := startConsume(t, f.cons, func(ctx context.Context, m jetstream.Msg) error {
		calls.Add(1)
		return nil
	}, events.ConsumeOptions{Logger: testLogger(t), OnTerminal: rec.onTerminal})
	eventually(t, "all five messages acked", f.settledAll(t, 5))
	if err := stop(); err != nil {
		t.Errorf("Consume returned %v after a clean shutdown, want nil", err)
	}
	if calls.Load() != 5 || len(rec.got()) != 0 {
		t.Errorf("handler ran %d times and OnTerminal %d times, want 5 and 0", calls.Load(), len(rec.got()))
	}
}

func TestConsumeTermsTerminalErrors(t *testing.T) {
	f := newWorkFixture(t, nil)
	f.publish(t, 1)
	var calls atomic.Int32
	rec := &terminalRecorder{}
	stop := startConsume(t, f.cons, func(ctx context.Context, m jetstream.Msg) error {
		calls.Add(1)
		return fmt.Errorf("validating: %w", events.Terminalf(events.CodeInvalidConfig, "config.egressMode", "must be cilium or standard"))
	}, events.ConsumeOptions{Logger: testLogger(t), OnTerminal: rec.onTerminal})
	eventually(t, "the message termed", f.settledAll(t, 1))
	eventually(t, "OnTerminal called", func() bool { return len(rec.got()) == 1 })
	_ = stop()
	got := rec.got()
	if len(got) != 1 || got[0].Code != events.CodeInvalidConfig || got[0].Field != "config.egressMode" {
		t.Fatalf("OnTerminal got %v, want one invalid_config for config.egressMode", got)
	}
	if calls.Load() != 1 {
		t.Errorf("handler ran %d times, want 1: a terminal error must never be retried", calls.Load())
	}
	if info := f.info(t); info.Delivered.Stream != 1 || info.NumRedelivered != 0 {
		t.Errorf("consumer delivered %d (redelivered %d), want one delivery", info.Delivered.Consumer, info.NumRedelivered)
	}
}

func TestConsumeRetriesThenGivesUp(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		wantCode events.Code
	}{
		{"plain error fails as internal", errors.New("api server unreachable"), events.CodeInternal},
		{"retryable error keeps its code", &events.RetryableError{Code: events.CodeBackendUnavailable, Err: errors.New("api server unreachable")}, events.CodeBackendUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newWorkFixture(t, nil) // MaxDeliver 3
			f.publish(t, 1)
			const delay = 200 * time.Millisecond
			var mu sync.Mutex
			var attempts []uint64
			var times []time.Time
			rec := &terminalRecorder{}
			stop := startConsume(t, f.cons, func(ctx context.Context, m jetstream.Msg) error {
				mu.Lock()
				attempts = append(attempts, attempt(m))
				times = append(times, time.Now())
				mu.Unlock()
				return tc.err
			}, events.ConsumeOptions{
				Logger:     testLogger(t),
				OnTerminal: rec.onTerminal,
				Backoff:    func(uint64) time.Duration { return delay },
			})
			eventually(t, "OnTerminal after the last delivery", func() bool { return len(rec.got()) == 1 })
			eventually(t, "the message termed", func() bool {
				info := f.info(t)
				return info.AckFloor.Stream == 1 && info.NumAckPending == 0
			})
			_ = stop()

			mu.Lock()
			defer mu.Unlock()
			if diff := cmp.Diff([]uint64{1, 2, 3}, attempts); diff != "" {
				t.Errorf("deliveries (-want +got):\n%s", diff)
			}
			for i := 1; i < len(times); i++ {
				if gap := times[i].Sub(times[i-1]); gap < delay {
					t.Errorf("delivery %d came %s after the previous one, before the %s backoff", i+1, gap, delay)
				}
			}
			te := rec.got()[0]
			if te.Code != tc.wantCode || !strings.Contains(te.Error(), "giving up after 3 attempts: api server unreachable") {
				t.Errorf("OnTerminal got %q (%v), want code %q and the last error", te.Code, te, tc.wantCode)
			}
		})
	}
}

func TestConsumeRecoversPanics(t *testing.T) {
	f := newWorkFixture(t, nil)
	f.publish(t, 1)
	var attempts []uint64
	var mu sync.Mutex
	startConsume(t, f.cons, func(ctx context.Context, m jetstream.Msg) error {
		mu.Lock()
		attempts = append(attempts, attempt(m))
		mu.Unlock()
		if attempt(m) == 1 {
			panic("handler bug on the first delivery")
		}
		return nil
	}, events.ConsumeOptions{Logger: testLogger(t), Backoff: func(uint64) time.Duration { return 10 * time.Millisecond }})
	eventually(t, "the retried message acked", func() bool { return f.info(t).AckFloor.Stream == 1 })
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff([]uint64{1, 2}, attempts); diff != "" {
		t.Errorf("deliveries (-want +got):\n%s", diff)
	}
}

func TestConsumeRunsHandlersConcurrently(t *testing.T) {
	f := newWorkFixture(t, nil)
	const n = 4
	f.publish(t, n)
	var barrier sync.WaitGroup
	barrier.Add(n)
	startConsume(t, f.cons, func(ctx context.Context, m jetstream.Msg) error {
		barrier.Done()
		barrier.Wait() // returns only once all n handlers run at the same time
		return nil
	}, events.ConsumeOptions{Logger: testLogger(t), Concurrency: n})
	eventually(t, "all messages acked", f.settledAll(t, n))
}

func TestConsumeBoundsConcurrency(t *testing.T) {
	f := newWorkFixture(t, nil)
	f.publish(t, 6)
	var running, peak atomic.Int32
	startConsume(t, f.cons, func(ctx context.Context, m jetstream.Msg) error {
		now := running.Add(1)
		for {
			p := peak.Load()
			if now <= p || peak.CompareAndSwap(p, now) {
				break
			}
		}
		select {
		case <-time.After(20 * time.Millisecond): // the work
		case <-ctx.Done():
		}
		running.Add(-1)
		return nil
	}, events.ConsumeOptions{Logger: testLogger(t), Concurrency: 2})
	eventually(t, "all messages acked", f.settledAll(t, 6))
	if p := peak.Load(); p > 2 {
		t.Errorf("%d handlers ran at once, want at most 2", p)
	}
}

func TestConsumeDrainsInFlightHandlers(t *testing.T) {
	f := newWorkFixture(t, nil)
	f.publish(t, 1)
	started, release := make(chan struct{}), make(chan struct{})
	var finished atomic.Bool
	stop := startConsume(t, f.cons, func(ctx context.Context, m jetstream.Msg) error {
		close(started)
		<-release
		if ctx.Err() != nil {
			return ctx.Err() // the drain must not cancel a handler within the drain timeout
		}
		finished.Store(true)
		return nil
	}, events.ConsumeOptions{Logger: testLogger(t), DrainTimeout: 20 * time.Second})
	<-started
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	// Let the shutdown begin, then let the handler finish.
	time.AfterFunc(100*time.Millisecond, func() { close(release) })
	if err := <-stopped; err != nil {
		t.Fatalf("Consume returned %v, want nil after the in-flight handler finished", err)
	}
	if !finished.Load() {
		t.Fatal("Consume returned before its in-flight handler finished")
	}
	if info := f.info(t); info.AckFloor.Stream != 1 || info.NumAckPending != 0 {
		t.Errorf("the finished message was not acked: ack floor %d, pending %d", info.AckFloor.Stream, info.NumAckPending)
	}
}

func TestConsumeHandsUnfinishedWorkToAnotherInstance(t *testing.T) {
	f := newWorkFixture(t, nil)
	f.publish(t, 1)

	// Instance A: a handler that ignores cancellation and outlives the drain timeout.
	started, release, handlerADone := make(chan struct{}), make(chan struct{}), make(chan struct{})
	stopA := startConsume(t, f.cons, func(ctx context.Context, m jetstream.Msg) error {
		defer close(handlerADone)
		close(started)
		<-release
		return nil // too late: its message was handed back, this result must be ignored
	}, events.ConsumeOptions{Logger: testLogger(t).With().Str("instance", "A").Logger(), DrainTimeout: 200 * time.Millisecond})
	<-started
	if err := stopA(); !errors.Is(err, events.ErrDrainTimeout) {
		t.Fatalf("instance A returned %v, want ErrDrainTimeout", err)
	}

	// Instance B, on its own connection, gets the message A handed back.
	_, js2 := natstest.Connect(t, f.srv)
	consB, err := js2.Consumer(t.Context(), testStream, testConsumer)
	if err != nil {
		t.Fatal(err)
	}
	gotB := make(chan uint64, 1)
	startConsume(t, consB, func(ctx context.Context, m jetstream.Msg) error {
		gotB <- attempt(m)
		return nil
	}, events.ConsumeOptions{Logger: testLogger(t).With().Str("instance", "B").Logger()})
	select {
	case a := <-gotB:
		if a != 2 {
			t.Errorf("instance B got delivery %d, want 2", a)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the unfinished message was not redelivered to instance B")
	}
	eventually(t, "instance B acked the message", func() bool { return f.info(t).AckFloor.Stream == 1 })
	close(release)
	<-handlerADone
}

func TestConsumeKeepsLongHandlersAlive(t *testing.T) {
	f := newWorkFixture(t, func(c *jetstream.ConsumerConfig) { c.AckWait = time.Second })
	f.publish(t, 1)
	var calls atomic.Int32
	startConsume(t, f.cons, func(ctx context.Context, m jetstream.Msg) error {
		calls.Add(1)
		select {
		case <-time.After(2500 * time.Millisecond): // work longer than two ack deadlines
		case <-ctx.Done():
			return ctx.Err()
		}
		return nil
	}, events.ConsumeOptions{Logger: testLogger(t)})
	eventually(t, "the long message acked", f.settledAll(t, 1))
	if calls.Load() != 1 {
		t.Errorf("handler ran %d times, want 1: InProgress should have kept the message", calls.Load())
	}
}

func TestConsumeRejectsOversizedPayloads(t *testing.T) {
	f := newWorkFixture(t, nil)
	if _, err := f.js.Publish(t.Context(), "work.c1.r1", make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	rec := &terminalRecorder{}
	var calls atomic.Int32
	startConsume(t, f.cons, func(ctx context.Context, m jetstream.Msg) error {
		calls.Add(1)
		return nil
	}, events.ConsumeOptions{Logger: testLogger(t), OnTerminal: rec.onTerminal, MaxMsgSize: 16})
	eventually(t, "the oversized message termed", f.settledAll(t, 1))
	eventually(t, "OnTerminal called", func() bool { return len(rec.got()) == 1 })
	if te := rec.got()[0]; te.Code != events.CodeInvalidRequest || !strings.Contains(te.Error(), "100 bytes") {
		t.Errorf("OnTerminal got %v", te)
	}
	if calls.Load() != 0 {
		t.Errorf("the handler saw an oversized payload")
	}
}

func TestConsumeRetriesWhenReportingFails(t *testing.T) {
	f := newWorkFixture(t, nil)
	f.publish(t, 1)
	rec := &terminalRecorder{fails: 1}
	var calls atomic.Int32
	startConsume(t, f.cons, func(ctx context.Context, m jetstream.Msg) error {
		calls.Add(1)
		return events.InvalidRequest("agentId", "must not be empty")
	}, events.ConsumeOptions{Logger: testLogger(t), OnTerminal: rec.onTerminal, Backoff: func(uint64) time.Duration { return 10 * time.Millisecond }})
	eventually(t, "the failure reported", func() bool { return len(rec.got()) == 2 })
	eventually(t, "the message termed", func() bool {
		info := f.info(t)
		return info.AckFloor.Stream == 1 && info.NumAckPending == 0
	})
	if calls.Load() != 2 {
		t.Errorf("handler ran %d times, want 2 (once more after the report failed)", calls.Load())
	}
}

func TestConsumeRequiresBoundedRedelivery(t *testing.T) {
	f := newWorkFixture(t, func(c *jetstream.ConsumerConfig) { c.MaxDeliver = -1 })
	err := events.Consume(t.Context(), f.cons, func(context.Context, jetstream.Msg) error { return nil }, events.ConsumeOptions{})
	if err == nil || !strings.Contains(err.Error(), "MaxDeliver") {
		t.Errorf("Consume on an unbounded consumer = %v, want an error about MaxDeliver", err)
	}
}
