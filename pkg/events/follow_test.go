package events_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

func kinds(rs []events.Received) []string {
	var out []string
	for _, r := range rs {
		out = append(out, fmt.Sprintf("%T", r.Event))
	}
	return out
}

func TestFollowDeliversHistoryThenLive(t *testing.T) {
	_, _, js := natstest.Start(t)
	ctx := t.Context()
	if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, js)
	publish := func(ev events.Event) {
		t.Helper()
		if _, err := p.Publish(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	publish(events.RunCreatedEvent{RunID: "r1", CompanyID: "c1", ProviderLeaseID: "pc-1", Namespace: "n", WorkloadName: "pc-1", SecretName: "pc-1-env", Backend: "job", Phase: events.PhasePending})
	publish(events.RunStatusEvent{RunID: "r2", CompanyID: "c1", Phase: events.PhaseRunning}) // another run
	publish(events.RunStatusEvent{RunID: "r1", CompanyID: "c1", Phase: events.PhaseRunning})

	got := make(chan events.Received, 10)
	done := make(chan error, 1)
	go func() {
		done <- events.Follow(ctx, js, events.Subjects{}, "c1", "r1", events.FollowOptions{}, func(r events.Received) error {
			got <- r
			if _, ok := r.Event.(events.RunResultEvent); ok {
				return events.ErrStopFollowing
			}
			return nil
		})
	}()
	var rs []events.Received
	next := func() events.Received {
		t.Helper()
		select {
		case r := <-got:
			rs = append(rs, r)
			return r
		case <-time.After(10 * time.Second):
			t.Fatalf("Follow delivered nothing more after %v", kinds(rs))
		}
		return events.Received{}
	}
	next()
	if r := next(); r.Pending != 0 {
		t.Errorf("the last event of the history has pending %d, want 0", r.Pending)
	}
	// Live events follow.
	publish(events.RunLogEvent{RunID: "r1", CompanyID: "c1", Seq: 1, Pod: "p", Container: "c", Lines: []events.LogLine{{TS: ts, Text: "hi"}}})
	// What someone else stored on the run's log subject is skipped: without a ce-type, or with
	// another kind's.
	logSubject, err := events.Subjects{}.Run("c1", "r1", events.KindLog)
	if err != nil {
		t.Fatal(err)
	}
	foreign := nats.NewMsg(logSubject)
	foreign.Data = []byte(`{"runId":"r1","companyId":"c1","seq":2,"lines":[]}`)
	if _, err := js.PublishMsg(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	foreign.Header.Set(events.HeaderType, events.RunStatusEvent{}.Type())
	if _, err := js.PublishMsg(ctx, foreign); err != nil {
		t.Fatal(err)
	}
	publish(events.RunResultEvent{RunID: "r1", CompanyID: "c1", Outcome: events.OutcomeSucceeded, ExitCode: ptr(0)})
	next()
	next()
	if err := <-done; err != nil {
		t.Fatalf("Follow = %v, want nil after ErrStopFollowing", err)
	}
	want := []string{"events.RunCreatedEvent", "events.RunStatusEvent", "events.RunLogEvent", "events.RunResultEvent"}
	if diff := cmp.Diff(want, kinds(rs)); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	for i, r := range rs {
		if r.Err != nil || r.StreamSeq == 0 || r.Published.IsZero() || r.Subject == "" {
			t.Errorf("event %d lacks its position: %+v", i, r)
		}
	}

	// StartSeq skips what came before.
	var fromSeq []string
	err = events.Follow(ctx, js, events.Subjects{}, "c1", "r1", events.FollowOptions{StartSeq: rs[2].StreamSeq}, func(r events.Received) error {
		fromSeq = append(fromSeq, fmt.Sprintf("%T", r.Event))
		if r.Pending == 0 {
			return events.ErrStopFollowing
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want[2:], fromSeq); diff != "" {
		t.Errorf("events from seq %d (-want +got):\n%s", rs[2].StreamSeq, diff)
	}

	// Cancellation ends a live follow with ctx's error.
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err = events.Follow(cctx, js, events.Subjects{}, "c1", "r9", events.FollowOptions{}, func(events.Received) error { return nil })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Follow after its context ended = %v", err)
	}
}

// TestTerminalFailureReachesTheCaller runs the acquire path end to end on a real server: a
// request with a bad config is termed by Consume and its failed event reaches a follower.
func TestTerminalFailureReachesTheCaller(t *testing.T) {
	_, _, js := natstest.Start(t)
	ctx := t.Context()
	if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
		t.Fatal(err)
	}
	var s events.Subjects
	cons, err := js.CreateOrUpdateConsumer(ctx, s.LeaseStream(), events.TenantWorkerConsumerConfig(s))
	if err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, js)
	log := testLogger(t)
	startConsume(t, cons, func(ctx context.Context, m jetstream.Msg) error {
		_, err := s.DecodeAcquire(m.Subject(), m.Data())
		return err
	}, events.ConsumeOptions{
		Logger: log,
		OnTerminal: func(ctx context.Context, m jetstream.Msg, te *events.TerminalError) error {
			return events.PublishFailure(ctx, p, log, m, te)
		},
	})

	// Published raw, without CloudEvents headers: the run is found in the payload.
	bad := map[string]any{"runId": "r1", "companyId": "c1", "environmentId": "e", "agentId": "a", "config": "inCluster"}
	data, _ := json.Marshal(bad)
	if _, err := js.Publish(ctx, "paperclip.lease.c1.acquire", data); err != nil {
		t.Fatal(err)
	}
	// Not even a run id: nobody to tell, but the message is still termed.
	if _, err := js.Publish(ctx, "paperclip.lease.c1.acquire", []byte(`{"config":{}}`)); err != nil {
		t.Fatal(err)
	}

	var failed events.RunFailedEvent
	err = events.Follow(ctx, js, s, "c1", "r1", events.FollowOptions{}, func(r events.Received) error {
		if f, ok := r.Event.(events.RunFailedEvent); ok {
			failed = f
			return events.ErrStopFollowing
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if failed.Code != events.CodeInvalidRequest || failed.Field != "config" || failed.Message != "config: must be a JSON object" {
		t.Errorf("failed event = %+v", failed)
	}
	eventually(t, "both requests termed", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.AckFloor.Stream == 2 && info.NumAckPending == 0
	})
}
