package runwatch

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/events"
)

func TestBugLineSplitAcrossChunks(t *testing.T) {
	h := newHarness(t)
	tr := h.tracker(t, "run-long")
	j := tr.journal
	if err := j.setPod("pc-x-abcde", agentContainer); err != nil {
		t.Fatal(err)
	}
	result := `{"type":"result","subtype":"success","is_error":false,"result":"` + strings.Repeat("x", 100<<10) + `","session_id":"sess-long"}`
	if err := j.add(t.Context(), kline(t, ts0, result)); err != nil {
		t.Fatal(err)
	}
	if err := j.flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	evs := runEvents[events.RunLogEvent](t, h, "run-long", events.KindLog)
	t.Logf("published %d log events for one %d-byte line", len(evs), len(result))
	if got := j.agentResult(0).SessionID; got != "sess-long" {
		t.Errorf("live parser: session %q, want sess-long", got)
	}
	tr2 := h.tracker(t, "run-long")
	if err := tr2.journal.resume(t.Context(), evs[len(evs)-1], 0); err != nil {
		t.Fatal(err)
	}
	if got := tr2.journal.agentResult(0).SessionID; got != "sess-long" {
		t.Errorf("replayed parser: session %q, want sess-long", got)
	}
	if diff := cmp.Diff(cursorOf(t, line(ts0, result)), tr2.journal.cursor()); diff != "" {
		t.Errorf("replayed cursor does not cover the split line")
	}
}
