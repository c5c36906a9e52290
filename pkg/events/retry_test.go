package events_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestRetriesWaitOutsideTheConsumer is issue 15 item 19 at the consume loop: messages whose
// handler keeps failing retryably, more of them than the consumer's MaxAckPending, wait for
// their backoff in the retry queue, not on the consumer, so a new message is handled at once
// instead of after the backoff. The retries still reach the handler on their own subject, with
// every attempt counted from the first delivery, and fail for good after MaxDeliver attempts.
func TestRetriesWaitOutsideTheConsumer(t *testing.T) {
	const (
		failing    = 5
		maxDeliver = 3
		backoff    = 4 * time.Second
	)
	f := newWorkFixture(t, func(c *jetstream.ConsumerConfig) {
		c.MaxDeliver = maxDeliver
		c.MaxAckPending = 2 // fewer than the failing messages
	})
	ctx := t.Context()
	if _, err := f.js.CreateStream(ctx, events.RetryStreamConfig(1, 0)); err != nil {
		t.Fatal(err)
	}
	retryCfg := events.RetryConsumerConfig(testConsumer)
	retryCfg.MaxDeliver = maxDeliver // as in production: both consumers' MaxDeliver is ConsumerMaxDeliver
	retryCons, err := f.js.CreateOrUpdateConsumer(ctx, events.RetryStream, retryCfg)
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	calls := map[string]int{}
	handled := make(chan string, 16)
	h := func(_ context.Context, m jetstream.Msg) error {
		mu.Lock()
		calls[m.Subject()]++
		mu.Unlock()
		if strings.HasPrefix(m.Subject(), "work.bad.") {
			return errors.New("the API server answered 503")
		}
		handled <- m.Subject()
		return nil
	}
	var terms terminalRecorder
	var termSubjects sync.Map
	queue := &events.RetryQueue{Publisher: f.js, Name: testConsumer}
	opts := events.ConsumeOptions{
		Logger:  testLogger(t),
		Backoff: func(uint64) time.Duration { return backoff },
		Retries: queue,
		OnTerminal: func(ctx context.Context, m jetstream.Msg, te *events.TerminalError) error {
			termSubjects.Store(m.Subject(), true)
			return terms.onTerminal(ctx, m, te)
		},
	}
	startConsume(t, f.cons, h, opts)
	startConsume(t, retryCons, h, opts)

	for i := range failing {
		if _, err := f.js.Publish(ctx, fmt.Sprintf("work.bad.r%d", i), []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "every failing message tried once and moved", func() bool {
		mu.Lock()
		defer mu.Unlock()
		info := f.info(t)
		return len(calls) == failing && info.NumAckPending == 0 && info.NumPending == 0
	})

	start := time.Now()
	if _, err := f.js.Publish(ctx, "work.good.r1", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	select {
	case subj := <-handled:
		if took := time.Since(start); took > backoff/2 {
			t.Errorf("%s handled after %s, behind the retries' %s backoff", subj, took, backoff)
		}
	case <-time.After(3 * backoff):
		t.Fatal("a new message was not handled while retries waited")
	}

	eventually(t, "the failing messages terminated", func() bool { return len(terms.got()) == failing })
	mu.Lock()
	for i := range failing {
		subj := fmt.Sprintf("work.bad.r%d", i)
		if calls[subj] != maxDeliver {
			t.Errorf("%s handled %d times, want %d (MaxDeliver, counted across the queue)", subj, calls[subj], maxDeliver)
		}
		if _, ok := termSubjects.Load(subj); !ok {
			t.Errorf("%s was not reported terminal on its own subject", subj)
		}
	}
	mu.Unlock()
	for _, te := range terms.got() {
		if te.Code != events.CodeInternal {
			t.Errorf("terminal code %s, want internal", te.Code)
		}
	}
	eventually(t, "the retry queue empty", func() bool {
		s, err := f.js.Stream(ctx, events.RetryStream)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})
}

// TestRetryHeadersAreHonouredOnlyOnRetrySubjects: a request that carries retry headers on its
// own subject (a client forging an attempt count) is an ordinary first attempt.
func TestRetryHeadersAreHonouredOnlyOnRetrySubjects(t *testing.T) {
	f := newWorkFixture(t, nil)
	ctx := t.Context()
	if _, err := f.js.CreateStream(ctx, events.RetryStreamConfig(1, 0)); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	h := func(_ context.Context, m jetstream.Msg) error {
		got <- m.Subject()
		return nil
	}
	startConsume(t, f.cons, h, events.ConsumeOptions{Logger: testLogger(t), Retries: &events.RetryQueue{Publisher: f.js, Name: testConsumer}})
	msg := nats.NewMsg("work.c1.r1")
	msg.Header.Set(events.HeaderRetryAttempt, "99")
	msg.Header.Set(events.HeaderRetryAt, time.Now().Add(time.Hour).Format(time.RFC3339Nano))
	if _, err := f.js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	select {
	case subj := <-got:
		if subj != "work.c1.r1" {
			t.Errorf("handler saw subject %q, want work.c1.r1", subj)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a message with forged retry headers was not handled as a first attempt")
	}
}
