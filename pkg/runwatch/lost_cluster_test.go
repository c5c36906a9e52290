package runwatch

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// TestReconcileWaitsForASandboxsPod: the lost-workload pass ended every run none of whose Jobs
// and pods it saw, so a Sandbox whose controller had not made its pod yet (the controller down
// for a minute) was reported lost, and then deleted as a run that failed before its agent ran.
// The pass now asks the lease's workload whether it is still there (a real Sandbox in the local
// cluster; the pass's caches are empty, so they hold no pod of it whether or not the cluster's
// agent-sandbox controller made one): only once it is gone is the run lost.
func TestReconcileWaitsForASandboxsPod(t *testing.T) {
	ctx := t.Context()
	cs, dyn := clusterClients(t)
	ns := clusterNamespace(ctx, t, cs)
	h := newHarness(t)
	withInformerCaches(t, h) // empty: no Job or pod of the run anywhere
	h.d.workloads = workload.Deps{Clientset: cs, Dynamic: dyn}

	const runID, name = "run-podless", "pc-podless"
	sandboxes := dyn.Resource(policy.SandboxGVR("")).Namespace(ns)
	sb := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": policy.SandboxAPIVersionV1beta1, "kind": policy.SandboxKind,
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{"podTemplate": map[string]any{"spec": map[string]any{
			"containers": []any{map[string]any{"name": "agent", "image": "kubeclip.local/sandbox:dev"}},
		}}},
	}}
	sb.SetLabels(runLabels(runID))
	if _, err := sandboxes.Create(ctx, sb, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the Sandbox: %v", err)
	}
	rec := lease.Record{RunID: runID, CompanyID: testCompany, Namespace: ns, WorkloadName: name,
		Backend: string(policy.BackendSandboxCR), State: lease.StateCreated, CreatedAt: clock().Add(-time.Hour)}
	if _, _, err := h.d.leases.Create(ctx, rec); err != nil {
		t.Fatal(err)
	}

	// Beside it, a pod lease whose pod is gone: lost at once.
	const podRunID = "run-podgone"
	podRec := rec
	podRec.RunID, podRec.WorkloadName, podRec.Backend = podRunID, "pc-podgone", string(policy.BackendPod)
	if _, _, err := h.d.leases.Create(ctx, podRec); err != nil {
		t.Fatal(err)
	}

	h.w.reconcile(ctx, h.d)
	if got := runEvents[events.RunResultEvent](t, h, runID, events.KindResult); len(got) != 0 {
		t.Fatalf("results %+v while the run's Sandbox waits for its pod, want none", got)
	}
	if got := runEvents[events.RunResultEvent](t, h, podRunID, events.KindResult); len(got) != 1 || got[0].Reason != events.ReasonWorkloadLost {
		t.Errorf("results of the pod lease whose pod is gone: %+v, want one, %s", got, events.ReasonWorkloadLost)
	}

	if err := sandboxes.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := sandboxes.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the Sandbox is not gone")
		case <-time.After(50 * time.Millisecond):
		}
	}
	h.w.reconcile(ctx, h.d)
	res := runEvents[events.RunResultEvent](t, h, runID, events.KindResult)
	if len(res) != 1 || res[0].Outcome != events.OutcomeFailed || res[0].Reason != events.ReasonWorkloadLost {
		t.Errorf("results %+v once the Sandbox is gone, want one, failed %s", res, events.ReasonWorkloadLost)
	}
}

// clusterClients are clients of the local cluster whose idle connections close when the test
// ends, so goleak sees no transport goroutine.
func clusterClients(t *testing.T) (kubernetes.Interface, dynamic.Interface) {
	t.Helper()
	cfg := clustertest.Config(t)
	t.Cleanup(func() {
		if probe, err := rest.HTTPClientFor(cfg); err == nil {
			probe.CloseIdleConnections() // clustertest.Config's readiness probe
		}
	})
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hc.CloseIdleConnections)
	cs, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfigAndClient(cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	return cs, dyn
}

// clusterNamespace creates a namespace for the test's objects and deletes it when the test ends.
func clusterNamespace(ctx context.Context, t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "runwatch-test-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := cs.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting namespace %s: %v", ns.Name, err)
		}
	})
	return ns.Name
}
