package events_test

import (
	"strings"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestStoredBytesIsWhatTheStreamStores: what the budgets are charged for an event
// (events.StoredBytes) is at least what publishing it adds to the run stream, and at most a few
// bytes more, for short and longest ids and for text JSON escapes six bytes a byte. Before, a
// fixed 1 KiB per event plus the text was charged: an event with long ids stored 1.5 KiB for a
// byte, and a control character stored six times what it was charged.
func TestStoredBytesIsWhatTheStreamStores(t *testing.T) {
	_, _, js := natstest.Start(t)
	ctx := t.Context()
	if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
		t.Fatal(err)
	}
	pub, err := events.NewPublisher(events.PublisherOptions{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, events.Subjects{}.RunStream())
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", events.MaxTokenLen)
	at := time.Date(2026, 12, 7, 4, 30, 0, 123, time.UTC)
	for _, tc := range []struct {
		name string
		ev   events.Event
	}{
		{"exec, one byte", events.RunExecEvent{CompanyID: "co", RunID: "run-1", ExecID: "x1", Seq: 1, Command: "claude", Stream: events.ExecStdout, Text: "x"}},
		{"exec, longest ids", events.RunExecEvent{CompanyID: long, RunID: long, ExecID: "x1", Seq: 2, Command: "claude", Stream: events.ExecStdout, Text: "x"}},
		{"exec, control characters", events.RunExecEvent{CompanyID: "co", RunID: "run-2", ExecID: "x1", Seq: 3, Command: "claude", Stream: events.ExecStderr, Text: strings.Repeat("\x01", 1000)}},
		{"log, one line", events.RunLogEvent{CompanyID: "co", RunID: "run-3", At: at, Seq: 1, Pod: "p", Container: "agent", Lines: []events.LogLine{{TS: "2026-12-07T04:30:00.000000001Z", Text: "x"}}}},
		{"log, longest ids", events.RunLogEvent{CompanyID: long, RunID: long, Seq: 1, Pod: strings.Repeat("p", 63), Container: "agent", Lines: []events.LogLine{{TS: "2026-12-07T04:30:00.000000001Z", Text: "x"}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			charged, err := events.StoredBytes(events.Subjects{}, tc.ev)
			if err != nil {
				t.Fatal(err)
			}
			info, err := stream.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			before := info.State.Bytes
			if _, err := pub.Publish(ctx, tc.ev); err != nil {
				t.Fatal(err)
			}
			if info, err = stream.Info(ctx); err != nil {
				t.Fatal(err)
			}
			stored := int64(info.State.Bytes - before)
			t.Logf("stored %d bytes, charged %d", stored, charged)
			if charged < stored || charged > stored+64 {
				t.Errorf("charged %d bytes for an event that stored %d: want at least that, at most 64 more", charged, stored)
			}
		})
	}
}
