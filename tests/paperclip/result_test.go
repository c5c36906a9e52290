package paperclip

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// checkRunResult checks how kubeclip's run stream ends a normally released lease (issue 19
// item 4): no Failed status and no failed or cancelled result; the result is `released` and
// carries the agent exec's account (its final exec event's: exit 0, the session and cost
// Paperclip recorded, token usage). The result may come before or after `released`.
func checkRunResult(t *testing.T, r *pt.Run, rec runRecord) {
	t.Helper()
	res := pt.WaitKind[events.RunResultEvent](r, runTimeout)
	evs := r.Events()
	for _, st := range pt.Only[events.RunStatusEvent](evs) {
		if st.Phase == events.PhaseFailed {
			t.Errorf("run %s: status Failed %s (%s) for a released lease", rec.ID, st.Reason, st.Message)
		}
	}
	if res.Outcome != events.OutcomeReleased || res.Reason != events.ReasonReleased || res.ExitCode == nil || *res.ExitCode != 0 {
		t.Errorf("run %s: result %s %s (%s) exit %v, want released with the agent exec's exit 0", rec.ID, res.Outcome, res.Reason, res.Message, res.ExitCode)
	}
	var final *events.RunExecEvent
	for _, x := range pt.Only[events.RunExecEvent](evs) {
		if x.Exit != nil {
			final = &x
		}
	}
	a := res.Agent
	switch {
	case final == nil:
		t.Errorf("run %s: no final exec event", rec.ID)
	case a == nil || a.SessionID != deref(rec.SessionIDAfter) || a.CostUSD == nil || rec.Usage == nil || *a.CostUSD != rec.Usage.CostUSD || a.Usage == nil || a.Usage.OutputTokens == 0 || a.IsError:
		t.Errorf("run %s: result agent %+v; want Paperclip's session %q and cost %v, with usage", rec.ID, a, deref(rec.SessionIDAfter), rec.Usage)
	default:
		if diff := cmp.Diff(final.Agent, a); diff != "" {
			t.Errorf("run %s: result agent differs from the agent exec's (-exec +result):\n%s", rec.ID, diff)
		}
	}
}
