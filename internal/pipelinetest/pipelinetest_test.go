package pipelinetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// stubLog is a log event carrying stub lines from..to.
func stubLog(seq uint64, from, to int) events.RunLogEvent {
	ev := events.RunLogEvent{Seq: seq}
	for i := from; i <= to; i++ {
		ev.Lines = append(ev.Lines, events.LogLine{
			TS:   "2026-08-24T10:30:09.502118734Z",
			Text: fmt.Sprintf(`{"type":"assistant","message":{"content":[{"type":"text","text":"stub line %d"}]}}`, i),
		})
	}
	return ev
}

func history(evs ...events.Event) []events.Received {
	out := make([]events.Received, len(evs))
	for i, ev := range evs {
		out[i] = events.Received{Event: ev, StreamSeq: uint64(i + 1)}
	}
	return out
}

func TestCheckHistory(t *testing.T) {
	created := events.RunCreatedEvent{}
	running := events.RunStatusEvent{Phase: events.PhaseRunning}
	ok := events.RunResultEvent{Outcome: events.OutcomeSucceeded}
	for _, tc := range []struct {
		name string
		evs  []events.Received
		want []string // substrings of the problems, in order
	}{
		{"complete", history(created, running, stubLog(1, 1, 2), stubLog(2, 3, 4), ok), nil},
		{"seq gap", history(created, stubLog(1, 1, 2), stubLog(3, 3, 4), ok),
			[]string{"has seq 3, want 2"}},
		{"line twice", history(created, stubLog(1, 1, 2), stubLog(2, 2, 4), ok),
			[]string{"repeated [2]"}},
		{"line missing", history(created, stubLog(1, 1, 2), stubLog(2, 4, 4), ok),
			[]string{"missing [3]"}},
		{"log after the result", history(created, stubLog(1, 1, 2), ok, stubLog(2, 3, 4)),
			[]string{"seq 2 (event #4) stored after the result"}},
		{"two results", history(created, stubLog(1, 1, 4), ok, ok),
			[]string{"2 result events"}},
		{"no created", history(stubLog(1, 1, 4), ok),
			[]string{"0 created events"}},
		{"failed run", history(created, stubLog(1, 1, 4), events.RunResultEvent{Outcome: events.OutcomeFailed, Reason: "OOMKilled"}),
			[]string{"outcome failed (reason \"OOMKilled\""}},
		{"undecodable", []events.Received{{Subject: "paperclip.run.c.r.log", StreamSeq: 9, Err: fmt.Errorf("bad json")}},
			[]string{"#9 (paperclip.run.c.r.log) does not decode", "0 created", "0 result", "got 0 lines, want 4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := CheckHistory(tc.evs, Want{Lines: 4})
			if len(got) != len(tc.want) {
				t.Fatalf("problems = %q, want %d matching %q", got, len(tc.want), tc.want)
			}
			for i := range got {
				if !strings.Contains(got[i], tc.want[i]) {
					t.Errorf("problem %d = %q, want it to contain %q", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestWantStubLines(t *testing.T) {
	if diff := cmp.Diff([]string{"stub line 1", "stub line 2"}, StubLines([]events.RunLogEvent{stubLog(1, 1, 2)})); diff != "" {
		t.Errorf("StubLines (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"stub line 1", "stub line 2"}, WantStubLines(2)); diff != "" {
		t.Errorf("WantStubLines (-want +got):\n%s", diff)
	}
}

// TestNATSRestartKeepsPortAndStore: after Restart, a client that kept reconnecting finds the
// server at the same URL with the messages it stored before, embedded or as a process.
func TestNATSRestartKeepsPortAndStore(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(t *testing.T) (*NATS, error)
	}{
		{name: "embedded", start: func(t *testing.T) (*NATS, error) { return StartNATS(t.TempDir()) }},
		{name: "process", start: func(t *testing.T) (*NATS, error) {
			dir := t.TempDir()
			return StartNATSProcess(filepath.Join(dir, "nats"), natstest.ServerBinary(t), filepath.Join(dir, "nats-server.log"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := tc.start(t)
			if err != nil {
				t.Fatal(err)
			}
			defer n.Stop()
			testRestartKeepsPortAndStore(t, n)
			n.Stop()
			if n.Running() {
				t.Error("running after Stop")
			}
		})
	}
}

func testRestartKeepsPortAndStore(t *testing.T, n *NATS) {
	url := n.URL()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Storage: jetstream.FileStorage})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.before", []byte("kept")); err != nil {
		t.Fatal(err)
	}

	if err := n.Restart(); err != nil {
		t.Fatal(err)
	}
	if n.URL() != url || !n.Running() {
		t.Fatalf("after Restart: URL %s running %v, want %s running", n.URL(), n.Running(), url)
	}
	var msg *jetstream.RawStreamMsg
	for msg == nil {
		msg, err = stream.GetLastMsgForSubject(ctx, "t.before")
		if err != nil {
			if ctx.Err() != nil {
				t.Fatalf("reading the message stored before the restart: %v", err)
			}
			msg = nil
			time.Sleep(50 * time.Millisecond) // the client is reconnecting
		}
	}
	if string(msg.Data) != "kept" {
		t.Errorf("message after restart = %q, want %q", msg.Data, "kept")
	}
}

// TestAttachLeavesTheServerRunning: an attached Env connects to the caller's server and its
// Close stops only what it started.
func TestAttachLeavesTheServerRunning(t *testing.T) {
	n, err := StartNATS(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	e, err := Attach(Options{Name: "attach-test"}, n, t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(e.Dir)
	if !e.NC.IsConnected() || len(e.Workers("")) != 0 {
		t.Fatalf("attached Env: connected %v, %d workers; want connected, none", e.NC.IsConnected(), len(e.Workers("")))
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if !n.Running() {
		t.Error("Close stopped the caller's server")
	}
}
