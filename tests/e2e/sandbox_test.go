package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/internal/sandboxtest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// sandboxImage is the local cluster's Paperclip sandbox: a Debian userland, node, the claude
// stub (hack/cluster/sandbox-image.sh).
const sandboxImage = "kubeclip.local/sandbox:dev"

// sandboxConfig is an exec-capable lease's provider config on the sandbox image.
func sandboxConfig(backend string) json.RawMessage {
	return pt.StubConfig(nil, func(c map[string]any) {
		c["backend"] = backend
		c["podActivityDeadlineSec"] = 600
		c["adapters"].([]any)[0].(map[string]any)["runtimeImage"] = sandboxImage
	})
}

// TestPodLeaseServesSandboxd is issue 9's kubeclip-native exec-capable lease: a bare Pod whose
// main process is sandboxd, reported Ready, with its real expiry, reachable only with the
// lease's key, and gone before `released`.
func TestPodLeaseServesSandboxd(t *testing.T) {
	t.Parallel()
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	r := env.Acquire(t, company, pt.NewID("agent"), sandboxConfig("pod"))
	checkExecLease(t, cs, r, "pod")
}

// TestSandboxCRLease is the same on agent-sandbox's Sandbox. The agent-sandbox controller cannot
// be installed here (no registry): internal/sandboxtest stands in for it, making the Sandbox's
// pod as the controller does. The Sandbox CRD is upstream's.
func TestSandboxCRLease(t *testing.T) {
	t.Parallel()
	cs := clustertest.Clientset(t)
	standIn(t, cs)

	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	r := env.Acquire(t, company, pt.NewID("agent"), sandboxConfig("sandbox-cr"))
	checkExecLease(t, cs, r, "sandbox-cr")
}

// standIn runs internal/sandboxtest, the agent-sandbox controller's stand-in, until the test
// ends, and returns the dynamic client that reaches Sandboxes.
func standIn(t *testing.T, cs kubernetes.Interface) dynamic.Interface {
	t.Helper()
	dyn, err := dynamic.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sandboxtest.Run(ctx, cs, dyn) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return dyn
}

