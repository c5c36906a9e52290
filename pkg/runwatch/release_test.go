package runwatch

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// execLease records a created pod-backend lease for runID.
func (h *harness) execLease(t *testing.T, runID string) events.RunRef {
	t.Helper()
	rec := lease.Record{RunID: runID, CompanyID: testCompany, Namespace: testNamespace, WorkloadName: "pc-" + runID,
		Backend: string(policy.BackendPod), State: lease.StateCreated, CreatedAt: clock().Add(-time.Hour)}
	if _, _, err := h.d.leases.Create(t.Context(), rec); err != nil {
		t.Fatalf("creating the lease of %s: %v", runID, err)
	}
	return rec.Ref()
}

// agentExecEvents publishes a recorded agent exec's output and, when account is set, its final
// event with that account, as the exec-worker does.
func (h *harness) agentExecEvents(t *testing.T, ref events.RunRef, account *events.AgentResult) {
	t.Helper()
	h.publish(t, events.RunExecEvent{RunID: ref.RunID, CompanyID: ref.CompanyID, ExecID: "01AGENT", Seq: 1, Command: "claude",
		Stream: events.ExecStdout, Text: `{"type":"system","subtype":"init","session_id":"s-1"}` + "\n"})
	if account != nil {
		exit := 0
		h.publish(t, events.RunExecEvent{RunID: ref.RunID, CompanyID: ref.CompanyID, ExecID: "01AGENT", Seq: 3, Command: "claude",
			Exit: &events.ExecExit{ExitCode: &exit}, Agent: account})
	}
}

