package k8s

import (
	"context"
	"errors"
	"net/http"
	"path"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeclip/kubeclip/pkg/events"
)

func TestClusterCreateJobRunIdempotent(t *testing.T) {
	t.Parallel()
	c := newTestClients(t, clusterConfig(t))
	ctx := t.Context()
	ns := testNamespace(ctx, t, c.cs)
	name := runName()
	secret, job := stubRun(ns, name, "run-1", map[string]string{"STUB_LINES": "1"})

	first, err := createJobRun(ctx, c.cs, secret, job)
	if err != nil {
		t.Fatalf("first CreateJobRun: %v", err)
	}
	if first.Existed || first.JobUID == "" {
		t.Fatalf("first CreateJobRun = %+v, want a new Job", first)
	}
	second, err := createJobRun(ctx, c.cs, secret, job)
	if err != nil {
		t.Fatalf("second CreateJobRun: %v", err)
	}
	if second.JobUID != first.JobUID || !second.Existed {
		t.Errorf("second CreateJobRun = %+v, want the first Job (%s), existing", second, first.JobUID)
	}

	sel := metav1.ListOptions{LabelSelector: labels.Set{LabelRunID: "run-1"}.String()}
	jobs, err := c.cs.BatchV1().Jobs(ns).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	secrets, err := c.cs.CoreV1().Secrets(ns).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs.Items) != 1 || len(secrets.Items) != 1 {
		t.Fatalf("found %d Jobs and %d Secrets for the run, want 1 and 1", len(jobs.Items), len(secrets.Items))
	}
	yes := true
	wantOwners := []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: name, UID: first.JobUID, Controller: &yes, BlockOwnerDeletion: &yes}}
	if diff := cmp.Diff(wantOwners, secrets.Items[0].OwnerReferences); diff != "" {
		t.Errorf("Secret owner references (-want +got):\n%s", diff)
	}

	// The same names for another run: a terminal conflict that changes nothing.
	otherSecret, otherJob := stubRun(ns, name, "run-2", nil)
	if _, err := createJobRun(ctx, c.cs, otherSecret, otherJob); !errors.Is(err, ErrRunConflict) {
		t.Errorf("CreateJobRun for another run id: %v, want ErrRunConflict", err)
	}
	got, err := c.cs.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil || got.UID != first.JobUID || got.Labels[LabelRunID] != "run-1" {
		t.Errorf("after the conflict the Job is %v, %v; want the first run's", got.ObjectMeta, err)
	}

	// The pod starts (the Secret existed first) and succeeds. The grace covers the kubelet's
	// transient "failed to sync secret cache" (see pkg/runwatch/verdict's fatalWaitingReasons).
	pod := jobPod(ctx, t, c.cs, ns, name, time.Minute, func(p *corev1.Pod) bool {
		return podEnd(p, 10*time.Second) != nil
	})
	if v := podEnd(pod, 10*time.Second); v == nil || v.Outcome != events.OutcomeSucceeded || v.ExitCode == nil || *v.ExitCode != 0 {
		t.Errorf("verdict = %+v, want succeeded with exit 0", v)
	}
}

