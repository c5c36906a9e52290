package k8s

// Tests against the project's local cluster (internal/clustertest). They fail, not skip, when
// it is down: bring it up with `make cluster-up` or point KUBECLIP_KUBECONFIG at a cluster that
// has the kubeclip.local/agent-stub:dev image.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/oklog/ulid/v2"
	"github.com/rs/zerolog"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

const (
	stubImage   = "kubeclip.local/agent-stub:dev"
	stubCommand = "/usr/local/bin/paperclip-agent-shim"
)

// testClients are clients for the test cluster whose idle connections are closed when the
// test ends, so goleak sees no transport goroutines.
type testClients struct {
	cfg *rest.Config
	cs  kubernetes.Interface
	dyn dynamic.Interface
	dc  discovery.DiscoveryInterface
}

func newTestClients(t *testing.T, cfg *rest.Config) testClients {
	t.Helper()
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
	dc, err := discovery.NewDiscoveryClientForConfigAndClient(cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	return testClients{cfg: cfg, cs: cs, dyn: dyn, dc: dc}
}

// clusterConfig is clustertest.Config with this package's User-Agent, closing the idle
// connections of the readiness probe too.
func clusterConfig(t *testing.T) *rest.Config {
	t.Helper()
	cfg := clustertest.Config(t)
	t.Cleanup(func() {
		if hc, err := rest.HTTPClientFor(cfg); err == nil {
			hc.CloseIdleConnections()
		}
	})
	return ForComponent(cfg, "k8s-test")
}

// testNamespace creates a namespace enforcing Pod Security "restricted" (as tenant namespaces
// do) with its default ServiceAccount, and deletes it when the test ends.
func testNamespace(ctx context.Context, t *testing.T, cs kubernetes.Interface) string {
	t.Helper()
	ns, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		GenerateName: "k8s-test-",
		Labels: map[string]string{
			"pod-security.kubernetes.io/enforce": "restricted",
			"paperclip.io/managed-by":            "kubeclip-test",
		},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating namespace: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := cleanupContext(ctx)
		defer cancel()
		if err := cs.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting namespace %s: %v", ns.Name, err)
		}
	})
	// The service-account controller creates "default" soon; pods are rejected until it exists.
	_, err = cs.CoreV1().ServiceAccounts(ns.Name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating default service account: %v", err)
	}
	return ns.Name
}

// stubRun returns a run's Secret and a Job running the agent stub with env, shaped like the
// Jobs pkg/policy renders: restricted Pod Security, envFrom the Secret, no retries.
func stubRun(ns, name, runID string, env map[string]string) (*corev1.Secret, *batchv1.Job) {
	runLabels := func() map[string]string {
		return map[string]string{LabelRunID: runID, "paperclip.io/managed-by": "kubeclip"}
	}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-env", Namespace: ns, Labels: runLabels()},
		Type:       corev1.SecretTypeOpaque,
		StringData: map[string]string{"PAPERCLIP_RUN_ID": runID},
	}
	var envVars []corev1.EnvVar
	for k, v := range env {
		envVars = append(envVars, corev1.EnvVar{Name: k, Value: v})
	}
	no, yes := false, true
	uid := int64(1000)
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: runLabels()},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr[int32](0),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: runLabels()},
				Spec: corev1.PodSpec{
					RestartPolicy:                 corev1.RestartPolicyNever,
					AutomountServiceAccountToken:  &no,
					TerminationGracePeriodSeconds: ptr[int64](30),
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   &yes,
						RunAsUser:      &uid,
						RunAsGroup:     &uid,
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
					},
					Containers: []corev1.Container{{
						Name:            "agent",
						Image:           stubImage,
						ImagePullPolicy: corev1.PullNever,
						Command:         []string{"/usr/bin/tini", "--", stubCommand},
						Env:             envVars,
						EnvFrom:         []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: name + "-env"}}}},
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: &no,
							ReadOnlyRootFilesystem:   &yes,
							RunAsNonRoot:             &yes,
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
							Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("128Mi")},
						},
					}},
				},
			},
		},
	}
	return secret, job
}

// runName returns a fresh workload name in the pc-<lowercase ULID> shape.
// createJobRun creates a Job run whole, as the dispatcher does with StartJobRun and
// AdoptSecret.
func createJobRun(ctx context.Context, cs kubernetes.Interface, secret *corev1.Secret, job *batchv1.Job) (CreatedRun, error) {
	run, err := StartJobRun(ctx, cs, secret, job)
	if err != nil {
		return CreatedRun{}, err
	}
	return run, run.AdoptSecret(ctx, cs)
}

func runName() string {
	return "pc-" + strings.ToLower(ulid.Make().String())
}

// jobPod waits for the Job's pod to satisfy cond and returns it.
func jobPod(ctx context.Context, t *testing.T, cs kubernetes.Interface, ns, job string, timeout time.Duration, cond func(*corev1.Pod) bool) *corev1.Pod {
	t.Helper()
	var found *corev1.Pod
	sel := labels.Set{batchv1.JobNameLabel: job}.String()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		pods, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil || len(pods.Items) == 0 {
			return false, nil
		}
		found = &pods.Items[0]
		return cond(found), nil
	})
	if err != nil {
		state := "no pod"
		if found != nil {
			state = fmt.Sprintf("phase %s, statuses %+v", found.Status.Phase, found.Status.ContainerStatuses)
		}
		t.Fatalf("waiting for the pod of Job %s/%s: %v (%s)", ns, job, err, state)
	}
	return found
}

// cleanupContext is for t.Cleanup functions, which run after t.Context() is cancelled.
func cleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
}

func anyPod(*corev1.Pod) bool { return true }

func testLogger(t *testing.T) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.DebugLevel).With().Timestamp().Logger()
}

// wrapped returns a copy of cfg whose transport is wrapped by fn.
func wrapped(cfg *rest.Config, fn func(http.RoundTripper) http.RoundTripper) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Wrap(fn)
	return c
}
