package runwatch

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
)

const (
	ts0 = "2026-08-24T10:29:00.000000001Z"
	ts1 = "2026-08-24T10:29:01.000000001Z"
	ts2 = "2026-08-24T10:29:02.000000002Z"

	initLine = `{"type":"system","subtype":"init","session_id":"sess-1","model":"claude-test"}`
)

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// cursorOf is the cursor after delivering lines, as FollowLogs would build it.
func cursorOf(t *testing.T, lines ...events.LogLine) k8s.Cursor {
	t.Helper()
	var c k8s.Cursor
	for _, l := range lines {
		c.Add(k8s.Line{Time: mustTime(t, l.TS), TimeRaw: l.TS, Text: l.Text})
	}
	return c
}

func logEvent(runID string, seq uint64, lines ...events.LogLine) events.RunLogEvent {
	return events.RunLogEvent{RunID: runID, CompanyID: testCompany, Seq: seq, Pod: "pc-x-abcde", Container: agentContainer, Lines: lines}
}

func line(ts, text string) events.LogLine { return events.LogLine{TS: ts, Text: text} }
func partialLine(ts, text string) events.LogLine {
	return events.LogLine{TS: ts, Text: text, Partial: true}
}

func TestJournalResume(t *testing.T) {
	h := newHarness(t)
	tests := []struct {
		name        string
		published   [][]events.LogLine // the lines of each published log event, seq 1..
		wantLines   []events.LogLine   // the whole lines the cursor must cover
		wantSession string
		wantModel   string
		wantSummary string
	}{
		{
			name: "several whole lines share the last timestamp, one of them split",
			published: [][]events.LogLine{
				{line(ts0, initLine)},
				{
					line(ts1, "plain"),
					line(ts2, "a"),
					partialLine(ts2, `{"type":"result","subtype":"success",`),
					line(ts2, `"is_error":false,"result":"all done","session_id":"sess-1"}`),
					line(ts2, "b"),
				},
			},
			wantLines: []events.LogLine{
				line(ts0, initLine), line(ts1, "plain"), line(ts2, "a"),
				line(ts2, `{"type":"result","subtype":"success","is_error":false,"result":"all done","session_id":"sess-1"}`),
				line(ts2, "b"),
			},
			wantSession: "sess-1", wantModel: "claude-test", wantSummary: "all done",
		},
		{
			name:        "the last timestamp appears once",
			published:   [][]events.LogLine{{line(ts0, initLine), line(ts1, "x"), line(ts2, "y")}},
			wantLines:   []events.LogLine{line(ts0, initLine), line(ts1, "x"), line(ts2, "y")},
			wantSession: "sess-1", wantModel: "claude-test",
		},
		{
			name: "a line of the other stream lags between lines of the last timestamp",
			published: [][]events.LogLine{
				{line(ts0, initLine)},
				{line(ts2, "stdout 1"), line(ts1, "stderr"), line(ts2, "stdout 2")},
			},
			wantLines:   []events.LogLine{line(ts0, initLine), line(ts2, "stdout 1"), line(ts1, "stderr"), line(ts2, "stdout 2")},
			wantSession: "sess-1", wantModel: "claude-test",
		},
		{
			name: "the last chunk ends inside a split line: it is not delivered yet",
			published: [][]events.LogLine{
				{line(ts0, initLine), line(ts1, "x"), partialLine(ts2, `{"type":"res`)},
			},
			wantLines:   []events.LogLine{line(ts0, initLine), line(ts1, "x")},
			wantSession: "sess-1", wantModel: "claude-test",
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			runID := "run-resume-" + string(rune('a'+i))
			var last events.RunLogEvent
			var lastStreamSeq uint64
			for j, lines := range tc.published {
				last = logEvent(runID, uint64(j+1), lines...)
				lastStreamSeq = h.publish(t, last)
			}
			// Another run's log in between must not reach this run's parser.
			h.publish(t, logEvent("run-other", 1, line(ts0, `{"type":"system","subtype":"init","session_id":"other"}`)))

			tr := h.tracker(t, runID)
			j := tr.journal
			if err := j.resume(t.Context(), last, lastStreamSeq); err != nil {
				t.Fatalf("resume() error: %v", err)
			}
			if diff := cmp.Diff(cursorOf(t, tc.wantLines...), j.cursor()); diff != "" {
				t.Errorf("cursor (-want +got):\n%s", diff)
			}
			if got := j.seq.lastIssued(); got != last.Seq {
				t.Errorf("sequence continues after %d, want %d", got, last.Seq)
			}
			res := j.agentResult(0)
			got := [3]string{res.SessionID, res.Model, res.Summary}
			if diff := cmp.Diff([3]string{tc.wantSession, tc.wantModel, tc.wantSummary}, got); diff != "" {
				t.Errorf("parser (session, model, summary) after replay (-want +got):\n%s", diff)
			}
		})
	}
}