// TestClusterStartJobRunOwnsItsSecretAtOnce is issue 16's two requests per run: the Job, then its
// Secret created owned by it (no PATCH afterwards, so AdoptSecret sends nothing); a redelivery
// finds both and only re-asserts the owner.
func TestClusterStartJobRunOwnsItsSecretAtOnce(t *testing.T) {
	t.Parallel()
	cfg := clusterConfig(t)
	var mu sync.Mutex
	var requests []string
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method != http.MethodGet {
				mu.Lock()
				requests = append(requests, r.Method+" "+path.Base(r.URL.Path))
				mu.Unlock()
			}
			return rt.RoundTrip(r)
		})
	})
	c := newTestClients(t, cfg)
	ctx := t.Context()
	ns := testNamespace(ctx, t, c.cs)
	name := runName()
	secret, job := stubRun(ns, name, "run-owned", nil)
	job.Spec.Suspend = ptrTo(true) // no pod needed
	requests = nil

	run, err := StartJobRun(ctx, c.cs, secret, job)
	if err != nil {
		t.Fatal(err)
	}
	if err := run.AdoptSecret(ctx, c.cs); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"POST jobs", "POST secrets"}, requests); diff != "" {
		t.Errorf("requests of a new run (-want +got):\n%s", diff)
	}
	got, err := c.cs.CoreV1().Secrets(ns).Get(ctx, secret.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	yes := true
	wantOwners := []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: name, UID: run.JobUID, Controller: &yes, BlockOwnerDeletion: &yes}}
	if diff := cmp.Diff(wantOwners, got.OwnerReferences); diff != "" {
		t.Errorf("Secret owner references (-want +got):\n%s", diff)
	}

	requests = nil
	again, err := StartJobRun(ctx, c.cs, secret, job)
	if err != nil || !again.Existed || again.JobUID != run.JobUID {
		t.Fatalf("redelivered StartJobRun = %+v, %v; want the existing Job %s", again, err, run.JobUID)
	}
	if err := again.AdoptSecret(ctx, c.cs); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"POST jobs", "POST secrets", "PATCH " + secret.Name}, requests); diff != "" {
		t.Errorf("requests of a redelivery (-want +got):\n%s", diff)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func ptrTo[T any](v T) *T { return &v }

func TestClusterCreateJobRunConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	c := newTestClients(t, clusterConfig(t))
	ctx := t.Context()
	ns := testNamespace(ctx, t, c.cs)
	secret, job := stubRun(ns, runName(), "run-dup", map[string]string{"STUB_LINES": "1"})

	const n = 4
	results := make([]CreatedRun, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { results[i], errs[i] = createJobRun(ctx, c.cs, secret, job) })
	}
	wg.Wait()
	created := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("request %d: %v", i, errs[i])
		}
		if !results[i].Existed {
			created++
		}
		if results[i].JobUID != results[0].JobUID {
			t.Errorf("request %d got Job %s, request 0 got %s", i, results[i].JobUID, results[0].JobUID)
		}
	}
	if created != 1 {
		t.Errorf("%d of %d concurrent requests created the Job, want exactly 1", created, n)
	}
}

