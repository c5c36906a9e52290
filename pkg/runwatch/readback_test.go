package runwatch

import (
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/runwatch/verdict"
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
	if err := status.publish(ctx, h.pub, ref, events.PhaseSucceeded, "Completed", "", "p", ""); err != nil {
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

// storeCopy has JetStream answer a direct get of the run stream's message at seq onto runID's
// subject of kind, as it did for a client that named the subject as its reply (issue 26, item
// 5): the stored answer is a genuine typed copy of that event, headers included.
func (h *harness) storeCopy(t *testing.T, seq uint64, runID string, kind events.RunKind) {
	t.Helper()
	subj, err := events.Subjects{}.Run(testCompany, runID, kind)
	if err != nil {
		t.Fatal(err)
	}
	before, err := h.stream.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	get := "$JS.API.DIRECT.GET." + events.Subjects{}.RunStream()
	if err := h.js.Conn().PublishRequest(get, subj, []byte(`{"seq":`+strconv.FormatUint(seq, 10)+`}`)); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		msg, err := h.stream.GetLastMsgForSubject(t.Context(), subj)
		if err == nil && events.StoredSeq(msg) > before.State.LastSeq {
			if msg.Header.Get(events.HeaderType) == "" {
				t.Fatalf("the copy on %s has no ce-type", subj)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("JetStream's answer was not stored on %s: %v", subj, err)
		}
	}
}

// TestResultNotSuppressedByForeignMessages: a run's result subject that holds what kubeclip did
// not publish there (JetStream's answer to an API request, a typed copy of another run's result)
// still gets the run's result (issue 26, item 5): publishResult's refusal "wrong last sequence"
// means "already published" only when the run's own result is there.
func TestResultNotSuppressedByForeignMessages(t *testing.T) {
	subjects := events.Subjects{}
	end := verdict.End{Outcome: events.OutcomeSucceeded, Reason: "Completed"}
	for name, store := range map[string]func(t *testing.T, h *harness, runID string){
		"api answer": func(t *testing.T, h *harness, runID string) { h.storeForeign(t, runID, events.KindResult) },
		"another run's result": func(t *testing.T, h *harness, runID string) {
			// Another run's result as kubeclip stores it, its message id gone (past the stream's
			// duplicate window, the copy of one that has it is stored too).
			msg := nats.NewMsg("paperclip.run." + testCompany + ".other.result")
			msg.Header.Set(events.HeaderType, events.EncodeHeaderValue(events.RunResultEvent{}.Type()))
			msg.Data = []byte(`{"runId":"other","companyId":"` + testCompany + `","outcome":"failed","reason":"Other"}`)
			ack, err := h.js.PublishMsg(t.Context(), msg)
			if err != nil {
				t.Fatal(err)
			}
			h.storeCopy(t, ack.Sequence, runID, events.KindResult)
		},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context() // the subtest's: it ends with the subtest, as its harness does
			h := newHarness(t)
			ref := events.Ref(testCompany, "r1")
			store(t, h, ref.RunID)
			if ok, err := events.ResultPublished(ctx, h.stream, subjects, ref); err != nil || ok {
				t.Fatalf("before the result: published %v, %v; want not", ok, err)
			}
			if err := publishResult(ctx, h.pub, h.stream, subjects, testLogger(t), ref, end, nil); err != nil {
				t.Fatalf("publishing the result: %v", err)
			}
			last, err := events.LastRunEvent[events.RunResultEvent](ctx, h.stream, subjects, ref)
			if err != nil || !last.Ours || last.Event.RunID != ref.RunID || last.Event.Outcome != end.Outcome {
				t.Errorf("the result subject's last message = %+v, %v; want the run's result", last, err)
			}
			// Published once: a second publish finds it.
			if err := publishResult(ctx, h.pub, h.stream, subjects, testLogger(t), ref, end, nil); err != nil {
				t.Fatal(err)
			}
			ours := 0
			for _, r := range runEvents[events.RunResultEvent](t, h, ref.RunID, events.KindResult) {
				if r.RunID == ref.RunID {
					ours++
				}
			}
			if ours != 1 {
				t.Errorf("the run has %d results, want 1", ours)
			}
		})
	}
}