// TestJournalResumeWithoutLines: an event without lines leaves the cursor at the start.
func TestJournalResumeWithoutLines(t *testing.T) {
	h := newHarness(t)
	tr := h.tracker(t, "run-empty")
	last := logEvent("run-empty", 4)
	streamSeq := h.publish(t, last)
	if err := tr.journal.resume(t.Context(), last, streamSeq); err != nil {
		t.Fatalf("resume() error: %v", err)
	}
	if diff := cmp.Diff(k8s.Cursor{}, tr.journal.cursor()); diff != "" {
		t.Errorf("cursor (-want +got):\n%s", diff)
	}
	if got := tr.journal.seq.lastIssued(); got != 4 {
		t.Errorf("sequence continues after %d, want 4", got)
	}
}

func kline(t *testing.T, ts, text string) k8s.Line {
	return k8s.Line{Time: mustTime(t, ts), TimeRaw: ts, Text: text}
}

func TestJournalAddFlushPublishesInOrder(t *testing.T) {
	h := newHarness(t)
	const runID = "run-batch"
	tr := h.tracker(t, runID)
	j := tr.journal
	if err := j.setPod("pc-x-abcde", agentContainer); err != nil {
		t.Fatalf("setPod() error: %v", err)
	}
	add := func(lines ...k8s.Line) {
		t.Helper()
		for _, ln := range lines {
			if err := j.add(t.Context(), ln); err != nil {
				t.Fatalf("add(%q) error: %v", ln.Text, err)
			}
		}
	}

	add(kline(t, ts0, initLine), kline(t, ts1, "one"), kline(t, ts1, "two"))
	if got := runEvents[events.RunLogEvent](t, h, runID, events.KindLog); len(got) != 0 {
		t.Fatalf("%d log events published before the flush, want 0", len(got))
	}
	if err := j.flush(t.Context()); err != nil {
		t.Fatalf("flush() error: %v", err)
	}
	add(kline(t, ts2, "three"))
	if err := j.flush(t.Context()); err != nil {
		t.Fatalf("second flush() error: %v", err)
	}
	if err := j.flush(t.Context()); err != nil {
		t.Fatalf("flush() with nothing pending: %v", err)
	}

	want := []events.RunLogEvent{
		logEvent(runID, 1, line(ts0, initLine), line(ts1, "one"), line(ts1, "two")),
		logEvent(runID, 2, line(ts2, "three")),
	}
	got := runEvents[events.RunLogEvent](t, h, runID, events.KindLog)
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(events.RunLogEvent{}, "At")); diff != "" {
		t.Errorf("published log events (-want +got):\n%s", diff)
	}
	wantCursor := cursorOf(t, line(ts0, initLine), line(ts1, "one"), line(ts1, "two"), line(ts2, "three"))
	if diff := cmp.Diff(wantCursor, j.cursor()); diff != "" {
		t.Errorf("cursor (-want +got):\n%s", diff)
	}
	if got := j.agentResult(0).SessionID; got != "sess-1" {
		t.Errorf("parser session %q, want sess-1 (published lines feed the parser)", got)
	}
}