func TestClusterCreateJobRunInvalidLeavesNothing(t *testing.T) {
	t.Parallel()
	c := newTestClients(t, clusterConfig(t))
	ctx := t.Context()
	ns := testNamespace(ctx, t, c.cs)

	secretGone := func(t *testing.T, name string) {
		t.Helper()
		if _, err := c.cs.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("Secret %s after a failed create: %v, want NotFound", name, err)
		}
	}

	t.Run("invalid Job", func(t *testing.T) {
		secret, job := stubRun(ns, runName(), "run-bad", nil)
		job.Spec.Template.Spec.RestartPolicy = corev1.RestartPolicyAlways // not allowed for Jobs
		_, err := createJobRun(ctx, c.cs, secret, job)
		if !apierrors.IsInvalid(err) {
			t.Fatalf("CreateJobRun = %v, want an Invalid error", err)
		}
		secretGone(t, secret.Name)
	})

	t.Run("invalid Job after an earlier attempt left the Secret", func(t *testing.T) {
		secret, job := stubRun(ns, runName(), "run-bad-2", nil)
		if _, err := c.cs.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		job.Spec.Template.Spec.Containers[0].Name = "Not_Valid"
		if _, err := createJobRun(ctx, c.cs, secret, job); !apierrors.IsInvalid(err) {
			t.Fatalf("CreateJobRun = %v, want an Invalid error", err)
		}
		secretGone(t, secret.Name)
	})

	t.Run("quota forbids the Job", func(t *testing.T) {
		qns := testNamespace(ctx, t, c.cs)
		_, err := c.cs.CoreV1().ResourceQuotas(qns).Create(ctx, &corev1.ResourceQuota{
			ObjectMeta: metav1.ObjectMeta{Name: "no-jobs"},
			Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"count/jobs.batch": resource.MustParse("0")}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		secret, job := stubRun(qns, runName(), "run-quota", nil)
		// The quota controller fills in status.used asynchronously; until then the quota does not
		// bite, so retry on new names until it does.
		deadline := time.Now().Add(30 * time.Second)
		for {
			_, err = createJobRun(ctx, c.cs, secret, job)
			if err != nil || time.Now().After(deadline) {
				break
			}
			secret, job = stubRun(qns, runName(), "run-quota", nil)
			if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
		if !apierrors.IsForbidden(err) {
			t.Fatalf("CreateJobRun = %v, want a Forbidden (exceeded quota) error", err)
		}
		if _, gerr := c.cs.CoreV1().Secrets(qns).Get(ctx, secret.Name, metav1.GetOptions{}); !apierrors.IsNotFound(gerr) {
			t.Errorf("Secret %s after a forbidden Job: %v, want NotFound", secret.Name, gerr)
		}
	})

	// Issue 16: the Secret and the Job are created at once, so a Secret refused for good must
	// take the Job this call created with it.
	jobGoing := func(t *testing.T, ns, name string) {
		t.Helper()
		job, err := c.cs.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{})
		if err == nil && job.DeletionTimestamp == nil {
			t.Errorf("Job %s after its Secret was refused for good: still there, want it deleted", name)
		} else if err != nil && !apierrors.IsNotFound(err) {
			t.Fatal(err)
		}
	}

	t.Run("the Secret's name is another run's", func(t *testing.T) {
		name := runName()
		other, _ := stubRun(ns, name, "run-other", nil)
		if _, err := c.cs.CoreV1().Secrets(ns).Create(ctx, other, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		secret, job := stubRun(ns, name, "run-mine", nil)
		if _, err := createJobRun(ctx, c.cs, secret, job); !errors.Is(err, ErrRunConflict) {
			t.Fatalf("CreateJobRun = %v, want ErrRunConflict", err)
		}
		jobGoing(t, ns, job.Name)
		got, err := c.cs.CoreV1().Secrets(ns).Get(ctx, secret.Name, metav1.GetOptions{})
		if err != nil || got.Labels[LabelRunID] != "run-other" || got.DeletionTimestamp != nil {
			t.Errorf("the other run's Secret after the conflict: %v, %v; want it untouched", got.ObjectMeta, err)
		}
	})

	t.Run("quota forbids the Secret", func(t *testing.T) {
		qns := testNamespace(ctx, t, c.cs)
		_, err := c.cs.CoreV1().ResourceQuotas(qns).Create(ctx, &corev1.ResourceQuota{
			ObjectMeta: metav1.ObjectMeta{Name: "no-secrets"},
			Spec:       corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{"count/secrets": resource.MustParse("0")}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var made []string
		secret, job := stubRun(qns, runName(), "run-quota-secret", nil)
		// As above: retry on new names until the quota controller has filled in status.used.
		deadline := time.Now().Add(30 * time.Second)
		for {
			made = append(made, job.Name)
			_, err = createJobRun(ctx, c.cs, secret, job)
			if err != nil || time.Now().After(deadline) {
				break
			}
			secret, job = stubRun(qns, runName(), "run-quota-secret", nil)
			if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
		if !apierrors.IsForbidden(err) {
			t.Fatalf("CreateJobRun = %v, want a Forbidden (exceeded quota) error", err)
		}
		jobGoing(t, qns, made[len(made)-1])
	})

	t.Run("input rejected before any request", func(t *testing.T) {
		secret, job := stubRun(ns, runName(), "run-a", nil)
		secret.Labels[LabelRunID] = "run-b"
		if _, err := createJobRun(ctx, c.cs, secret, job); !errors.Is(err, ErrInvalidObject) {
			t.Fatalf("CreateJobRun = %v, want ErrInvalidObject", err)
		}
		secretGone(t, secret.Name)
	})
}

func TestClusterCreateWorkloadRun(t *testing.T) {
	t.Parallel()
	c := newTestClients(t, clusterConfig(t))
	ctx := t.Context()
	ns := testNamespace(ctx, t, c.cs)
	name := runName()
	secret, _ := stubRun(ns, name, "run-u", nil)
	// A ConfigMap stands in for a Sandbox CR: any unstructured kind goes the same way.
	cm := mustObject(t, `
apiVersion: v1
kind: ConfigMap
metadata: {name: `+name+`, namespace: `+ns+`, labels: {paperclip.io/run-id: run-u}}
data: {k: v}
`)
	gvr := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	first, err := CreateWorkloadRun(ctx, c.cs, c.dyn, gvr, secret, cm)
	if err != nil || first.Existed {
		t.Fatalf("first CreateWorkloadRun = %+v, %v; want a new workload", first, err)
	}
	second, err := CreateWorkloadRun(ctx, c.cs, c.dyn, gvr, secret, cm)
	if err != nil || !second.Existed || second.JobUID != first.JobUID {
		t.Fatalf("second CreateWorkloadRun = %+v, %v; want the existing workload %s", second, err, first.JobUID)
	}
	s, err := c.cs.CoreV1().Secrets(ns).Get(ctx, secret.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.OwnerReferences) != 1 || s.OwnerReferences[0].Kind != "ConfigMap" || s.OwnerReferences[0].APIVersion != "v1" || s.OwnerReferences[0].UID != first.JobUID {
		t.Errorf("Secret owners = %+v, want the ConfigMap", s.OwnerReferences)
	}

	// Deleting it: no pods match, so it returns once the workload is gone.
	pods := metav1.ListOptions{FieldSelector: "metadata.name=" + name}
	if err := DeleteWorkloadRun(ctx, c.cs, c.dyn, gvr, ns, name, pods, RunDeleteOptions{}); err != nil {
		t.Fatalf("DeleteWorkloadRun: %v", err)
	}
	if _, err := c.dyn.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("workload after DeleteWorkloadRun: %v, want NotFound", err)
	}
	if err := DeleteWorkloadRun(ctx, c.cs, c.dyn, gvr, ns, name, pods, RunDeleteOptions{}); err != nil {
		t.Errorf("second DeleteWorkloadRun: %v, want nil", err)
	}
}

func TestClusterDeleteRunWaitsForPods(t *testing.T) {
	t.Parallel()
	c := newTestClients(t, clusterConfig(t))
	ctx := t.Context()
	ns := testNamespace(ctx, t, c.cs)
	name := runName()
	secret, job := stubRun(ns, name, "run-del", map[string]string{"STUB_LINES": "1", "STUB_SLEEP": "1h"})
	if _, err := createJobRun(ctx, c.cs, secret, job); err != nil {
		t.Fatal(err)
	}
	pod := jobPod(ctx, t, c.cs, ns, name, time.Minute, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })

	// A finalizer keeps the pod object after its containers stop: DeleteRun must keep waiting
	// and give up only with its context.
	hold := []byte(`{"metadata":{"finalizers":["kubeclip.test/hold"]}}`)
	if _, err := c.cs.CoreV1().Pods(ns).Patch(ctx, pod.Name, types.MergePatchType, hold, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 4*time.Second)
	start := time.Now()
	err := DeleteRun(short, c.cs, ns, name, RunDeleteOptions{PodGracePeriod: 2 * time.Second})
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("DeleteRun with a pod held by a finalizer = %v after %v, want context.DeadlineExceeded", err, time.Since(start))
	}
	// The Job is deleted in the foreground: it stays, marked for deletion (so its controller
	// creates no pod), until its pods are gone.
	if got, err := c.cs.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{}); err != nil || got.DeletionTimestamp == nil {
		t.Errorf("Job while its pod is held: %v, deletion %v; want it marked for deletion", err, got.GetDeletionTimestamp())
	}
	if _, err := c.cs.CoreV1().Pods(ns).Patch(ctx, pod.Name, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}

	start = time.Now()
	if err := DeleteRun(ctx, c.cs, ns, name, RunDeleteOptions{PodGracePeriod: 2 * time.Second}); err != nil {
		t.Fatalf("DeleteRun: %v", err)
	}
	t.Logf("DeleteRun returned after %v", time.Since(start))
	if _, err := c.cs.BatchV1().Jobs(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Job after DeleteRun: %v, want NotFound", err)
	}
	for _, key := range []string{"batch.kubernetes.io/job-name", "job-name"} {
		pods, err := c.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: key + "=" + name})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) != 0 {
			t.Errorf("pods with %s=%s after DeleteRun: %d, want 0", key, name, len(pods.Items))
		}
	}
	if err := DeleteRun(ctx, c.cs, ns, name, RunDeleteOptions{}); err != nil {
		t.Errorf("second DeleteRun: %v, want nil", err)
	}
	if err := DeleteSecret(ctx, c.cs, ns, secret.Name); err != nil {
		t.Errorf("DeleteSecret: %v", err)
	}
	if err := DeleteSecret(ctx, c.cs, ns, secret.Name); err != nil {
		t.Errorf("second DeleteSecret: %v, want nil", err)
	}
}

func TestClusterDeleteRunTiming(t *testing.T) {
	t.Parallel()
	c := newTestClients(t, clusterConfig(t))
	ctx := t.Context()
	ns := testNamespace(ctx, t, c.cs)
	name := runName()
	secret, job := stubRun(ns, name, "run-del-2", map[string]string{"STUB_LINES": "1", "STUB_SLEEP": "1h"})
	if _, err := createJobRun(ctx, c.cs, secret, job); err != nil {
		t.Fatal(err)
	}
	jobPod(ctx, t, c.cs, ns, name, time.Minute, func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	start := time.Now()
	if err := DeleteRun(ctx, c.cs, ns, name, RunDeleteOptions{}); err != nil {
		t.Fatalf("DeleteRun: %v", err)
	}
	// The stub exits on SIGTERM at once, so this is the API and kubelet round trip.
	t.Logf("DeleteRun of a running pod took %v", time.Since(start))
	pods, err := c.cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "job-name=" + name})
	if err != nil || len(pods.Items) != 0 {
		t.Errorf("pods after DeleteRun: %d, %v; want none", len(pods.Items), err)
	}
}
