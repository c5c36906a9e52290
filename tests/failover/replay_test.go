package failover

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// rawMsg is a run-stream message as a consumer received it.
type rawMsg struct {
	Seq     uint64
	Subject string
	MsgID   string
	Data    []byte
}

// recordRaw reads the run's messages from the run stream with an ordered consumer, from its
// first message, until ctx ends, and returns a function that yields what it has so far.
func recordRaw(ctx context.Context, t *testing.T, companyID, runID string) func() []rawMsg {
	t.Helper()
	filter, err := env.Subjects.RunFilter(companyID, runID)
	if err != nil {
		t.Fatal(err)
	}
	cons, err := env.JS.OrderedConsumer(ctx, env.Subjects.RunStream(), jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []rawMsg
	cc, err := cons.Consume(func(m jetstream.Msg) {
		meta, err := m.Metadata()
		if err != nil {
			return
		}
		mu.Lock()
		got = append(got, rawMsg{Seq: meta.Sequence.Stream, Subject: m.Subject(), MsgID: m.Headers().Get(events.HeaderMsgID), Data: bytes.Clone(m.Data())})
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cc.Stop)
	return func() []rawMsg {
		mu.Lock()
		defer mu.Unlock()
		return append([]rawMsg(nil), got...)
	}
}

// TestReplayEqualsLive attaches two readers to a run before its acquire is published — a raw
// ordered consumer that keeps every message's bytes, and the events.Follow collector that
// keeps the decoded events — and, after the run finished, replays it three ways: a raw ordered
// consumer from the run's first message, events.Follow from the start, and the CLI
// (`kubeclip runs replay <runId>`). Each replay must reproduce the live sequence event by
// event: same messages, same bytes, same order.
func TestReplayEqualsLive(t *testing.T) {
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	const lines = 60
	r := env.NewRun(t, company, pt.NewID("agent"))
	liveCtx, stopLive := context.WithCancel(t.Context())
	defer stopLive()
	liveRaw := recordRaw(liveCtx, t, r.CompanyID, r.RunID)
	r.Collect()
	r.PublishAcquire(pt.StubConfig(map[string]string{"STUB_LINES": fmt.Sprint(lines), "STUB_BURST": "3", "STUB_INTERVAL": "60ms"}), true)
	pt.WaitKind[events.RunResultEvent](r, runTimeout)

	// The history as it stands now; the live readers must have caught up with it.
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	replayed, err := pt.History(ctx, env, r.CompanyID, r.RunID)
	if err != nil {
		t.Fatal(err)
	}
	last := replayed[len(replayed)-1].StreamSeq
	pt.Eventually(t, 30*time.Second, "the live readers to reach the end of the history", func() bool {
		raw, evs := liveRaw(), r.Events()
		return len(raw) > 0 && raw[len(raw)-1].Seq >= last && len(evs) > 0 && evs[len(evs)-1].StreamSeq >= last
	})
	checkHistory(t, r, pt.Want{Lines: lines})

	// 1. Raw: the same messages, byte for byte.
	replayCtx, stopReplay := context.WithCancel(t.Context())
	replayRaw := recordRaw(replayCtx, t, r.CompanyID, r.RunID)
	pt.Eventually(t, 30*time.Second, "the raw replay to reach the end of the history", func() bool {
		raw := replayRaw()
		return len(raw) > 0 && raw[len(raw)-1].Seq >= last
	})
	stopReplay()
	stopLive()
	if diff := cmp.Diff(upTo(liveRaw(), last), upTo(replayRaw(), last)); diff != "" {
		t.Errorf("raw replay differs from what the live reader received (-live +replay):\n%s", diff)
	}

	// 2. Decoded: events.Follow from the start gives the live collector's events.
	live := r.Events()
	type decoded struct {
		Seq     uint64
		Subject string
		Event   events.Event
	}
	strip := func(evs []events.Received) []decoded {
		var out []decoded
		for _, e := range evs {
			if e.StreamSeq <= last {
				out = append(out, decoded{e.StreamSeq, e.Subject, e.Event})
			}
		}
		return out
	}
	if diff := cmp.Diff(strip(live), strip(replayed)); diff != "" {
		t.Errorf("events.Follow replay differs from the live events (-live +replay):\n%s", diff)
	}

	// 3. The CLI prints the live sequence, one line per event (per log line for logs).
	out, err := exec.CommandContext(ctx, filepath.Join(env.Bin, pt.CLI), "runs", "replay", r.RunID,
		"--company", r.CompanyID, "--nats-url", env.NATS.URL()).CombinedOutput()
	if err != nil {
		t.Fatalf("kubeclip runs replay: %v\n%s", err, out)
	}
	got := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	want := cliLines(live, last)
	if len(got) != len(want) {
		t.Errorf("kubeclip runs replay printed %d lines, want %d (one per event, one per log line)", len(got), len(want))
	}
	for i := range min(len(got), len(want)) {
		tag, rest := splitCLILine(got[i])
		if tag != want[i].tag || !want[i].match(rest) {
			t.Errorf("replay line %d = %q, want tag [%s] and %s", i+1, got[i], want[i].tag, want[i].what)
		}
	}
}

func upTo(msgs []rawMsg, last uint64) []rawMsg {
	var out []rawMsg
	for _, m := range msgs {
		if m.Seq <= last {
			out = append(out, m)
		}
	}
	return out
}

// cliLine is what one line of `kubeclip runs replay` must show.
type cliLine struct {
	tag   string
	what  string
	match func(rest string) bool
}

// cliLines lists the lines the CLI prints for evs: the event's tag and the part of the event
// the line must carry (the workload, the phase, the log line's text, the outcome).
func cliLines(evs []events.Received, last uint64) []cliLine {
	has := func(s string) func(string) bool { return func(rest string) bool { return strings.Contains(rest, s) } }
	starts := func(s string) func(string) bool { return func(rest string) bool { return strings.HasPrefix(rest, s) } }
	var out []cliLine
	for _, e := range evs {
		if e.StreamSeq > last {
			continue
		}
		switch ev := e.Event.(type) {
		case events.RunCreatedEvent:
			out = append(out, cliLine{"created", "workload " + ev.WorkloadName, has(ev.WorkloadName)})
		case events.RunStatusEvent:
			out = append(out, cliLine{"status", "phase " + string(ev.Phase), starts(string(ev.Phase))})
		case events.RunLogEvent:
			for _, l := range ev.Lines {
				out = append(out, cliLine{fmt.Sprintf("log %d", ev.Seq), fmt.Sprintf("text %q", l.Text), func(rest string) bool { return strings.HasSuffix(rest, "  "+l.Text) }})
			}
		case events.RunResultEvent:
			out = append(out, cliLine{"result", "outcome " + string(ev.Outcome), starts(string(ev.Outcome))})
			if a := ev.Agent; a != nil {
				out = append(out, cliLine{"agent", "session " + a.SessionID, starts("session=" + a.SessionID)})
				if a.Summary != "" {
					out = append(out, cliLine{"summary", fmt.Sprintf("%q", a.Summary), func(rest string) bool { return rest == a.Summary }})
				}
			}
		case events.RunReleasedEvent:
			out = append(out, cliLine{"released", "lease " + ev.ProviderLeaseID, has(ev.ProviderLeaseID)})
		case events.RunFailedEvent:
			out = append(out, cliLine{"failed", "code " + string(ev.Code), starts(string(ev.Code))})
		}
	}
	return out
}

// splitCLILine splits "[tag]    rest" into tag and rest.
func splitCLILine(line string) (tag, rest string) {
	if !strings.HasPrefix(line, "[") {
		return "", line
	}
	end := strings.Index(line, "]")
	if end < 0 {
		return "", line
	}
	return line[1:end], strings.TrimLeft(line[end+1:], " ")
}
