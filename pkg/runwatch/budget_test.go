package runwatch

import (
	"strings"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestLogBudgets: a run's container log over its run's or its company's budget stops with a
// `logStopped` event and no line after it, while the agent's result is still parsed from the
// lines the stream did not take and a run of another company logs on unaffected; a journal that
// takes the run over keeps it stopped.
func TestLogBudgets(t *testing.T) {
	const resultLine = `{"type":"result","subtype":"success","is_error":false,"result":"done anyway","session_id":"sess-1"}`
	chunk := strings.Repeat("x", 1000)
	for _, tc := range []struct {
		name   string
		budget LogBudget
		before int // lines another run of the company logs first
		want   events.BudgetKind
	}{
		{name: "run", budget: LogBudget{RunBytes: 8 << 10}, want: events.BudgetRun},
		{name: "company", budget: LogBudget{CompanyBytes: 12 << 10}, before: 6, want: events.BudgetCompany},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			var refused []events.BudgetKind
			kv, err := h.js.CreateOrUpdateKeyValue(t.Context(), events.BudgetBucketConfig(1, 0, 0))
			if err != nil {
				t.Fatal(err)
			}
			h.d.budgets, err = events.NewBudgets(events.BudgetOptions{
				KV: kv, Source: logBudgetSource, RunBytes: tc.budget.RunBytes, CompanyBytes: tc.budget.CompanyBytes,
				OnExceeded: func(k events.BudgetKind) { refused = append(refused, k) },
			})
			if err != nil {
				t.Fatal(err)
			}
			logLines := func(ref events.RunRef, n int, last string) *journal {
				t.Helper()
				j := newJournal(ref, h.d.journalOptions(h.d.log))
				if err := j.setPod("pc-x-abcde", agentContainer); err != nil {
					t.Fatal(err)
				}
				for i := range n {
					if err := j.add(t.Context(), kline(t, ts1, chunk)); err != nil {
						t.Fatalf("line %d: %v", i, err)
					}
					if err := j.flush(t.Context()); err != nil {
						t.Fatalf("flush %d: %v", i, err)
					}
				}
				if last != "" {
					if err := j.add(t.Context(), kline(t, ts2, last)); err != nil {
						t.Fatal(err)
					}
				}
				if err := j.flush(t.Context()); err != nil {
					t.Fatal(err)
				}
				return j
			}
			if tc.before > 0 {
				logLines(events.Ref(testCompany, "run-before"), tc.before, "")
			}
			over := events.Ref(testCompany, "run-over")
			j := logLines(over, 20, resultLine)
			other := events.Ref("other-company", "run-other")
			logLines(other, 3, "")

			evs := runEvents[events.RunLogEvent](t, h, over.RunID, events.KindLog)
			last := evs[len(evs)-1]
			if last.LogStopped != tc.want || len(last.Lines) != 0 || len(evs) >= 21 {
				t.Errorf("over budget: %d log events, the last stopped by %q with %d lines; want the log stopped by %q", len(evs), last.LogStopped, len(last.Lines), tc.want)
			}
			for _, ev := range evs[:len(evs)-1] {
				if ev.LogStopped != "" {
					t.Errorf("log event %d says stopped before the last", ev.Seq)
				}
			}
			if got := j.agentResult(0).Summary; got != "done anyway" {
				t.Errorf("agent summary %q, want the result line's, parsed though not stored", got)
			}
			if len(refused) == 0 || refused[0] != tc.want {
				t.Errorf("budget refusals observed: %v, want %s", refused, tc.want)
			}
			if ol, err := events.LastRunEvent[events.RunLogEvent](t.Context(), h.stream, events.Subjects{}, other); err != nil || !ol.Ours || ol.Event.Seq != 3 || ol.Event.LogStopped != "" {
				t.Errorf("the other company's last log event: seq %d, stopped %q (%v); want all 3 (err %v)", ol.Event.Seq, ol.Event.LogStopped, ol.Ours, err)
			}

			// A journal that takes the run over stays stopped.
			taken, err := loadJournal(t.Context(), over, h.d.journalOptions(h.d.log))
			if err != nil {
				t.Fatal(err)
			}
			if err := taken.setPod("pc-x-abcde", agentContainer); err != nil {
				t.Fatal(err)
			}
			if err := taken.add(t.Context(), kline(t, ts2, "after the takeover")); err != nil {
				t.Fatal(err)
			}
			if err := taken.flush(t.Context()); err != nil {
				t.Fatal(err)
			}
			if n := len(runEvents[events.RunLogEvent](t, h, over.RunID, events.KindLog)); n != len(evs) {
				t.Errorf("after the takeover the run has %d log events, want still %d", n, len(evs))
			}
		})
	}
}
