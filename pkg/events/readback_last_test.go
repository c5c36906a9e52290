package events_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestLastRunEvent: the reader of a run subject's last message says none for an empty subject,
// gives kubeclip's event with its stream sequence, reports a foreign last message (JetStream's
// answer to a client that named the subject as its reply) by its sequence but not as an event,
// and refuses a message with kubeclip's type that does not decode strictly or names another run.
func TestLastRunEvent(t *testing.T) {
	subjects := events.Subjects{}
	ref := events.Ref("c1", "r1")
	status := events.RunStatusEvent{RunID: "r1", CompanyID: "c1", Phase: events.PhaseRunning, Reason: "Started"}
	typed := func(data string) func(*testing.T, *nats.Conn, jetstream.JetStream, string) {
		return func(t *testing.T, nc *nats.Conn, _ jetstream.JetStream, subj string) {
			t.Helper()
			msg := nats.NewMsg(subj)
			msg.Header.Set(events.HeaderType, events.EncodeHeaderValue(status.Type()))
			msg.Data = []byte(data)
			if err := nc.PublishMsg(msg); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name      string
		store     []func(*testing.T, *nats.Conn, jetstream.JetStream, string)
		wantOurs  bool
		wantEvent events.RunStatusEvent
		wantErr   bool
	}{
		{name: "empty subject"},
		{
			name:      "kubeclip's status",
			store:     []func(*testing.T, *nats.Conn, jetstream.JetStream, string){publishEvent(status)},
			wantOurs:  true,
			wantEvent: status,
		},
		{
			name:  "a foreign message after kubeclip's",
			store: []func(*testing.T, *nats.Conn, jetstream.JetStream, string){publishEvent(status), storeForeign},
		},
		{
			name:    "kubeclip's type, a key given twice",
			store:   []func(*testing.T, *nats.Conn, jetstream.JetStream, string){typed(`{"runId":"r1","companyId":"c1","phase":"Running","phase":"Failed"}`)},
			wantErr: true,
		},
		{
			name:    "kubeclip's type, another run's payload",
			store:   []func(*testing.T, *nats.Conn, jetstream.JetStream, string){typed(`{"runId":"r2","companyId":"c1","phase":"Running"}`)},
			wantErr: true,
		},
		{
			name:    "kubeclip's type, not JSON",
			store:   []func(*testing.T, *nats.Conn, jetstream.JetStream, string){typed(`{"runId":`)},
			wantErr: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, nc, js := natstest.Start(t)
			ctx := t.Context()
			if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
				t.Fatal(err)
			}
			runs, err := js.Stream(ctx, subjects.RunStream())
			if err != nil {
				t.Fatal(err)
			}
			subj, err := subjects.Run(ref.CompanyID, ref.RunID, events.KindStatus)
			if err != nil {
				t.Fatal(err)
			}
			for _, store := range tc.store {
				store(t, nc, js, subj)
			}
			wantSeq := uint64(0)
			if len(tc.store) > 0 {
				wantSeq = waitStored(t, runs, subj, len(tc.store))
			}

			got, err := events.LastRunEvent[events.RunStatusEvent](ctx, runs, subjects, ref)
			if tc.wantErr {
				var terr *events.TerminalError
				if !errors.As(err, &terr) {
					t.Fatalf("LastRunEvent = %+v, %v; want a decoding error", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := events.Stored[events.RunStatusEvent]{Seq: wantSeq, Ours: tc.wantOurs, Event: tc.wantEvent}
			if diff := cmp.Diff(want, got, ignoreAt); diff != "" {
				t.Errorf("LastRunEvent (-want +got):\n%s", diff)
			}

			// The same message read by its sequence, as the kind it is and as another.
			if wantSeq == 0 {
				return
			}
			at, err := events.RunEventAt[events.RunStatusEvent](ctx, runs, subjects, wantSeq)
			if err != nil || cmp.Diff(want, at, ignoreAt) != "" {
				t.Errorf("RunEventAt(%d) = %+v, %v; want %+v", wantSeq, at, err, want)
			}
			asLog, err := events.RunEventAt[events.RunLogEvent](ctx, runs, subjects, wantSeq)
			if err != nil || asLog.Ours || asLog.Seq != wantSeq {
				t.Errorf("RunEventAt(%d) as a log event = %+v, %v; want not kubeclip's log event", wantSeq, asLog, err)
			}
		})
	}
}

var ignoreAt = cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".At" }, cmp.Ignore())

func publishEvent(ev events.Event) func(*testing.T, *nats.Conn, jetstream.JetStream, string) {
	return func(t *testing.T, _ *nats.Conn, js jetstream.JetStream, _ string) {
		t.Helper()
		pub, err := events.NewPublisher(events.PublisherOptions{JS: js})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pub.Publish(t.Context(), ev); err != nil {
			t.Fatal(err)
		}
	}
}

// storeForeign has JetStream store its answer to an API request on subj, as it does for any
// client that names subj as its reply.
func storeForeign(t *testing.T, nc *nats.Conn, _ jetstream.JetStream, subj string) {
	t.Helper()
	if err := nc.PublishRequest("$JS.API.INFO", subj, nil); err != nil {
		t.Fatal(err)
	}
}

// waitStored waits until the stream holds n messages on subj and returns the last one's sequence.
func waitStored(t *testing.T, runs jetstream.Stream, subj string, n int) uint64 {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		info, err := runs.Info(t.Context(), jetstream.WithSubjectFilter(subj))
		if err == nil && info.State.Subjects[subj] == uint64(n) {
			msg, err := runs.GetLastMsgForSubject(t.Context(), subj)
			if err != nil {
				t.Fatal(err)
			}
			return msg.Sequence
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream does not hold %d messages on %s: %v", n, subj, err)
		}
	}
}