// TestTrackerStepRelease follows an exec-capable lease's run through its release: the pod
// deleted by the release says Releasing, the pod gone ends the run released with the agent
// exec's exit code and account (no Failed status), or cancelled when the agent's exec was cut;
// a pod deleted under a live lease fails the run.
func TestTrackerStepRelease(t *testing.T) {
	cost := 0.0123
	account := &events.AgentResult{SessionID: "s-1", Model: "claude-stub", Usage: &events.AgentUsage{InputTokens: 5, OutputTokens: 7}, CostUSD: &cost, Summary: "done"}
	exit0 := 0
	tests := []struct {
		name       string
		release    *events.LeaseKind // nil: the pod is deleted under the live lease
		reusable   bool              // a reusable lease, released (retained) then suspended
		resumed    bool              // and resumed while its suspend deleted its pod
		cancel     bool
		account    *events.AgentResult // nil: the agent's exec has no final event
		vanish     bool                // the pod goes with no grace period: no deletionTimestamp seen
		wantStatus []events.RunStatusEvent
		wantResult events.RunResultEvent
	}{
		{
			name: "released after the agent's exec", release: ptrTo(events.LeaseRelease), account: account,
			wantStatus: []events.RunStatusEvent{
				{Phase: events.PhaseRunning, Reason: events.ReasonReady},
				{Phase: events.PhaseRunning, Reason: events.ReasonReleasing, Message: "the lease is being released: its pod ends once its commands finish"},
				{Phase: events.PhaseSucceeded, Reason: events.ReasonReleased, Message: "the lease was released"},
			},
			wantResult: events.RunResultEvent{Outcome: events.OutcomeReleased, Reason: events.ReasonReleased, Message: "the lease was released", ExitCode: &exit0, Agent: account},
		},
		{
			name: "released with cancelActiveWork while the agent ran", release: ptrTo(events.LeaseRelease), cancel: true,
			wantStatus: []events.RunStatusEvent{
				{Phase: events.PhaseRunning, Reason: events.ReasonReady},
				{Phase: events.PhaseRunning, Reason: events.ReasonReleasing, Message: "the lease is being released: its running commands are cancelled"},
				{Phase: events.PhaseFailed, Reason: events.ReasonCommandCancelled, Message: "the lease was released while its agent's command (exec 01AGENT) ran"},
			},
			wantResult: events.RunResultEvent{Outcome: events.OutcomeCancelled, Reason: events.ReasonCommandCancelled, Message: "the lease was released while its agent's command (exec 01AGENT) ran"},
		},
		{
			name: "reusable lease suspended after its release", reusable: true, account: account,
			wantStatus: []events.RunStatusEvent{
				{Phase: events.PhaseRunning, Reason: events.ReasonReady},
				{Phase: events.PhaseRunning, Reason: events.ReasonReleasing, Message: "the lease is being released: its pod ends once its commands finish"},
				{Phase: events.PhaseSucceeded, Reason: events.ReasonReleased, Message: "the lease was released"},
			},
			wantResult: events.RunResultEvent{Outcome: events.OutcomeReleased, Reason: events.ReasonReleased, Message: "the lease was released", ExitCode: &exit0, Agent: account},
		},
		{
			// The host resumed the lease while its suspend waited for the pod to go: the record
			// says resuming (a new pod comes) when the watcher sees the old one gone.
			name: "reusable lease resumed while its suspend deleted its pod", reusable: true, resumed: true, account: account,
			wantStatus: []events.RunStatusEvent{
				{Phase: events.PhaseRunning, Reason: events.ReasonReady},
				{Phase: events.PhaseRunning, Reason: events.ReasonReleasing, Message: "the lease is being released: its pod ends once its commands finish"},
				{Phase: events.PhaseSucceeded, Reason: events.ReasonReleased, Message: "the lease was released"},
			},
			wantResult: events.RunResultEvent{Outcome: events.OutcomeReleased, Reason: events.ReasonReleased, Message: "the lease was released", ExitCode: &exit0, Agent: account},
		},
		{
			name: "pod deleted under the live lease", account: account,
			wantStatus: []events.RunStatusEvent{
				{Phase: events.PhaseRunning, Reason: events.ReasonReady},
				{Phase: events.PhaseFailed, Reason: events.ReasonPodDeleted, Message: "the pod was deleted before the run finished"},
			},
			wantResult: events.RunResultEvent{Outcome: events.OutcomeFailed, Reason: events.ReasonPodDeleted, Message: "the pod was deleted before the run finished"},
		},
		{
			name: "pod deleted with no grace period under the live lease", account: account, vanish: true,
			wantStatus: []events.RunStatusEvent{
				{Phase: events.PhaseRunning, Reason: events.ReasonReady},
				{Phase: events.PhaseFailed, Reason: events.ReasonPodDeleted, Message: "the pod was deleted before the run finished"},
			},
			wantResult: events.RunResultEvent{Outcome: events.OutcomeFailed, Reason: events.ReasonPodDeleted, Message: "the pod was deleted before the run finished"},
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			_, pods := withInformerCaches(t, h)
			runID := "run-rel-" + string(rune('a'+i))
			ref := h.execLease(t, runID)
			if tc.reusable {
				if _, err := h.d.leases.Modify(t.Context(), ref, func(r *lease.Record) (bool, error) { r.Reusable = true; return true, nil }); err != nil {
					t.Fatal(err)
				}
			}
			tr := newTracker(h.d, testNamespace, ref, func() {})
			step := func(what string) {
				t.Helper()
				if err := tr.step(t.Context()); err != nil {
					t.Fatalf("step() %s: %v", what, err)
				}
			}

			p := pod(corev1.PodRunning, corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}, func(p *corev1.Pod) {
				p.Name, p.Labels = "pc-"+runID, runLabels(runID)
				p.Status.PodIP = "10.0.0.7"
				p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
			})
			if err := pods.Add(p); err != nil {
				t.Fatal(err)
			}
			step("with the ready pod")
			h.agentExecEvents(t, ref, tc.account)

			if tc.release != nil {
				if _, err := h.d.leases.Modify(t.Context(), ref, lease.BeginRelease(*tc.release, tc.cancel)); err != nil {
					t.Fatal(err)
				}
			}
			if tc.reusable {
				// The host's release keeps the lease; the idle window over, a suspend deletes its pod.
				steps := []func(*lease.Record) (bool, error){lease.Release(now, false), lease.BeginSuspend(now, 0)}
				if tc.resumed {
					steps = append(steps, lease.Resume(now))
				}
				for _, step := range steps {
					if _, err := h.d.leases.Modify(t.Context(), ref, step); err != nil {
						t.Fatal(err)
					}
				}
			}
			deleting := p.DeepCopy()
			if !tc.vanish {
				ts := metav1.NewTime(now)
				deleting.DeletionTimestamp = &ts
				if err := pods.Update(deleting); err != nil {
					t.Fatal(err)
				}
				step("with the pod being deleted")
			}
			if err := pods.Delete(deleting); err != nil {
				t.Fatal(err)
			}
			step("with the pod gone")
			if !tr.done {
				t.Fatal("the run is not done once its pod is gone")
			}

			for i := range tc.wantStatus {
				// Every status names the pod's IP, the last one known once the pod is gone.
				tc.wantStatus[i].RunID, tc.wantStatus[i].CompanyID, tc.wantStatus[i].PodIP = runID, testCompany, "10.0.0.7"
			}
			gotStatus := runEvents[events.RunStatusEvent](t, h, runID, events.KindStatus)
			if diff := cmp.Diff(tc.wantStatus, gotStatus, cmpopts.IgnoreFields(events.RunStatusEvent{}, "At", "PodName")); diff != "" {
				t.Errorf("status events (-want +got):\n%s", diff)
			}
			tc.wantResult.RunID, tc.wantResult.CompanyID = runID, testCompany
			got := runEvents[events.RunResultEvent](t, h, runID, events.KindResult)
			if len(got) != 1 {
				t.Fatalf("%d results, want 1", len(got))
			}
			// An exec lease's agent account is its recorded exec's, or none: never a parse of
			// sandboxd's container log.
			if diff := cmp.Diff(tc.wantResult, got[0], cmpopts.IgnoreFields(events.RunResultEvent{}, "At")); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
		})
	}
}

