package runwatch

import (
	"errors"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/runwatch/verdict"
)

// TestStatusIsFenced is issue 8.12: a replica that lost a run without noticing (paused, cut
// off from NATS) appended a stale status after the new owner's. Status publishes expect the
// run's last status to be the one the replica knows, as log chunks do.
func TestStatusIsFenced(t *testing.T) {
	h := newHarness(t)
	const runID = "run-fence"
	h.lease(t, runID)
	stale := h.tracker(t, runID)
	owner := h.tracker(t, runID)
	ctx := t.Context()
	if err := stale.publishStatus(ctx, verdict.Decision{Phase: events.PhaseRunning}, nil); err != nil {
		t.Fatalf("first owner's status: %v", err)
	}
	// The run moves to another replica, which reads the history and goes on.
	if err := owner.load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := owner.publishStatus(ctx, verdict.Decision{Phase: events.PhaseSucceeded, Reason: "Completed"}, nil); err != nil {
		t.Fatalf("new owner's status: %v", err)
	}
	// The paused first owner wakes up and reports what it saw last.
	err := stale.publishStatus(ctx, verdict.Decision{Phase: events.PhaseFailed, Reason: "Error"}, nil)
	if !errors.Is(err, errFenced) {
		t.Fatalf("stale owner's status: error %v, want errFenced", err)
	}
	var phases []events.Phase
	for _, st := range runEvents[events.RunStatusEvent](t, h, runID, events.KindStatus) {
		phases = append(phases, st.Phase)
	}
	if len(phases) != 2 || phases[1] != events.PhaseSucceeded {
		t.Errorf("status phases %v, want [Running Succeeded]: nothing after the new owner's", phases)
	}
}

// TestQuotaRefusalFailsTheRun is issue 8.11: a Job whose pod the tenant's ResourceQuota refuses
// sat silent until its deadline, holding its agent. The Job controller's FailedCreate event
// fails the run at once, naming the quota.
func TestQuotaRefusalFailsTheRun(t *testing.T) {
	tr, _ := newDecideTracker(t)
	tr.d.cluster.jobEvents = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{jobEventIndex: indexByJob})
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "pc-q", Namespace: "paperclip-acme", UID: types.UID("job-uid"), Labels: runLabels("run-1")}}
	event := func(name string, uid types.UID, msg string) *corev1.Event {
		return &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{Name: name, Namespace: "paperclip-acme"},
			InvolvedObject: corev1.ObjectReference{Kind: "Job", Namespace: "paperclip-acme", Name: "pc-q", UID: uid},
			Reason:         "FailedCreate", Message: msg,
		}
	}
	d := tr.decide(job, nil, nil)
	if d.End != nil || d.Phase != events.PhasePending {
		t.Fatalf("before any event: phase %s, verdict %+v; want Pending, none", d.Phase, d.End)
	}
	// An older Job of the same name, and a refusal that is not the quota's, change nothing.
	for _, ev := range []*corev1.Event{
		event("old", "old-uid", `Error creating: pods "pc-q-1" is forbidden: exceeded quota: paperclip-quota, requested: pods=1, used: pods=20, limited: pods=20`),
		event("psa", "job-uid", `Error creating: pods "pc-q-2" is forbidden: violates PodSecurity "restricted:latest"`),
	} {
		if err := tr.d.cluster.jobEvents.Add(ev); err != nil {
			t.Fatal(err)
		}
	}
	if d := tr.decide(job, nil, nil); d.End != nil {
		t.Fatalf("verdict %+v from an unrelated refusal", d.End)
	}
	if err := tr.d.cluster.jobEvents.Add(event("quota", "job-uid", `Error creating: pods "pc-q-3" is forbidden: exceeded quota: paperclip-quota, requested: pods=1, used: pods=20, limited: pods=20`)); err != nil {
		t.Fatal(err)
	}
	d = tr.decide(job, nil, nil)
	want := "the tenant's ResourceQuota paperclip-quota refuses the run (requested: pods=1, used: pods=20, limited: pods=20)"
	if d.Phase != events.PhaseFailed || d.Reason != events.ReasonQuotaExceeded || d.Message != want || d.End == nil || d.End.Outcome != events.OutcomeFailed {
		t.Errorf("decide = %s, %s, %q, %+v; want Failed, QuotaExceeded, %q", d.Phase, d.Reason, d.Message, d.End, want)
	}
}

// TestReconcileSkipsRunsItFollows is issue 8.12: reconcile built a second tracker for a run
// this replica follows and published failed/WorkloadLost for a run that was being released.
func TestReconcileSkipsRunsItFollows(t *testing.T) {
	h := newHarness(t)
	withInformerCaches(t, h)
	const runID = "run-rec"
	ctx := t.Context()
	created := lease.Record{RunID: runID, CompanyID: testCompany, Namespace: testNamespace, WorkloadName: "pc-rec",
		State: lease.StateCreated, CreatedAt: clock().Add(-time.Hour)}
	if _, _, err := h.d.leases.Create(ctx, created); err != nil {
		t.Fatal(err)
	}
	ref := events.Ref(testCompany, runID)
	h.w.trackers[ref] = newTracker(h.d, testNamespace, ref, func() {})
	h.w.reconcile(ctx, h.d)
	if got := runEvents[events.RunResultEvent](t, h, runID, events.KindResult); len(got) != 0 {
		t.Fatalf("reconcile published %+v for a run this replica follows", got)
	}

	// Once nobody follows it and its lease was released, the run was cancelled, not lost.
	delete(h.w.trackers, ref)
	if _, err := h.d.leases.Modify(ctx, ref, lease.BeginRelease(events.LeaseRelease, false)); err != nil {
		t.Fatal(err)
	}
	h.w.reconcile(ctx, h.d)
	res := runEvents[events.RunResultEvent](t, h, runID, events.KindResult)
	if len(res) != 1 || res[0].Outcome != events.OutcomeCancelled {
		t.Errorf("results %+v, want one, cancelled", res)
	}
}
