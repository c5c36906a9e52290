package dispatch

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/rs/zerolog"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// TestReconcileTreatsEveryBackendAlike is issue 19 item 1: the reconcile pass listed Jobs and
// bare Pods only, so an orphaned Sandbox waited for its shutdownTime while orphaned Jobs and Pods
// went on the next pass. Each backend's workload is made by hand in the local cluster, with the
// lease record the case needs, and one pass runs. The pass lists the whole cluster, so the
// orphan policy stays report: other tests' workloads (with no lease in this test's NATS) are
// only logged.
//
// Issue 16: the pass lists pages of 2, fewer than each backend's workloads here (the pass held
// every managed pod of a 10,000-pod cluster in full, 410 MiB); every orphan is still found, no
// live workload touched, and the API server answered more than one page per backend.
func TestReconcileTreatsEveryBackendAlike(t *testing.T) {
	ctx := t.Context()
	cs, dyn, _ := clusterClients(t)
	md, pages := countingMetadataClient(t, "2")
	ns := testNamespace(ctx, t, cs)
	_, _, js := natstest.Start(t)
	if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := lease.EnsureBuckets(ctx, js, lease.BucketOptions{}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	records := lease.Records{KV: kv}

	type workloadCase struct {
		name     string
		state    lease.State // "" for no lease at all
		other    bool        // the lease names another workload
		wantGone bool
	}
	cases := []workloadCase{
		{name: "released", state: lease.StateReleased, wantGone: true},
		{name: "failed", state: lease.StateFailed, wantGone: true},
		{name: "replaced", state: lease.StateCreated, other: true, wantGone: true},
		{name: "live", state: lease.StateCreated},
		{name: "no-lease"}, // orphan policy report: left for the operator
	}
	company := "co-" + strings.ToLower(ulid.Make().String())
	type made struct {
		backend policy.Backend
		tc      workloadCase
		name    string
	}
	var all []made
	for _, backend := range []policy.Backend{policy.BackendJob, policy.BackendPod, policy.BackendSandboxCR} {
		for _, tc := range cases {
			name := policy.WorkloadName(ulid.Make())
			runID := "run-" + strings.ToLower(ulid.Make().String())
			if tc.state != "" {
				rec := lease.Record{
					RunID: runID, CompanyID: company, State: tc.state, Namespace: ns,
					WorkloadName: name, Backend: string(backend), CreatedAt: time.Now(),
				}
				if tc.other {
					rec.WorkloadName = policy.WorkloadName(ulid.Make())
				}
				if _, _, err := records.Create(ctx, rec); err != nil {
					t.Fatal(err)
				}
			}
			createWorkload(ctx, t, cs, dyn, backend, ns, name, policy.RunLabels(runID, "agent", company, "claude_local"))
			all = append(all, made{backend, tc, name})
		}
	}

	applier, err := k8s.NewApplier(k8s.ApplierOptions{Dynamic: dyn, Mapper: k8s.NewRESTMapper(cs.Discovery())})
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(Options{
		Clientset: cs, Dynamic: dyn, Metadata: md, Applier: applier, JetStream: js, Logger: zerolog.New(zerolog.NewTestWriter(t)),
		OrphanPolicy: OrphanReport, ReconcilePageSize: 2,
		// Past the grace that spares young workloads a release may be deleting now.
		Now: func() time.Time { return time.Now().Add(orphanGrace + time.Minute) },
	})
	if err != nil {
		t.Fatal(err)
	}
	d.records = records
	if err := d.reconcile(ctx); err != nil {
		t.Fatalf("reconcile: %v", err)
	}

	for _, m := range all {
		gone := workloadGoing(ctx, t, cs, dyn, m.backend, ns, m.name)
		if gone != m.tc.wantGone {
			t.Errorf("%s %s (%s): deleted by the pass = %v, want %v", m.backend, m.tc.name, m.name, gone, m.tc.wantGone)
		}
	}
	// Each backend has len(cases) workloads here alone: at least that many halved pages each.
	if want := int64(3 * (len(cases)/2 + 1)); pages.Load() < want {
		t.Errorf("the pass asked for %d pages of 2, want at least %d", pages.Load(), want)
	}
}

// countingMetadataClient is a metadata client of the local cluster that counts its LIST requests
// for pages of limit.
func countingMetadataClient(t *testing.T, limit string) (metadata.Interface, *atomic.Int64) {
	t.Helper()
	cfg := clustertest.Config(t)
	pages := new(atomic.Int64)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodGet && r.URL.Query().Get("limit") == limit {
				pages.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hc.CloseIdleConnections)
	md, err := metadata.NewForConfigAndClient(cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	return md, pages
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// clusterClients are clients of the local cluster whose idle connections close when the test
// ends, so goleak sees no transport goroutine.
func clusterClients(t *testing.T) (kubernetes.Interface, dynamic.Interface, metadata.Interface) {
	t.Helper()
	cfg := clustertest.Config(t)
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hc.CloseIdleConnections)
	t.Cleanup(func() {
		if probe, err := rest.HTTPClientFor(cfg); err == nil {
			probe.CloseIdleConnections() // clustertest.Config's readiness probe
		}
	})
	cs, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfigAndClient(cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	md, err := metadata.NewForConfigAndClient(cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	return cs, dyn, md
}

// testNamespace creates a namespace for the test's workloads and deletes it when the test ends.
func testNamespace(ctx context.Context, t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		GenerateName: "dispatch-test-",
		Labels:       map[string]string{"pod-security.kubernetes.io/enforce": "restricted"},
	}}, metav1.CreateOptions{})
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
	_, err = cs.CoreV1().ServiceAccounts(ns.Name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating default service account: %v", err)
	}
	return ns.Name
}

// createWorkload makes a backend's workload as kubeclip labels it: a suspended Job (no pod), a
// bare Pod of the agent stub, a Sandbox (whose pod agent-sandbox's controller, which the local
// cluster runs, makes; the pass decides on the Sandbox, not on its pod).
func createWorkload(ctx context.Context, t *testing.T, cs kubernetes.Interface, dyn dynamic.Interface, backend policy.Backend, ns, name string, labels map[string]string) {
	t.Helper()
	tmpl := stubPodTemplate(labels)
	var err error
	switch backend {
	case policy.BackendJob:
		yes := true
		_, err = cs.BatchV1().Jobs(ns).Create(ctx, &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: batchv1.JobSpec{Suspend: &yes, Template: tmpl}}, metav1.CreateOptions{})
	case policy.BackendPod:
		_, err = cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: tmpl.Spec}, metav1.CreateOptions{})
	case policy.BackendSandboxCR:
		podTemplate, cerr := runtime.DefaultUnstructuredConverter.ToUnstructured(&tmpl)
		if cerr != nil {
			t.Fatal(cerr)
		}
		sb := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": policy.SandboxAPIVersionV1beta1, "kind": policy.SandboxKind,
			"metadata": map[string]any{"name": name, "namespace": ns},
			"spec":     map[string]any{"podTemplate": podTemplate},
		}}
		sb.SetLabels(labels)
		_, err = dyn.Resource(policy.SandboxGVR("")).Namespace(ns).Create(ctx, sb, metav1.CreateOptions{})
	}
	if err != nil {
		t.Fatalf("creating %s workload %s/%s: %v", backend, ns, name, err)
	}
}