// TestSandboxCRReusableLease is issue 19's reusable lease on agent-sandbox's Sandbox, kept
// through the controller's own operatingMode and volumeClaimTemplates (here its stand-in,
// internal/sandboxtest): acquire (the claim is the controller's, owned by the Sandbox); files
// written to /workspace and $HOME; release → retained, the same pod; resume at once; release,
// the pod ends, resume → a new pod with the files; a release cancelling active work →
// suspended: operatingMode Suspended, pod gone, claim kept; resume → a new pod on the same claim
// that reads both files with the same lease key; destroy → Sandbox, pod and claim gone.
func TestSandboxCRReusableLease(t *testing.T) {
	t.Parallel()
	cs := clustertest.Clientset(t)
	dyn := standIn(t, cs)
	ctx := t.Context()

	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	r := env.NewRun(t, company, pt.NewID("agent"))
	acquire := r.Request(sandboxConfig("sandbox-cr"))
	acquire.ReuseLease = true
	publish(t, acquire)
	r.Collect()

	created := pt.WaitKind[events.RunCreatedEvent](r, runTimeout)
	ns, name := created.Namespace, created.WorkloadName
	sandboxes := dyn.Resource(policy.SandboxGVR(policy.SandboxAPIVersionV1beta1)).Namespace(ns)
	sb, err := sandboxes.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading the lease's Sandbox: %v", err)
	}
	if at, found, _ := unstructured.NestedString(sb.Object, "spec", "shutdownTime"); found {
		t.Errorf("a reusable lease's Sandbox has shutdownTime %s: the controller would delete its claim with it", at)
	}
	pod := waitPodReady(t, cs, ns, name, "")
	claimName := policy.SandboxClaimName(name)
	claim, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading the lease's claim: %v", err)
	}
	if !metav1.IsControlledBy(claim, sb) || claim.Labels[policy.LabelCompanyID] != company {
		t.Errorf("claim %s: owners %v, labels %v; want the Sandbox's, labelled with the company", claimName, claim.OwnerReferences, claim.Labels)
	}
	seed := execspec.DeriveSeed(env.SandboxKey, ns, name)
	out, exit := runCommand(t, newSandboxdClient(t, pod.Status.PodIP+":7070", seed),
		sandboxd.Spec{ID: "write", Command: "sh", Args: []string{"-c", "echo in-workspace > /workspace/kept && echo in-home > $HOME/kept && echo ok"}})
	if exit.ExitCode == nil || *exit.ExitCode != 0 || out != "ok\n" {
		t.Fatalf("writing the files: stdout %q, exit %+v", out, exit)
	}

	// Release: retained, the same pod; a resume has it at once.
	publish(t, events.ReleaseRequest{RunID: r.RunID, CompanyID: company, ProviderLeaseID: name, ReleaseID: "0"})
	waitEvent(t, r, "released 0", func(e events.RunReleasedEvent) bool { return e.ReleaseID == "0" && e.State == events.ReleaseStopped })
	publish(t, events.ResumeRequest{RunID: r.RunID, CompanyID: company, ProviderLeaseID: name, ResumeID: "r1"})
	resumed := waitEvent(t, r, "resumed r1", func(e events.RunResumedEvent) bool { return e.ResumeID == "r1" })
	if resumed.From != events.ResumedFromRetained || resumed.Generation != 0 {
		t.Errorf("resume of the retained lease: %+v, want from retained, generation 0", resumed)
	}
	if got := waitPodReady(t, cs, ns, name, ""); got.UID != pod.UID {
		t.Errorf("resume of the retained lease replaced its pod")
	}

	// A retained lease whose pod ended (its deadline, a crash; here sandboxd told to stop): the
	// controller keeps an ended pod, so the resume deletes it and waits for the controller's
	// new one, on the same claim.
	publish(t, events.ReleaseRequest{RunID: r.RunID, CompanyID: company, ProviderLeaseID: name, ReleaseID: "1"})
	waitEvent(t, r, "released 1", func(e events.RunReleasedEvent) bool { return e.ReleaseID == "1" })
	if _, err := newSandboxdClient(t, pod.Status.PodIP+":7070", seed).Start(ctx, sandboxd.Spec{ID: "stop", Command: "sh", Args: []string{"-c", "kill -TERM 1"}}); err != nil {
		t.Fatalf("stopping sandboxd: %v", err)
	}
	pt.Eventually(t, runTimeout, "the retained lease's pod ended", func() bool {
		p, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && (p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed)
	})
	publish(t, events.ResumeRequest{RunID: r.RunID, CompanyID: company, ProviderLeaseID: name, ResumeID: "r2"})
	resumed = waitEvent(t, r, "resumed r2", func(e events.RunResumedEvent) bool { return e.ResumeID == "r2" })
	if resumed.From != events.ResumedFromRetained {
		t.Errorf("resume of the retained lease whose pod ended: %+v, want from retained", resumed)
	}
	pod = waitPodReady(t, cs, ns, name, pod.UID)
	out, exit = runCommand(t, newSandboxdClient(t, pod.Status.PodIP+":7070", seed),
		sandboxd.Spec{ID: "read-1", Command: "sh", Args: []string{"-c", "cat /workspace/kept $HOME/kept"}})
	if exit.ExitCode == nil || *exit.ExitCode != 0 || out != "in-workspace\nin-home\n" {
		t.Errorf("the replaced pod reads %q (exit %+v), want both files", out, exit)
	}

	// A release cancelling active work suspends at once, through the Sandbox's operatingMode: a
	// command still running does not hold the pod for its 2-minute grace (sandboxd waits for its
	// commands on SIGTERM), which would outlast runTimeout.
	if _, err := newSandboxdClient(t, pod.Status.PodIP+":7070", seed).Start(ctx, sandboxd.Spec{ID: "busy", Command: "sleep", Args: []string{"600"}}); err != nil {
		t.Fatalf("starting a long command: %v", err)
	}
	publish(t, events.ReleaseRequest{RunID: r.RunID, CompanyID: company, ProviderLeaseID: name, ReleaseID: "2", CancelActiveWork: true})
	suspended := pt.WaitKind[events.RunSuspendedEvent](r, runTimeout)
	if suspended.VolumeClaim != claimName {
		t.Errorf("suspended names claim %q, want the controller's %s", suspended.VolumeClaim, claimName)
	}
	if _, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the pod of a suspended lease: %v, want NotFound", err)
	}
	if got, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claimName, metav1.GetOptions{}); err != nil || got.UID != claim.UID {
		t.Errorf("the claim of a suspended lease: %v, want the same claim kept", err)
	}
	pt.Eventually(t, 30*time.Second, "the Sandbox suspended (Suspended True, PodTerminated)", func() bool {
		sb, err := sandboxes.Get(ctx, name, metav1.GetOptions{})
		mode, _, _ := unstructured.NestedString(sb.Object, "spec", "operatingMode")
		return err == nil && mode == "Suspended" && condition(sb, "Suspended") == "True/PodTerminated"
	})

	// Resume of the suspended lease: a new pod on the same claim, the same lease key.
	publish(t, events.ResumeRequest{RunID: r.RunID, CompanyID: company, ProviderLeaseID: name, ResumeID: "r3"})
	resumed = waitEvent(t, r, "resumed r3", func(e events.RunResumedEvent) bool { return e.ResumeID == "r3" })
	if resumed.From != events.ResumedFromSuspended || resumed.Generation != 1 {
		t.Errorf("resume of the suspended lease: %+v, want from suspended, generation 1", resumed)
	}
	next := waitPodReady(t, cs, ns, name, pod.UID)
	out, exit = runCommand(t, newSandboxdClient(t, next.Status.PodIP+":7070", seed),
		sandboxd.Spec{ID: "read-2", Command: "sh", Args: []string{"-c", "cat /workspace/kept $HOME/kept"}})
	if exit.ExitCode == nil || *exit.ExitCode != 0 || out != "in-workspace\nin-home\n" {
		t.Errorf("the resumed pod reads %q (exit %+v), want both files", out, exit)
	}

	// Destroy: the Sandbox, its pod and its claim go.
	r.Release(name, true)
	waitEvent(t, r, "released destroyed", func(e events.RunReleasedEvent) bool { return e.State == events.ReleaseDestroyed })
	pt.Eventually(t, 60*time.Second, "the Sandbox, its pod and its claim gone", func() bool {
		_, sbErr := sandboxes.Get(ctx, name, metav1.GetOptions{})
		_, podErr := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		_, claimErr := cs.CoreV1().PersistentVolumeClaims(ns).Get(ctx, claimName, metav1.GetOptions{})
		return apierrors.IsNotFound(sbErr) && apierrors.IsNotFound(podErr) && apierrors.IsNotFound(claimErr)
	})
	for _, f := range pt.All[events.RunFailedEvent](r) {
		t.Errorf("failed: %+v", f)
	}
}

