package runwatch

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// TestStepWorkersFollowManyRuns follows 1,000 live exec-capable runs through the watcher's
// step workers, as the informers hand their pods over: each is owned and has its Ready status,
// and an idle run holds no goroutine (issue 16: 10,022 goroutines at 9,955 runs, one per run).
// Runs whose pods go are finished and forgotten; the others stay followed.
func TestStepWorkersFollowManyRuns(t *testing.T) {
	const runs, ended = 1_000, 10
	h := newHarness(t)
	_, pods := withInformerCaches(t, h)
	ctx := t.Context()
	stop := h.w.startSteps(ctx)
	defer stop()

	refs := make([]events.RunRef, runs)
	all := make([]*corev1.Pod, runs)
	for i := range refs {
		runID := fmt.Sprintf("run-%04d", i)
		refs[i] = events.Ref(testCompany, runID)
		rec := lease.Record{RunID: runID, CompanyID: testCompany, Namespace: testNamespace, WorkloadName: "pc-" + runID,
			Backend: string(policy.BackendPod), State: lease.StateCreated}
		if _, _, err := h.d.leases.Create(ctx, rec); err != nil {
			t.Fatal(err)
		}
		all[i] = pod(corev1.PodRunning, corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}, func(p *corev1.Pod) {
			p.Name, p.Labels = "pc-"+runID, runLabels(runID)
			p.Spec.RestartPolicy = corev1.RestartPolicyAlways
			p.Status.PodIP = "10.0.0.7"
			p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		})
	}
	before := runtime.NumGoroutine()
	for _, p := range all {
		if err := pods.Add(p); err != nil {
			t.Fatal(err)
		}
		h.w.wake(ctx, h.d, p)
	}
	waitUntil(t, time.Minute, "every run owned", func() bool {
		for _, ref := range refs {
			if !h.d.owners.owns(ref) {
				return false
			}
		}
		return true
	})
	grown := runtime.NumGoroutine() - before
	t.Logf("%d goroutines more with %d runs followed", grown, runs)
	if grown > runs/10 {
		t.Errorf("%d more goroutines with %d idle runs followed", grown, runs)
	}
	for _, ref := range []events.RunRef{refs[0], refs[runs-1]} {
		got := runEvents[events.RunStatusEvent](t, h, ref.RunID, events.KindStatus)
		if len(got) != 1 || got[0].Phase != events.PhaseRunning || got[0].Reason != events.ReasonReady {
			t.Errorf("%s: status events %+v, want Running, Ready", ref.RunID, got)
		}
	}

	// Pods deleted under live leases: failed, and forgotten.
	for _, p := range all[:ended] {
		if err := pods.Delete(p); err != nil {
			t.Fatal(err)
		}
		h.w.wake(ctx, h.d, cache.DeletedFinalStateUnknown{Key: p.Namespace + "/" + p.Name, Obj: p})
	}
	waitUntil(t, time.Minute, "the runs whose pods went forgotten", func() bool {
		h.w.mu.Lock()
		defer h.w.mu.Unlock()
		return len(h.w.trackers) == runs-ended
	})
	for _, ref := range refs[:ended] {
		if got := runEvents[events.RunResultEvent](t, h, ref.RunID, events.KindResult); len(got) != 1 || got[0].Reason != events.ReasonPodDeleted {
			t.Errorf("%s: results %+v, want one, PodDeleted", ref.RunID, got)
		}
		if h.w.following(ref) || h.d.owners.owns(ref) {
			t.Errorf("%s is still followed or owned after its result", ref.RunID)
		}
	}
	if !h.w.following(refs[ended]) {
		t.Errorf("%s is no longer followed", refs[ended].RunID)
	}
}

// TestTrackerRecordsNameTheRun: a tracker's records, and its journal's, carry the run's id and
// company (added by a hook rather than held as the logger's context by every idle run).
func TestTrackerRecordsNameTheRun(t *testing.T) {
	var logged syncBuffer
	d := &deps{log: zerolog.New(&logged)}
	tr := newTracker(d, testNamespace, events.Ref(testCompany, "run-named"), func() {})
	tr.log.Info().Msg("from the tracker")
	newJournal(tr.ref, d.journalOptions(tr.log)).log.Warn().Msg("from the journal")
	for _, line := range strings.Split(strings.TrimSpace(logged.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		if rec[events.LogKeyRunID] != "run-named" || rec[events.LogKeyTenant] != testCompany {
			t.Errorf("record %s does not name the run", line)
		}
	}
	if n := strings.Count(logged.String(), "\n"); n != 2 {
		t.Errorf("%d records, want 2", n)
	}
}
