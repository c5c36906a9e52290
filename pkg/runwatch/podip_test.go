package runwatch

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// TestStatusCarriesThePodIP: a run's status names its pod's IP once the pod has one, and a pod
// that gets its IP after its status was published (same phase, same reason) is reported again,
// once: the credential broker binds the run's grants to the address the stream names.
func TestStatusCarriesThePodIP(t *testing.T) {
	h := newHarness(t)
	_, pods := withInformerCaches(t, h)
	const runID = "run-pod-ip"
	ctx := t.Context()
	if _, _, err := h.d.leases.Create(ctx, lease.Record{RunID: runID, CompanyID: testCompany, Namespace: testNamespace, WorkloadName: "pc-" + runID,
		Backend: string(policy.BackendPod), State: lease.StateCreated}); err != nil {
		t.Fatal(err)
	}
	tr := newTracker(h.d, testNamespace, events.Ref(testCompany, runID), func() {})
	p := pod(corev1.PodRunning, corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}, func(p *corev1.Pod) {
		p.Name, p.Labels = "pc-"+runID, runLabels(runID)
		p.Spec.RestartPolicy = corev1.RestartPolicyAlways
	})
	if err := pods.Add(p); err != nil {
		t.Fatal(err)
	}
	step := func() {
		t.Helper()
		if err := tr.step(ctx); err != nil {
			t.Fatalf("step() error: %v", err)
		}
	}
	step()
	withIP := p.DeepCopy()
	withIP.Status.PodIP = "10.244.0.17"
	if err := pods.Update(withIP); err != nil {
		t.Fatal(err)
	}
	step()
	step() // nothing new: no third status
	got := runEvents[events.RunStatusEvent](t, h, runID, events.KindStatus)
	var seen [][3]string
	for _, ev := range got {
		seen = append(seen, [3]string{string(ev.Phase), ev.Reason, ev.PodIP})
	}
	want := [][3]string{{"Running", "", ""}, {"Running", "", "10.244.0.17"}}
	if len(seen) != len(want) || seen[0] != want[0] || seen[1] != want[1] {
		t.Errorf("status events (phase, reason, podIp) = %v, want %v", seen, want)
	}
}
