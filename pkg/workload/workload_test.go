package workload

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	fakediscovery "k8s.io/client-go/discovery/fake"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// TestForChoosesEveryBackendOnce: every backend the config accepts has exactly one workload,
// and a backend none knows is a terminal internal error, not a guess.
func TestForChoosesEveryBackendOnce(t *testing.T) {
	tests := []struct {
		backend  policy.Backend
		wantKind string
	}{
		{policy.BackendJob, "Job"},
		{policy.BackendPod, "Pod"},
		{policy.BackendSandboxCR, "Sandbox"},
	}
	for _, tc := range tests {
		t.Run(string(tc.backend), func(t *testing.T) {
			w, err := For(tc.backend, Deps{})
			if err != nil {
				t.Fatal(err)
			}
			if w.Backend() != tc.backend || w.Kind() != tc.wantKind {
				t.Errorf("For(%s) = %s %s, want %s %s", tc.backend, w.Backend(), w.Kind(), tc.backend, tc.wantKind)
			}
		})
	}
	seen := map[policy.Backend]int{}
	for _, w := range All(Deps{}) {
		seen[w.Backend()]++
	}
	if len(seen) != len(tests) || len(All(Deps{})) != len(tests) {
		t.Errorf("All has backends %v, want each of %d once", seen, len(tests))
	}

	for _, b := range []policy.Backend{"", "deployment"} {
		_, err := For(b, Deps{})
		if te, ok := events.AsTerminal(err); !ok || te.Code != events.CodeInternal {
			t.Errorf("For(%q) = %v, want a terminal internal error", b, err)
		}
	}
}

// TestOnlyPodIsWarmable: a warm pod is a bare pod (policy.RenderWarmPod), so only backend pod's
// workload may be served by one; a Job or a Sandbox given a warm pod would be a run of the wrong
// kind. The dispatcher's warm pools ask Warmable, never the backend's name.
func TestOnlyPodIsWarmable(t *testing.T) {
	want := map[policy.Backend]bool{policy.BackendJob: false, policy.BackendPod: true, policy.BackendSandboxCR: false}
	for _, w := range All(Deps{}) {
		wantWarm, known := want[w.Backend()]
		if !known {
			t.Errorf("backend %s: no answer in this test; say whether a warm pod can be its workload", w.Backend())
			continue
		}
		if got := w.Warmable(); got != wantWarm {
			t.Errorf("%s Warmable() = %t, want %t", w.Backend(), got, wantWarm)
		}
	}
}

// TestObservePicksTheRunsObjects: what the run-watcher's informers hold of a run, and which of
// it each backend's verdict reads.
func TestObservePicksTheRunsObjects(t *testing.T) {
	at := func(sec int) metav1.Time { return metav1.NewTime(time.Unix(int64(1700000000+sec), 0)) }
	job := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "pc-run"}}
	older := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pc-run-abcde", CreationTimestamp: at(0)}}
	newer := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "pc-run-fghij", CreationTimestamp: at(2)}}

	tests := []struct {
		name    string
		backend policy.Backend
		jobs    []*batchv1.Job
		pods    []*corev1.Pod
		wantJob *batchv1.Job
		wantPod *corev1.Pod
	}{
		{"job: its Job and newest pod", policy.BackendJob, []*batchv1.Job{job}, []*corev1.Pod{newer, older}, job, newer},
		{"job: a pod before its Job", policy.BackendJob, nil, []*corev1.Pod{older}, nil, older},
		{"job: before anything exists", policy.BackendJob, nil, nil, nil, nil},
		{"pod: the pod, never a Job", policy.BackendPod, []*batchv1.Job{job}, []*corev1.Pod{older, newer}, nil, newer},
		{"pod: before it exists", policy.BackendPod, nil, nil, nil, nil},
		{"sandbox: its pod, never a Job", policy.BackendSandboxCR, []*batchv1.Job{job}, []*corev1.Pod{older, newer}, nil, newer},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := For(tc.backend, Deps{})
			if err != nil {
				t.Fatal(err)
			}
			gotJob, gotPod := w.Observe(tc.jobs, tc.pods)
			if gotJob != tc.wantJob || gotPod != tc.wantPod {
				t.Errorf("Observe = (%v, %v), want (%v, %v)", name(gotJob), name(gotPod), name(tc.wantJob), name(tc.wantPod))
			}
		})
	}
}