func ptrTo[T any](v T) *T { return &v }

// TestReconcileReleasedExecLease: an exec-capable lease released while no watcher followed it
// ends as released with its agent exec's account, as a followed one does (verdict.Released).
func TestReconcileReleasedExecLease(t *testing.T) {
	h := newHarness(t)
	withInformerCaches(t, h)
	cost := 0.5
	account := &events.AgentResult{SessionID: "s-1", Model: "m", CostUSD: &cost, Summary: "done"}
	ref := h.execLease(t, "run-lost")
	h.agentExecEvents(t, ref, account)
	if _, err := h.d.leases.Modify(t.Context(), ref, lease.BeginRelease(events.LeaseRelease, false)); err != nil {
		t.Fatal(err)
	}
	h.w.reconcile(t.Context(), h.d)
	res := runEvents[events.RunResultEvent](t, h, ref.RunID, events.KindResult)
	if len(res) != 1 || res[0].Outcome != events.OutcomeReleased || !cmp.Equal(res[0].Agent, account) {
		t.Errorf("results %+v, want one, released, with the agent exec's account", res)
	}
	st := runEvents[events.RunStatusEvent](t, h, ref.RunID, events.KindStatus)
	if len(st) != 1 || st[0].Phase != events.PhaseSucceeded || st[0].Reason != events.ReasonReleased {
		t.Errorf("statuses %+v, want one, Succeeded/Released", st)
	}
}

// TestLeaseReleaseWithoutRecord: a run whose lease record is gone (the bucket's TTL) has no
// release to go by, rather than an error the tracker would retry forever.
func TestLeaseReleaseWithoutRecord(t *testing.T) {
	h := newHarness(t)
	r, err := leaseRelease(t.Context(), h.d, events.Ref(testCompany, "run-no-record"))
	if r != nil || err != nil {
		t.Errorf("leaseRelease() = %+v, %v; want nil, nil", r, err)
	}
}