// TestJournalRetriesItsOutbox makes the run stream refuse new messages (a limit with
// DiscardNew, on the real server) so a chunk fails to publish, then lets it accept them again:
// the chunk keeps its seq and goes out before anything newer.
func TestJournalRetriesItsOutbox(t *testing.T) {
	h := newHarness(t)
	const runID = "run-outbox"
	tr := h.tracker(t, runID)
	j := tr.journal
	if err := j.setPod("pc-x-abcde", agentContainer); err != nil {
		t.Fatalf("setPod() error: %v", err)
	}
	if err := j.add(t.Context(), kline(t, ts0, "first")); err != nil {
		t.Fatal(err)
	}
	if err := j.flush(t.Context()); err != nil {
		t.Fatalf("flush() error: %v", err)
	}

	cfg := events.Options{}.RunStreamConfig()
	full := cfg
	full.MaxMsgs, full.Discard = 1, jetstream.DiscardNew
	if _, err := h.js.UpdateStream(t.Context(), full); err != nil {
		t.Fatalf("limiting the run stream: %v", err)
	}
	if err := j.add(t.Context(), kline(t, ts1, "second")); err != nil {
		t.Fatalf("add() error: %v", err)
	}
	if err := j.flush(t.Context()); err == nil {
		t.Fatal("flush() to a stream that refuses messages succeeded")
	}
	if err := j.add(t.Context(), kline(t, ts1, "third")); err != nil {
		t.Fatalf("add() while the outbox holds a chunk: %v", err)
	}

	if _, err := h.js.UpdateStream(t.Context(), cfg); err != nil {
		t.Fatalf("restoring the run stream: %v", err)
	}
	if err := j.add(t.Context(), kline(t, ts2, "fourth")); err != nil {
		t.Fatalf("add() error: %v", err)
	}
	if err := j.flush(t.Context()); err != nil {
		t.Fatalf("flush() after the stream recovered: %v", err)
	}

	want := []events.RunLogEvent{
		logEvent(runID, 1, line(ts0, "first")),
		logEvent(runID, 2, line(ts1, "second")),
		logEvent(runID, 3, line(ts1, "third"), line(ts2, "fourth")),
	}
	got := runEvents[events.RunLogEvent](t, h, runID, events.KindLog)
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(events.RunLogEvent{}, "At")); diff != "" {
		t.Errorf("published log events (-want +got):\n%s", diff)
	}
}

// TestJournalFlushesALoneLineQuickly: a line that completes no chunk waits at most the flush
// interval, then goes out on its own, with the context it was added with.
func TestJournalFlushesALoneLineQuickly(t *testing.T) {
	h := newHarness(t)
	const runID = "run-lone"
	opts := h.d.journalOptions(h.d.log)
	opts.interval = 20 * time.Millisecond
	j := newJournal(events.Ref(testCompany, runID), opts)
	t.Cleanup(j.stop)
	if err := j.setPod("pc-x-abcde", agentContainer); err != nil {
		t.Fatal(err)
	}
	if err := j.add(t.Context(), kline(t, ts0, "the only line for a while")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	var got []events.RunLogEvent
	for len(got) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("a lone line was held back")
		}
		time.Sleep(10 * time.Millisecond)
		got = runEvents[events.RunLogEvent](t, h, runID, events.KindLog)
	}
	want := []events.RunLogEvent{logEvent(runID, 1, line(ts0, "the only line for a while"))}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(events.RunLogEvent{}, "At")); diff != "" {
		t.Errorf("published log events (-want +got):\n%s", diff)
	}
}

// TestLastLogChunk: a restarted run-watcher continues a run's log after the seq of its last
// published chunk, 0 when it has none; other runs' chunks do not count.
func TestLastLogChunk(t *testing.T) {
	h := newHarness(t)
	ref := events.Ref("c1", "r1")
	got, err := events.LastRunEvent[events.RunLogEvent](t.Context(), h.stream, events.Subjects{}, ref)
	if err != nil || got.Ours || got.Seq != 0 {
		t.Fatalf("last log chunk of a run without logs = %+v, %v; want none", got, err)
	}
	var streamSeq uint64
	for seq := uint64(1); seq <= 3; seq++ {
		streamSeq = h.publish(t, events.RunLogEvent{RunID: "r1", CompanyID: "c1", Seq: seq, Pod: "p", Container: "c"})
	}
	h.publish(t, events.RunLogEvent{RunID: "r2", CompanyID: "c1", Seq: 9})
	last, err := events.LastRunEvent[events.RunLogEvent](t.Context(), h.stream, events.Subjects{}, ref)
	if err != nil || !last.Ours || last.Event.Seq != 3 || last.Seq != streamSeq {
		t.Errorf("last log chunk = seq %d at %d, %v, %v; want seq 3 at %d", last.Event.Seq, last.Seq, last.Ours, err, streamSeq)
	}
}
