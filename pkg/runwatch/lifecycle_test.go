package runwatch

import (
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	k8sfake "k8s.io/client-go/kubernetes/fake"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// lifecycleRecorder is an Observer that records what LifecycleObserver is told.
type lifecycleRecorder struct {
	mu        sync.Mutex
	ready     []time.Duration
	takeovers int
}

func (*lifecycleRecorder) EventPublished(events.Publication) {}
func (*lifecycleRecorder) RunsInFlight(int)                  {}
func (r *lifecycleRecorder) RunReady(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ready = append(r.ready, d)
}

func (r *lifecycleRecorder) RunTakenOver() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.takeovers++
}

func (r *lifecycleRecorder) seen() ([]time.Duration, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.ready...), r.takeovers
}

// TestTrackerReportsReadyAndTakeover: the replica that publishes a run's first status with the
// agent's container started reports how long it was since the acquire (the lease record's
// creation), once; a tracker that starts on a run whose status someone already published (a
// restart, another replica) counts a takeover and does not report the run ready again.
func TestTrackerReportsReadyAndTakeover(t *testing.T) {
	h := newHarness(t)
	jobs, pods := withInformerCaches(t, h)
	obs := &lifecycleRecorder{}
	h.d.opts.Observer = obs
	h.d.opts.Clientset = k8sfake.NewClientset() // the running pod's log follower reads its (fake) log
	const runID = "run-ready"
	ref := events.Ref(testCompany, runID)
	if _, _, err := h.d.leases.Create(t.Context(), lease.Record{
		RunID: runID, CompanyID: testCompany, Namespace: testNamespace, Backend: string(policy.BackendJob),
		State: lease.StateCreated, CreatedAt: now.Add(-12 * time.Second),
	}); err != nil {
		t.Fatal(err)
	}
	stepped := func(tr *tracker, what string) {
		t.Helper()
		if err := tr.step(t.Context()); err != nil {
			t.Fatalf("step() %s: %v", what, err)
		}
	}
	stop := func(tr *tracker) {
		if tr.follow != nil {
			tr.follow.stopAndWait()
		}
		if tr.recheck != nil {
			tr.recheck.Stop()
		}
		if tr.journal != nil {
			tr.journal.stop()
		}
	}

	tr := newTracker(h.d, testNamespace, ref, func() {})
	t.Cleanup(func() { stop(tr) })
	j := job(active)
	j.Labels = runLabels(runID)
	if err := jobs.Add(j); err != nil {
		t.Fatal(err)
	}
	p := pod(corev1.PodPending, waiting("ContainerCreating"), startedAgo(time.Second))
	p.Labels = runLabels(runID)
	if err := pods.Add(p); err != nil {
		t.Fatal(err)
	}
	stepped(tr, "with the pod pending")
	if ready, takeovers := obs.seen(); len(ready) != 0 || takeovers != 0 {
		t.Fatalf("pending: ready %v, takeovers %d; want neither", ready, takeovers)
	}
	running := pod(corev1.PodRunning, corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}, startedAgo(time.Second))
	running.Labels = runLabels(runID)
	if err := pods.Update(running); err != nil {
		t.Fatal(err)
	}
	stepped(tr, "with the pod running")
	stepped(tr, "again, unchanged")
	if ready, takeovers := obs.seen(); !cmp.Equal(ready, []time.Duration{12 * time.Second}) || takeovers != 0 {
		t.Fatalf("running: ready %v, takeovers %d; want [12s] and none", ready, takeovers)
	}

	// The replica restarts: its new tracker continues the run another process followed.
	stop(tr)
	h.d.owners.release(t.Context(), ref)
	again := newTracker(h.d, testNamespace, ref, func() {})
	t.Cleanup(func() { stop(again) })
	stepped(again, "after a restart")
	if ready, takeovers := obs.seen(); len(ready) != 1 || takeovers != 1 {
		t.Errorf("after a restart: ready %v, takeovers %d; want the one ready and 1 takeover", ready, takeovers)
	}
}

// TestTrackerReportsAQuickRunReady: a run over before the watcher first looked (its first
// status is its end) started all the same: it is reported ready.
func TestTrackerReportsAQuickRunReady(t *testing.T) {
	h := newHarness(t)
	jobs, pods := withInformerCaches(t, h)
	obs := &lifecycleRecorder{}
	h.d.opts.Observer = obs
	h.d.opts.Clientset = k8sfake.NewClientset() // the finished pod's log is read (fake)
	const runID = "run-quick"
	ref := events.Ref(testCompany, runID)
	if _, _, err := h.d.leases.Create(t.Context(), lease.Record{
		RunID: runID, CompanyID: testCompany, Namespace: testNamespace, Backend: string(policy.BackendJob),
		State: lease.StateCreated, CreatedAt: now.Add(-3 * time.Second),
	}); err != nil {
		t.Fatal(err)
	}
	j := job(active)
	j.Labels = runLabels(runID)
	p := pod(corev1.PodSucceeded, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{Reason: "Completed"}}, startedAgo(time.Second))
	p.Labels = runLabels(runID)
	if err := jobs.Add(j); err != nil {
		t.Fatal(err)
	}
	if err := pods.Add(p); err != nil {
		t.Fatal(err)
	}
	tr := newTracker(h.d, testNamespace, ref, func() {})
	t.Cleanup(func() {
		if tr.follow != nil {
			tr.follow.stopAndWait()
		}
		if tr.recheck != nil {
			tr.recheck.Stop()
		}
	})
	if err := tr.step(t.Context()); err != nil {
		t.Fatal(err)
	}
	if ready, _ := obs.seen(); !cmp.Equal(ready, []time.Duration{3 * time.Second}) {
		t.Errorf("ready %v, want [3s]", ready)
	}
}
