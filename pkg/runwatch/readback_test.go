package runwatch

import (
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// storeForeign has JetStream store its answer to an API request on runID's subject of kind, as
// it does for any client that names the subject as its reply, and returns its sequence.
func (h *harness) storeForeign(t *testing.T, runID string, kind events.RunKind) uint64 {
	t.Helper()
	subj, err := events.Subjects{}.Run(testCompany, runID, kind)
	if err != nil {
		t.Fatal(err)
	}
	before, err := h.stream.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := h.js.Conn().PublishRequest("$JS.API.INFO", subj, nil); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		msg, err := h.stream.GetLastMsgForSubject(t.Context(), subj)
		if err == nil && msg.Sequence > before.State.LastSeq {
			return msg.Sequence
		}
		if time.Now().After(deadline) {
			t.Fatalf("JetStream's answer was not stored on %s: %v", subj, err)
		}
	}
}

// TestLoadsLookPastForeignMessages: a run's status and log read back after JetStream stored its
// answer to a client on their subjects take nothing from that answer (it is not kubeclip's
// event) but fence the next publish on it, so the run-watcher's next status and chunk are
// accepted; the run's last exec is hidden, not misread.
func TestLoadsLookPastForeignMessages(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	ref := events.Ref(testCompany, "r1")
	h.publish(t, events.RunStatusEvent{RunID: "r1", CompanyID: testCompany, Phase: events.PhaseRunning, Reason: "Started"})
	statusSeq := h.storeForeign(t, "r1", events.KindStatus)

	status := newStatusLine()
	if err := status.load(ctx, h.stream, events.Subjects{}, ref); err != nil {
		t.Fatal(err)
	}
	if status.phase != events.PhasePending || status.reason != "" || status.seq != statusSeq {
		t.Errorf("status loaded = %q %q at %d; want the new line's Pending at the foreign message %d", status.phase, status.reason, status.seq, statusSeq)
	}
	if err := status.publish(ctx, h.pub, ref, events.PhaseSucceeded, "Completed", "", "p"); err != nil {
		t.Errorf("publishing a status after the foreign message: %v", err)
	}

	h.publish(t, events.RunLogEvent{RunID: "r1", CompanyID: testCompany, Seq: 1, Pod: "p", Container: "c", Lines: []events.LogLine{{Text: "one"}}})
	logSeq := h.storeForeign(t, "r1", events.KindLog)
	j, err := loadJournal(ctx, ref, journalOptions{subjects: events.Subjects{}, pub: h.pub, stream: h.stream, now: clock, interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if j.lastStreamSeq != logSeq {
		t.Errorf("journal fenced on %d, want the foreign message %d", j.lastStreamSeq, logSeq)
	}

	h.publish(t, events.RunExecEvent{RunID: "r1", CompanyID: testCompany, ExecID: "x1", Seq: 1, Command: "claude", Exit: &events.ExecExit{}})
	h.storeForeign(t, "r1", events.KindExec)
	x, err := lastAgentExec(ctx, h.stream, events.Subjects{}, ref)
	if err != nil || x != nil {
		t.Errorf("last agent exec behind a foreign message = %+v, %v; want none", x, err)
	}
}