func name[T interface {
	comparable
	metav1.Object
}](o T) string {
	var none T
	if o == none {
		return "nil"
	}
	return o.GetName()
}

// TestReusableLeasesByBackend: a reusable acquire on job, on sandbox-cr where the cluster
// serves only agent-sandbox's v1alpha1 (no operatingMode), or on sandbox-cr where it serves no
// Sandbox API, fails at once with backend_unavailable naming config.backend, from Reuse and
// from every reusable lease's method; pod, and sandbox-cr where v1beta1 is served, keep it,
// each with its claim under the name its keeper gives it.
func TestReusableLeasesByBackend(t *testing.T) {
	serving := func(versions ...string) Deps {
		cs := fake.NewClientset()
		for _, v := range versions {
			cs.Discovery().(*fakediscovery.FakeDiscovery).Resources = append(cs.Discovery().(*fakediscovery.FakeDiscovery).Resources,
				&metav1.APIResourceList{GroupVersion: v, APIResources: []metav1.APIResource{{Name: "sandboxes", Kind: "Sandbox", Namespaced: true}}})
		}
		return Deps{Clientset: cs}
	}
	tests := []struct {
		name      string
		backend   policy.Backend
		deps      Deps
		wantClaim string // "" refuses a reusable lease
	}{
		{"pod", policy.BackendPod, Deps{}, "pc-1-data"},
		{"sandbox-cr on v1beta1", policy.BackendSandboxCR, serving(policy.SandboxAPIVersionV1beta1, policy.SandboxAPIVersionV1alpha1), "lease-data-pc-1"},
		{"sandbox-cr on v1alpha1 only", policy.BackendSandboxCR, serving(policy.SandboxAPIVersionV1alpha1), ""},
		{"sandbox-cr without agent-sandbox", policy.BackendSandboxCR, serving(), ""},
		{"job", policy.BackendJob, Deps{}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w, err := For(tc.backend, tc.deps)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantClaim != "" {
				if err := w.Reuse(); err != nil {
					t.Fatalf("Reuse() = %v, want nil", err)
				}
				if got := w.ClaimName("pc-1"); got != tc.wantClaim {
					t.Errorf("ClaimName(pc-1) = %s, want %s", got, tc.wantClaim)
				}
				return
			}
			claim := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "pc-1-data", Namespace: "ns"}}
			_, resumeErr := w.Resume(t.Context(), "ns", "pc-1", "pc-1-data")
			_, createErr := w.Create(t.Context(), policy.RunSpec{VolumeClaim: claim}, nil)
			for name, err := range map[string]error{
				"Reuse": w.Reuse(), "Suspend": w.Suspend(t.Context(), "ns", "pc-1", k8s.RunDeleteOptions{}),
				"Resume": resumeErr, "Create": createErr,
			} {
				te, ok := events.AsTerminal(err)
				if !ok || te.Code != events.CodeBackendUnavailable || te.Field != "config.backend" {
					t.Errorf("%s() = %v, want terminal backend_unavailable naming config.backend", name, err)
				}
			}
		})
	}
}

// TestResumeOfAGoneSandbox: a reusable Sandbox that is gone took its claim with it (it owns the
// claim), so its resume is lease_not_found naming providerLeaseId, which the plugin answers the
// host so that it acquires afresh, not an error retried until it runs out.
func TestResumeOfAGoneSandbox(t *testing.T) {
	cs := fake.NewClientset()
	cs.Discovery().(*fakediscovery.FakeDiscovery).Resources = []*metav1.APIResourceList{{
		GroupVersion: policy.SandboxAPIVersionV1beta1, APIResources: []metav1.APIResource{{Name: "sandboxes", Kind: "Sandbox", Namespaced: true}},
	}}
	gvr := policy.SandboxGVR(policy.SandboxAPIVersionV1beta1)
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: "SandboxList"})
	w, err := For(policy.BackendSandboxCR, Deps{Clientset: cs, Dynamic: dyn})
	if err != nil {
		t.Fatal(err)
	}
	_, err = w.Resume(t.Context(), "ns", "pc-1", "")
	if te, ok := events.AsTerminal(err); !ok || te.Code != events.CodeLeaseNotFound || te.Field != "providerLeaseId" {
		t.Errorf("Resume of a gone Sandbox = %v, want terminal lease_not_found naming providerLeaseId", err)
	}
}