// publish publishes a lease request through kubeclip's Publisher (with its message id).
func publish(t *testing.T, ev events.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	pub, err := events.NewPublisher(events.PublisherOptions{JS: env.JS, Subjects: env.Subjects})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(ctx, ev); err != nil {
		t.Fatalf("publishing %T: %v", ev, err)
	}
}

// waitEvent waits for the run's first event of type T for which match holds.
func waitEvent[T events.Event](t *testing.T, r *pt.Run, what string, match func(T) bool) T {
	t.Helper()
	var got T
	r.WaitFor(runTimeout, what, func(evs []events.Received) bool {
		for _, e := range pt.Only[T](evs) {
			if match(e) {
				got = e
				return true
			}
		}
		return false
	})
	return got
}

// waitPodReady waits until the pod called name is Ready and is not the pod whose UID is not.
func waitPodReady(t *testing.T, cs kubernetes.Interface, ns, name string, not types.UID) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	pt.Eventually(t, runTimeout, "pod "+name+" ready", func() bool {
		p, err := cs.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil || p.UID == not || p.DeletionTimestamp != nil || p.Status.PodIP == "" {
			return false
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				pod = p
				return true
			}
		}
		return false
	})
	return pod
}

// condition is the Sandbox's condition of type typ as "status/reason", "" when it has none.
func condition(sb *unstructured.Unstructured, typ string) string {
	conds, _, _ := unstructured.NestedSlice(sb.Object, "status", "conditions")
	for _, c := range conds {
		if m, _ := c.(map[string]any); m["type"] == typ {
			return fmt.Sprint(m["status"], "/", m["reason"])
		}
	}
	return ""
}

