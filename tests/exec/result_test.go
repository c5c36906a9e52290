package exec

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
)

// agentExec runs the image's claude stub as Paperclip's claude_local adapter does, recorded, with
// interval between its stream-json lines.
func agentExec(interval time.Duration) execclient.Exec {
	return execclient.Exec{
		Command: "claude", Args: []string{"--print", "-", "--output-format", "stream-json", "--verbose"},
		Env: map[string]string{"CLAUDE_STUB_INTERVAL": interval.String()}, Stdin: strings.NewReader("say hi"), StdinBytes: 6,
		Record: true, Timeout: 5 * time.Minute,
	}
}

// stubResult is the claude stub's result line: what the run's result must carry.
type stubResult struct {
	Type      string  `json:"type"`
	SessionID string  `json:"session_id"`
	CostUSD   float64 `json:"total_cost_usd"`
}

// resultLine finds the stub's result line in its stdout.
func resultLine(t *testing.T, stdout []byte) stubResult {
	t.Helper()
	for _, l := range strings.Split(string(stdout), "\n") {
		var r stubResult
		if json.Unmarshal([]byte(l), &r) == nil && r.Type == "result" {
			return r
		}
	}
	t.Fatalf("no result line in the agent's stdout:\n%s", stdout)
	return stubResult{}
}

// waitResult waits for the run's result and its released event (either may come first: both
// follow the pod's end) and returns the result with every event of the run.
func waitResult(t *testing.T, l *lease) (events.RunResultEvent, []events.Received) {
	t.Helper()
	evs := l.run.WaitFor(runTimeout, "the result", pt.Has[events.RunResultEvent])
	return pt.Only[events.RunResultEvent](evs)[0], evs
}

// failedStatuses are the run's status events that say Failed.
func failedStatuses(evs []events.Received) []string {
	var out []string
	for _, st := range pt.Only[events.RunStatusEvent](evs) {
		if st.Phase == events.PhaseFailed {
			out = append(out, st.Reason+": "+st.Message)
		}
	}
	return out
}

// TestLeaseResult is what an exec lease's run events say at its end: a release after the agent's
// recorded exec is its normal end and carries the exec's account; a release with
// cancelActiveWork under the running agent is a cancellation; a pod deleted under a live lease
// is a failure.
func TestLeaseResult(t *testing.T) {
	execWorkers(t, execsvc.RouteDaemon, 1)
	c := newClient(t)

	t.Run("released after the agent's exec", func(t *testing.T) {
		l := acquire(t)
		l.waitReady(t)
		res, err := run(t, c, l, agentExec(0))
		if err != nil || res.ExitCode == nil || *res.ExitCode != 0 {
			t.Fatalf("the agent's exec: exit %v (%v), want 0; stderr %q", res.ExitCode, err, res.Stderr)
		}
		want := resultLine(t, res.Stdout)
		l.release(t, false, false)
		pt.WaitKind[events.RunReleasedEvent](l.run, runTimeout)
		result, evs := waitResult(t, l)

		if failed := failedStatuses(evs); len(failed) > 0 {
			t.Errorf("a released lease's run has Failed statuses: %q", failed)
		}
		if result.Outcome != events.OutcomeReleased {
			t.Errorf("a released lease's result: outcome %s reason %s (%s), want released", result.Outcome, result.Reason, result.Message)
		}
		if result.ExitCode == nil || *result.ExitCode != 0 {
			t.Errorf("result exit code %v, want the agent exec's 0", result.ExitCode)
		}
		a := result.Agent
		switch {
		case a == nil:
			t.Fatalf("the result carries no agent account: %+v", result)
		case a.SessionID != want.SessionID || a.SessionID == "":
			t.Errorf("result session %q, want the agent exec's %q", a.SessionID, want.SessionID)
		case a.Usage == nil || a.Usage.OutputTokens == 0:
			t.Errorf("result usage %+v, want the agent exec's", a.Usage)
		case a.CostUSD == nil || *a.CostUSD != want.CostUSD:
			t.Errorf("result cost %v, want the agent exec's %v", a.CostUSD, want.CostUSD)
		case a.IsError:
			t.Errorf("result agent isError %s, want a successful agent", a.ErrorCode)
		}
	})

	t.Run("released with cancelActiveWork while the agent runs", func(t *testing.T) {
		l := acquire(t)
		l.waitReady(t)
		done := runAsync(t, c, l, agentExec(10*time.Minute))
		// The agent's first line is recorded: the run stream knows its exec runs.
		l.run.WaitFor(runTimeout, "the agent's first recorded output", pt.Has[events.RunExecEvent])
		l.release(t, true, false)
		select {
		case <-done:
		case <-time.After(time.Minute):
			t.Fatal("the agent still ran a minute after a release with cancelActiveWork")
		}
		result, _ := waitResult(t, l)
		if result.Outcome != events.OutcomeCancelled || result.Reason != events.ReasonCommandCancelled {
			t.Errorf("result outcome %s reason %s (%s), want cancelled, CommandCancelled", result.Outcome, result.Reason, result.Message)
		}
	})

	t.Run("pod deleted while the lease is live", func(t *testing.T) {
		l := acquire(t)
		l.waitReady(t)
		zero := int64(0)
		if err := clustertest.Clientset(t).CoreV1().Pods(l.created.Namespace).Delete(t.Context(), l.created.WorkloadName, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		result, evs := waitResult(t, l)
		if result.Outcome != events.OutcomeFailed || result.Reason != events.ReasonPodDeleted || result.Agent != nil {
			t.Errorf("result outcome %s reason %s (%s) agent %+v, want failed, PodDeleted, no agent (none was recorded)", result.Outcome, result.Reason, result.Message, result.Agent)
		}
		if len(failedStatuses(evs)) == 0 {
			t.Error("no Failed status for a pod deleted under a live lease")
		}
		l.run.Release(l.ProviderLeaseID, true)
	})
}
