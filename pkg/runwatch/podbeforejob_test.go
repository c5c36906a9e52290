package runwatch

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// TestTrackerStepWaitsForTheJob: a pod whose Job the informer has not delivered yet (and never
// did) publishes nothing: no status and, above all, no cancelled result.
func TestTrackerStepWaitsForTheJob(t *testing.T) {
	h := newHarness(t)
	_, pods := withInformerCaches(t, h)
	const runID = "run-no-job"
	h.lease(t, runID)
	tr := newTracker(h.d, testNamespace, events.Ref(testCompany, runID), func() {})

	if err := tr.step(t.Context()); err != nil {
		t.Fatalf("step() error: %v", err)
	}
	p := pod(corev1.PodPending, waiting("ContainerCreating"))
	p.Labels = runLabels(runID)
	yes := true
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "pc-run", UID: "job-uid", Controller: &yes}}
	if err := pods.Add(p); err != nil {
		t.Fatal(err)
	}
	if err := tr.step(t.Context()); err != nil {
		t.Fatalf("step() error: %v", err)
	}
	if tr.done || tr.end != nil {
		t.Errorf("done %v, verdict %+v; want neither before the Job was seen", tr.done, tr.end)
	}
	for _, kind := range []events.RunKind{events.KindStatus, events.KindResult} {
		if got := runEvents[events.RunStatusEvent](t, h, runID, kind); len(got) != 0 {
			t.Errorf("%d %s events published, want 0", len(got), kind)
		}
	}
}

// TestTrackerStepPodWithoutJob: a run whose pod no Job controls (a Sandbox's) is decided by its
// pod alone; it is not taken for a released Job.
func TestTrackerStepPodWithoutJob(t *testing.T) {
	h := newHarness(t)
	_, pods := withInformerCaches(t, h)
	const runID = "run-sandbox"
	h.lease(t, runID)
	tr := newTracker(h.d, testNamespace, events.Ref(testCompany, runID), func() {})
	p := pod(corev1.PodPending, waiting("ErrImageNeverPull"))
	p.Labels = runLabels(runID)
	if err := pods.Add(p); err != nil {
		t.Fatal(err)
	}
	if err := tr.step(t.Context()); err != nil {
		t.Fatalf("step() error: %v", err)
	}
	got := runEvents[events.RunResultEvent](t, h, runID, events.KindResult)
	if len(got) != 1 || got[0].Outcome != events.OutcomeFailed || got[0].Reason != "ErrImageNeverPull" {
		t.Errorf("result events = %+v, want one failed with ErrImageNeverPull", got)
	}
}

// TestTrackerIgnoresRunsWithoutALease: a run leased by another kubeclip installation sharing
// the cluster (no lease in this installation's bucket) is neither followed nor given a result.
func TestTrackerIgnoresRunsWithoutALease(t *testing.T) {
	h := newHarness(t)
	_, pods := withInformerCaches(t, h)
	const runID = "run-elsewhere"
	tr := newTracker(h.d, testNamespace, events.Ref(testCompany, runID), func() {})
	p := pod(corev1.PodPending, waiting("ErrImageNeverPull"))
	p.Labels = runLabels(runID)
	if err := pods.Add(p); err != nil {
		t.Fatal(err)
	}
	if err := tr.step(t.Context()); err != nil {
		t.Fatalf("step() error: %v", err)
	}
	if !tr.done || tr.d.owners.owns(events.Ref(testCompany, runID)) {
		t.Errorf("done %v, owned %v; want the run ignored without claiming it", tr.done, tr.d.owners.owns(events.Ref(testCompany, runID)))
	}
	for _, kind := range []events.RunKind{events.KindStatus, events.KindResult} {
		if got := runEvents[events.RunResultEvent](t, h, runID, kind); len(got) != 0 {
			t.Errorf("%d %s events published for another installation's run", len(got), kind)
		}
	}
}

// TestTrackerWaitsForTheDispatch: a warm pod an acquire claimed carries the run's labels a moment
// before the dispatcher's dispatch transition names its backend in the lease record. The
// tracker neither drops the run nor publishes anything meanwhile; it looks again by itself, and
// follows the run once the record names its workload.
func TestTrackerWaitsForTheDispatch(t *testing.T) {
	h := newHarness(t)
	_, pods := withInformerCaches(t, h)
	const runID = "run-warm"
	ref := events.Ref(testCompany, runID)
	if _, _, err := h.d.leases.Create(t.Context(), lease.Record{RunID: runID, CompanyID: testCompany, State: lease.StateRequested}); err != nil {
		t.Fatal(err)
	}
	woken := make(chan struct{}, 8)
	tr := newTracker(h.d, testNamespace, ref, func() { woken <- struct{}{} })
	p := pod(corev1.PodRunning, corev1.ContainerState{Running: &corev1.ContainerStateRunning{}})
	p.Labels = runLabels(runID)
	if err := pods.Add(p); err != nil {
		t.Fatal(err)
	}
	if err := tr.step(t.Context()); err != nil {
		t.Fatalf("step() error: %v", err)
	}
	if tr.done || tr.ours {
		t.Fatalf("done %v, ours %v before the lease was dispatched; want the run kept and not yet followed", tr.done, tr.ours)
	}
	select {
	case <-woken:
	case <-time.After(5 * time.Second):
		t.Fatal("the tracker did not look again by itself")
	}
	if _, err := h.d.leases.Modify(t.Context(), ref, lease.Dispatch(lease.Workload{Namespace: testNamespace, Name: p.Name, SecretName: p.Name + "-env", Backend: string(policy.BackendPod), Warm: true})); err != nil {
		t.Fatal(err)
	}
	if err := tr.step(t.Context()); err != nil {
		t.Fatalf("step() error: %v", err)
	}
	if tr.done || !tr.ours || tr.workload == nil || tr.workload.Backend() != policy.BackendPod {
		t.Fatalf("done %v, ours %v, workload %v once dispatched; want the pod lease followed", tr.done, tr.ours, tr.workload)
	}
}