// workloadGoing reports whether the workload is gone or being deleted.
func workloadGoing(ctx context.Context, t *testing.T, cs kubernetes.Interface, dyn dynamic.Interface, backend policy.Backend, ns, name string) bool {
	t.Helper()
	var obj metav1.Object
	var err error
	switch backend {
	case policy.BackendJob:
		obj, err = cs.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
	case policy.BackendPod:
		obj, err = cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	case policy.BackendSandboxCR:
		obj, err = dyn.Resource(policy.SandboxGVR("")).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	}
	if apierrors.IsNotFound(err) {
		return true
	}
	if err != nil {
		t.Fatalf("reading %s workload %s/%s: %v", backend, ns, name, err)
	}
	return obj.GetDeletionTimestamp() != nil
}

// stubPodTemplate is a pod of the agent stub that passes Pod Security "restricted" and stops
// within a second when deleted.
func stubPodTemplate(labels map[string]string) corev1.PodTemplateSpec {
	no, yes := false, true
	uid, grace := int64(1000), int64(1)
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			AutomountServiceAccountToken:  &no,
			TerminationGracePeriodSeconds: &grace,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: &yes, RunAsUser: &uid, RunAsGroup: &uid,
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name: "agent", Image: "kubeclip.local/agent-stub:dev", ImagePullPolicy: corev1.PullNever,
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: &no, ReadOnlyRootFilesystem: &yes, RunAsNonRoot: &yes,
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
			}},
		},
	}
}
