package runwatch

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// withInformerCaches gives the harness's trackers the indexers its informers would fill, and an
// ownership bucket, so tracker.step runs without a cluster.
func withInformerCaches(t *testing.T, h *harness) (jobs, pods cache.Indexer) {
	t.Helper()
	kv, err := h.js.CreateOrUpdateKeyValue(t.Context(), OwnershipBucketConfig(time.Minute, 1, 0))
	if err != nil {
		t.Fatalf("creating the ownership bucket: %v", err)
	}
	h.d.owners, err = newOwners(h.js.Conn(), kv, "replica-1", time.Minute, h.d.log)
	if err != nil {
		t.Fatal(err)
	}
	h.d.opts.StartErrorGrace = DefaultStartErrorGrace
	jobs = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{runIndex: indexByRun})
	pods = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{runIndex: indexByRun})
	h.d.cluster = &clusterCache{jobs: jobs, pods: pods}
	return jobs, pods
}

func runLabels(runID string) map[string]string {
	return policy.RunLabels(runID, "agent-1", testCompany, "claude_local")
}

// TestTrackerStepRunReleasedBeforeItStarted follows a run through the informer caches: nothing
// is published before its Job is seen, a start error within its grace is reported as Pending,
// and a Job that disappears after it was seen ends the run as cancelled, once.
func TestTrackerStepRunReleasedBeforeItStarted(t *testing.T) {
	h := newHarness(t)
	jobs, pods := withInformerCaches(t, h)
	const runID = "run-step"
	h.lease(t, runID)
	tr := newTracker(h.d, testNamespace, events.Ref(testCompany, runID), func() {})
	t.Cleanup(func() {
		if tr.recheck != nil {
			tr.recheck.Stop()
		}
	})
	step := func(what string) {
		t.Helper()
		if err := tr.step(t.Context()); err != nil {
			t.Fatalf("step() %s: %v", what, err)
		}
	}

	step("with neither Job nor pod")
	if tr.end != nil || tr.done || tr.seenJob {
		t.Fatalf("after a step with nothing seen: verdict %+v, done %v, seenJob %v; want none", tr.end, tr.done, tr.seenJob)
	}

	j := job(active)
	j.Labels = runLabels(runID)
	if err := jobs.Add(j); err != nil {
		t.Fatal(err)
	}
	step("with the Job")

	p := pod(corev1.PodPending, waiting("ImagePullBackOff"), startedAgo(time.Second))
	p.Labels = runLabels(runID)
	if err := pods.Add(p); err != nil {
		t.Fatal(err)
	}
	step("with a pod that cannot pull its image yet")
	step("again, unchanged")

	if err := jobs.Delete(j); err != nil {
		t.Fatal(err)
	}
	if err := pods.Delete(p); err != nil {
		t.Fatal(err)
	}
	step("after the Job and pod are gone")
	if !tr.done {
		t.Fatal("the run is not done after its Job was deleted")
	}
	step("once done")

	wantStatus := []events.RunStatusEvent{
		{RunID: runID, CompanyID: testCompany, Phase: events.PhasePending, Reason: "ImagePullBackOff",
			Message: `container "agent": ImagePullBackOff`, PodName: p.Name},
		{RunID: runID, CompanyID: testCompany, Phase: events.PhaseFailed, Reason: events.ReasonJobDeleted,
			Message: "the Job was deleted before the run finished"},
	}
	gotStatus := runEvents[events.RunStatusEvent](t, h, runID, events.KindStatus)
	if diff := cmp.Diff(wantStatus, gotStatus, cmpopts.IgnoreFields(events.RunStatusEvent{}, "At")); diff != "" {
		t.Errorf("status events (-want +got):\n%s", diff)
	}
	gotResults := runEvents[events.RunResultEvent](t, h, runID, events.KindResult)
	wantResults := []events.RunResultEvent{{
		RunID: runID, CompanyID: testCompany, Outcome: events.OutcomeCancelled,
		Reason: events.ReasonJobDeleted, Message: "the Job was deleted before the run finished",
	}}
	if diff := cmp.Diff(wantResults, gotResults, cmpopts.IgnoreFields(events.RunResultEvent{}, "At", "Agent")); diff != "" {
		t.Errorf("result events (-want +got):\n%s", diff)
	}
	if h.d.owners.owns(events.Ref(testCompany, runID)) {
		t.Error("the replica still owns the finished run")
	}

	// A restarted watcher finds the result and publishes nothing more, whatever the caches say.
	again := newTracker(h.d, testNamespace, events.Ref(testCompany, runID), func() {})
	if err := jobs.Add(j); err != nil {
		t.Fatal(err)
	}
	if err := again.step(t.Context()); err != nil {
		t.Fatalf("step() of a restarted tracker: %v", err)
	}
	if !again.done {
		t.Error("a tracker of a run with a published result is not done")
	}
	if got := runEvents[events.RunResultEvent](t, h, runID, events.KindResult); len(got) != 1 {
		t.Errorf("%d result events after the restart, want 1", len(got))
	}
	if got := runEvents[events.RunStatusEvent](t, h, runID, events.KindStatus); len(got) != len(wantStatus) {
		t.Errorf("%d status events after the restart, want %d", len(got), len(wantStatus))
	}
}
