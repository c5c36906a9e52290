package workload

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// TestListPagesThroughTheClusterAndRestartsWhenItsTokenExpires: List reads the managed
// workloads of the real API server a page at a time, metadata only, and hands every one on; a
// continue token the API server refuses as expired (410, reason Expired: etcd compacted past
// the list's snapshot, which the local API server answers to an old token exactly so) starts the
// list again, and a list whose token keeps expiring gives up after maxListRestarts with the
// API server's error. The expiry is injected before the request (a real one needs an etcd
// compaction, which a fresh cluster has not done yet); everything else is the API server's.
func TestListPagesThroughTheClusterAndRestartsWhenItsTokenExpires(t *testing.T) {
	ctx := t.Context()
	cs, md := clusterClients(t)
	ns := testNamespace(ctx, t, cs)
	const jobs = 7
	mine := map[string]bool{}
	for i := range jobs {
		name := fmt.Sprintf("pc-list-%d", i)
		suspend := true
		job := &batchv1.Job{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: policy.RunLabels("run-list", "agent", "co-list", "claude_local")},
			Spec: batchv1.JobSpec{Suspend: &suspend, Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers:    []corev1.Container{{Name: "agent", Image: "kubeclip.local/agent-stub:dev"}},
			}}},
		}
		if _, err := cs.BatchV1().Jobs(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating Job %s: %v", name, err)
		}
		mine[name] = true
	}
	jobsOf := md.Resource(batchv1.SchemeGroupVersion.WithResource("jobs"))

	tests := []struct {
		name         string
		expireTimes  int // continue tokens refused as expired before the API server answers them
		wantRestarts int
		wantExpired  bool
	}{
		{name: "no expiry"},
		{name: "expired once", expireTimes: 1, wantRestarts: 1},
		{name: "expired on every restart", expireTimes: maxListRestarts + 1, wantRestarts: maxListRestarts, wantExpired: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var pages, restarts, expired int
			list := func(ctx context.Context, opts metav1.ListOptions) (*metav1.PartialObjectMetadataList, error) {
				if opts.Limit != 2 || opts.LabelSelector != policy.ManagedBySelector {
					t.Errorf("list options %+v, want limit 2 and the managed-by selector", opts)
				}
				switch {
				case opts.Continue == "" && pages > 0:
					restarts++
				case opts.Continue != "" && expired < tc.expireTimes:
					expired++
					return nil, apierrors.NewResourceExpired("The provided continue parameter is too old to display a consistent list result.")
				}
				pages++
				return jobsOf.List(ctx, opts)
			}
			seen := map[string]int{}
			err := listPages(ctx, "Jobs", list, 2, func(obj *metav1.PartialObjectMetadata) error {
				if obj.Namespace == ns {
					seen[obj.Name]++
				}
				return nil
			})
			if got := apierrors.IsResourceExpired(err); got != tc.wantExpired {
				t.Fatalf("listPages error = %v, want expired %v", err, tc.wantExpired)
			}
			if restarts != tc.wantRestarts {
				t.Errorf("restarts = %d, want %d", restarts, tc.wantRestarts)
			}
			if tc.wantExpired {
				return
			}
			if pages < jobs/2+1 {
				t.Errorf("%d pages of 2 for at least %d Jobs, want more: the list was not paged", pages, jobs)
			}
			for name := range mine {
				if seen[name] == 0 {
					t.Errorf("Job %s was never handed on (seen %v)", name, seen)
				}
			}
		})
	}

	// An error of each stops the list and comes back as it is.
	stop := errors.New("stop")
	calls := 0
	err := listPages(ctx, "Jobs", jobsOf.List, 2, func(*metav1.PartialObjectMetadata) error { calls++; return stop })
	if !errors.Is(err, stop) || calls != 1 {
		t.Errorf("listPages with a failing each = %v after %d calls, want stop after 1", err, calls)
	}
}

// TestPodListSkipsOwnedPods: the pod backend's List hands on kubeclip's bare pods only; a pod
// with a controller (a Job's, a Sandbox's) is its owner's and is listed with it.
func TestPodListSkipsOwnedPods(t *testing.T) {
	ctx := t.Context()
	cs, md := clusterClients(t)
	ns := testNamespace(ctx, t, cs)
	labels := policy.RunLabels("run-owned", "agent", "co-owned", "claude_local")
	owner := metav1.OwnerReference{APIVersion: "batch/v1", Kind: "Job", Name: "pc-gone", UID: "3a1c4e1e-0000-4000-8000-000000000000", Controller: ptr(true)}
	for name, owners := range map[string][]metav1.OwnerReference{"pc-bare": nil, "pc-owned": {owner}} {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, OwnerReferences: owners},
			// Never scheduled: nothing needs to run.
			Spec: corev1.PodSpec{
				SchedulingGates: []corev1.PodSchedulingGate{{Name: "kubeclip.dev/never"}},
				Containers:      []corev1.Container{{Name: "agent", Image: "kubeclip.local/agent-stub:dev"}},
			},
		}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating pod %s: %v", name, err)
		}
	}
	w, err := For(policy.BackendPod, Deps{Clientset: cs, Metadata: md})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	err = w.List(ctx, 1, func(obj *metav1.PartialObjectMetadata) error {
		if obj.Namespace == ns {
			got = append(got, obj.Name)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != "pc-bare" {
		t.Errorf("List handed on %v of this namespace, want [pc-bare]", got)
	}
}

// clusterClients are clients of the local cluster whose idle connections close when the test
// ends, so goleak sees no transport goroutine.
func clusterClients(t *testing.T) (kubernetes.Interface, metadata.Interface) {
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
	md, err := metadata.NewForConfigAndClient(cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	return cs, md
}

// testNamespace creates a namespace and deletes it (and what is in it) when the test ends.
func testNamespace(ctx context.Context, t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "workload-test-"}}, metav1.CreateOptions{})
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

func ptr[T any](v T) *T { return &v }