func checkExecLease(t *testing.T, cs kubernetes.Interface, r *pt.Run, backend string) {
	t.Helper()
	created := pt.WaitKind[events.RunCreatedEvent](r, runTimeout)
	if created.Backend != backend || created.ExpiresAt == nil {
		t.Fatalf("created = %+v, want backend %s with an expiry", created, backend)
	}
	// The pod's activity deadline is the lease's real expiry.
	if left := time.Until(*created.ExpiresAt); left < 9*time.Minute || left > 10*time.Minute {
		t.Errorf("expiresAt %s is %s away, want the 600 s activity deadline", created.ExpiresAt, left)
	}
	r.WaitFor(runTimeout, "status Running/Ready", func(evs []events.Received) bool {
		for _, st := range pt.Only[events.RunStatusEvent](evs) {
			if st.Phase == events.PhaseRunning && st.Reason == events.ReasonReady {
				return true
			}
		}
		return false
	})

	ctx := t.Context()
	pod, err := cs.CoreV1().Pods(created.Namespace).Get(ctx, created.WorkloadName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading the lease's pod: %v", err)
	}
	addr := pod.Status.PodIP + ":7070"
	seed := execspec.DeriveSeed(env.SandboxKey, created.Namespace, created.WorkloadName)
	client := newSandboxdClient(t, addr, seed)
	stdout, exit := runCommand(t, client, sandboxd.Spec{ID: "e2e-1", Command: "sh", Args: []string{"-c", "echo hi; pwd; id -u; echo ${KUBECLIP_SANDBOXD_SEED:-no seed}"}})
	if exit.ExitCode == nil || *exit.ExitCode != 0 || stdout != "hi\n/workspace\n1000\nno seed\n" {
		t.Errorf("exec: stdout %q, exit %+v; want hi, /workspace, uid 1000, the seed hidden, exit 0", stdout, exit)
	}

	// Another lease's key does not get a single byte to this sandboxd.
	other := newSandboxdClient(t, addr, execspec.DeriveSeed(env.SandboxKey, created.Namespace, "pc-someone-else"))
	if _, err := other.Info(ctx); !errors.Is(err, sandboxd.ErrServerKeyMismatch) {
		t.Errorf("a client with another lease's key: %v, want ErrServerKeyMismatch", err)
	}

	r.Release(created.ProviderLeaseID, false)
	released := pt.WaitKind[events.RunReleasedEvent](r, runTimeout)
	if released.State != events.ReleaseStopped {
		t.Errorf("released = %+v", released)
	}
	if _, err := cs.CoreV1().Pods(created.Namespace).Get(ctx, created.WorkloadName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the lease's pod after released: %v, want NotFound", err)
	}
	// A release is an exec-capable lease's normal end; nothing recorded, so no agent account.
	res := pt.WaitKind[events.RunResultEvent](r, runTimeout)
	if res.Outcome != events.OutcomeReleased || res.Agent != nil {
		t.Errorf("result = %+v, want released, without an agent", res)
	}
}

func newSandboxdClient(t *testing.T, addr string, seed []byte) *sandboxd.Client {
	t.Helper()
	c, err := sandboxd.NewClient(sandboxd.ClientOptions{
		Dial: sandboxd.DialTCP(addr), TLS: sandboxd.ClientTLSConfig(seed), Token: sandboxd.ClientToken(seed),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// runCommand runs spec to its end and returns its stdout and exit frame.
func runCommand(t *testing.T, c *sandboxd.Client, spec sandboxd.Spec) (string, *execspec.Exit) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := c.Start(ctx, spec); err != nil {
		t.Fatalf("starting %s: %v", spec.Command, err)
	}
	out, err := c.Output(ctx, spec.ID, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	var stdout strings.Builder
	for {
		f, err := out.Next()
		if errors.Is(err, io.EOF) {
			t.Fatal("output ended without an exit frame")
		}
		if err != nil {
			t.Fatalf("reading output: %v", err)
		}
		switch f := f.(type) {
		case *sandboxd.Chunk:
			if f.Stream == sandboxd.Stdout {
				stdout.Write(f.Data)
			}
		case *execspec.Exit:
			return stdout.String(), f
		}
	}
}
