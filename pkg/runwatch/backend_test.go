package runwatch

import (
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// TestTrackerObservesThroughTheLeasesBackend: the tracker reads a run through the workload of
// its lease's backend (workload.For), chosen once. An exec-capable lease's Ready pod is
// reported Ready, and a Job that merely carries the run's labels does not decide it (only a
// Job backend's run has a Job). A lease naming a backend nobody knows is not followed.
func TestTrackerObservesThroughTheLeasesBackend(t *testing.T) {
	tests := []struct {
		backend    policy.Backend
		wantStatus []events.Phase // nil: nothing published
		wantReason string
	}{
		{backend: policy.BackendPod, wantStatus: []events.Phase{events.PhaseRunning}, wantReason: events.ReasonReady},
		{backend: policy.BackendSandboxCR, wantStatus: []events.Phase{events.PhaseRunning}, wantReason: events.ReasonReady},
		{backend: "deployment"},
	}
	for _, tc := range tests {
		t.Run(string(tc.backend), func(t *testing.T) {
			h := newHarness(t)
			jobs, pods := withInformerCaches(t, h)
			runID := "run-" + string(tc.backend)
			rec := lease.Record{RunID: runID, CompanyID: testCompany, Namespace: testNamespace, WorkloadName: "pc-x",
				Backend: string(tc.backend), State: lease.StateCreated}
			if _, _, err := h.d.leases.Create(t.Context(), rec); err != nil {
				t.Fatal(err)
			}
			stray := job(func(j *batchv1.Job) {
				j.Labels = runLabels(runID)
				j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "DeadlineExceeded"}}
			})
			ready := pod(corev1.PodRunning, corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}, func(p *corev1.Pod) {
				p.Name, p.Labels = "pc-x", runLabels(runID)
				p.Status.PodIP = "10.0.0.7"
				p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
			})
			if err := jobs.Add(stray); err != nil {
				t.Fatal(err)
			}
			if err := pods.Add(ready); err != nil {
				t.Fatal(err)
			}

			tr := newTracker(h.d, testNamespace, events.Ref(testCompany, runID), func() {})
			if err := tr.step(t.Context()); err != nil {
				t.Fatalf("step(): %v", err)
			}
			if tr.follow != nil {
				t.Error("a log follower runs; an exec-capable pod's log is sandboxd's own")
			}
			var phases []events.Phase
			for _, s := range runEvents[events.RunStatusEvent](t, h, runID, events.KindStatus) {
				phases = append(phases, s.Phase)
				if s.Reason != tc.wantReason {
					t.Errorf("status reason %q, want %q", s.Reason, tc.wantReason)
				}
			}
			if len(phases) != len(tc.wantStatus) || (len(phases) > 0 && phases[0] != tc.wantStatus[0]) {
				t.Errorf("status phases %v, want %v", phases, tc.wantStatus)
			}
			if got := runEvents[events.RunResultEvent](t, h, runID, events.KindResult); len(got) != 0 {
				t.Errorf("result events %+v, want none: the stray Job is not the run's", got)
			}
			if tc.wantStatus == nil && !tr.done {
				t.Error("the run of an unknown backend is still followed")
			}
		})
	}
}
