package events_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// observer records what it is told.
type observer struct {
	mu   sync.Mutex
	sets []events.Settlement
	pubs []events.Publication
}

func (o *observer) MessageSettled(s events.Settlement) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.sets = append(o.sets, s)
}

func (o *observer) EventPublished(p events.Publication) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.pubs = append(o.pubs, p)
}

func (o *observer) settlements() []events.Settlement {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]events.Settlement(nil), o.sets...)
}

var _ events.Observer = (*observer)(nil)

func TestConsumeReportsEveryFate(t *testing.T) {
	type fate struct {
		Attempt uint64
		Fate    events.Fate
		Code    events.Code
	}
	tests := []struct {
		name    string
		handler func(attempt uint64) error
		want    []fate
	}{
		{
			name:    "success",
			handler: func(uint64) error { return nil },
			want:    []fate{{1, events.FateAcked, ""}},
		},
		{
			name:    "terminal error",
			handler: func(uint64) error { return events.Terminalf(events.CodeInvalidConfig, "config.backend", "unknown") },
			want:    []fate{{1, events.FateTerminated, events.CodeInvalidConfig}},
		},
		{
			name: "retried, then acked",
			handler: func(a uint64) error {
				if a == 1 {
					return errors.New("api server unreachable")
				}
				return nil
			},
			want: []fate{{1, events.FateRetried, ""}, {2, events.FateAcked, ""}},
		},
		{
			name: "deferred, then acked",
			handler: func(a uint64) error {
				if a == 1 {
					return &events.RetryableError{Code: events.CodeAgentBusy, After: 50 * time.Millisecond, Err: errors.New("busy")}
				}
				return nil
			},
			want: []fate{{1, events.FateDeferred, ""}, {2, events.FateAcked, ""}},
		},
		{
			name:    "retries run out",
			handler: func(uint64) error { return errors.New("still down") },
			want: []fate{
				{1, events.FateRetried, ""}, {2, events.FateRetried, ""}, {3, events.FateTerminated, events.CodeInternal},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newWorkFixture(t, nil) // MaxDeliver 3
			f.publish(t, 1)
			obs := &observer{}
			stop := startConsume(t, f.cons, func(ctx context.Context, m jetstream.Msg) error {
				time.Sleep(time.Millisecond) // a measurable handler duration
				return tc.handler(attempt(m))
			}, events.ConsumeOptions{
				Logger:   testLogger(t),
				Observer: obs,
				Backoff:  func(uint64) time.Duration { return 20 * time.Millisecond },
			})
			eventually(t, "every delivery settled", func() bool { return len(obs.settlements()) >= len(tc.want) })
			_ = stop()

			var got []fate
			for _, s := range obs.settlements() {
				got = append(got, fate{s.Attempt, s.Fate, s.Code})
				if s.Consumer != testConsumer || s.Subject != "work.c1.r0" {
					t.Errorf("settlement names consumer %q subject %q, want %q and work.c1.r0", s.Consumer, s.Subject, testConsumer)
				}
				if s.HandlerDuration < time.Millisecond {
					t.Errorf("attempt %d: handler duration %s, want at least the handler's 1ms", s.Attempt, s.HandlerDuration)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("settlements (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConsumeReportsHandedBackMessages(t *testing.T) {
	f := newWorkFixture(t, nil)
	f.publish(t, 1)
	obs := &observer{}
	started := make(chan struct{})
	stop := startConsume(t, f.cons, func(ctx context.Context, m jetstream.Msg) error {
		close(started)
		<-ctx.Done() // only the drain timeout ends it
		return ctx.Err()
	}, events.ConsumeOptions{Logger: testLogger(t), Observer: obs, DrainTimeout: 100 * time.Millisecond})
	<-started
	if err := stop(); !errors.Is(err, events.ErrDrainTimeout) {
		t.Fatalf("Consume returned %v, want ErrDrainTimeout", err)
	}
	got := obs.settlements()
	if len(got) != 1 || got[0].Fate != events.FateHandedBack {
		t.Fatalf("settlements = %+v, want one handed back", got)
	}
}

func TestPublisherReportsPublications(t *testing.T) {
	_, _, js := natstest.Start(t)
	ctx := t.Context()
	if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
		t.Fatal(err)
	}
	obs := &observer{}
	p, err := events.NewPublisher(events.PublisherOptions{JS: js, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	ev := events.RunLogEvent{RunID: "r1", CompanyID: "c1", Seq: 1, Pod: "p", Container: "agent",
		Lines: []events.LogLine{{TS: "2026-08-24T10:30:00Z", Text: "hello"}}}
	for range 2 {
		if _, err := p.Publish(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Publish(ctx, events.RunLogEvent{}); err == nil {
		t.Fatal("publishing an event without ids succeeded")
	}

	obs.mu.Lock()
	defer obs.mu.Unlock()
	type pub struct {
		Subject   string
		Duplicate bool
		Failed    bool
	}
	var got []pub
	for _, p := range obs.pubs {
		got = append(got, pub{p.Subject, p.Duplicate, p.Err != nil})
		if p.Event == nil {
			t.Errorf("publication of %q carries no event", p.Subject)
		}
	}
	want := []pub{
		{"paperclip.run.c1.r1.log", false, false},
		{"paperclip.run.c1.r1.log", true, false},
		{"", false, true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("publications (-want +got):\n%s", diff)
	}
}
