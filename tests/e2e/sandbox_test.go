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

// TestSandboxCRLease is the same on agent-sandbox's Sandbox, whose pod agent-sandbox's own
// controller makes (the pinned version hack/cluster/cluster.sh builds and runs).
func TestSandboxCRLease(t *testing.T) {
	t.Parallel()
	cs := clustertest.Clientset(t)
	clustertest.RequireSandboxController(t)

	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	r := env.Acquire(t, company, pt.NewID("agent"), sandboxConfig("sandbox-cr"))
	checkExecLease(t, cs, r, "sandbox-cr")
}

// sandboxClient checks that agent-sandbox's controller runs and returns the dynamic client that
// reaches Sandboxes.
func sandboxClient(t *testing.T) dynamic.Interface {
	t.Helper()
	clustertest.RequireSandboxController(t)
	dyn, err := dynamic.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	return dyn
}

// TestSandboxCRReusableLease is issue 19's reusable lease on agent-sandbox's Sandbox, kept
// through the controller's own operatingMode and volumeClaimTemplates: acquire (the claim is the controller's, owned by the Sandbox); files
// written to /workspace and $HOME; release → retained, the same pod; resume at once; release,
// the pod ends, resume → a new pod with the files; a release cancelling active work →
// suspended: operatingMode Suspended, pod gone, claim kept; resume → a new pod on the same claim
// that reads both files with the same lease key; destroy → Sandbox, pod and claim gone.
func TestSandboxCRReusableLease(t *testing.T) {
	t.Parallel()
	cs := clustertest.Clientset(t)
	dyn := sandboxClient(t)
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
	// Each resumed event names the pod that serves the lease now: the credential broker binds
	// the lease's grants to it (a new pod has no status event naming it).
	if resumed.PodIP != pod.Status.PodIP {
		t.Errorf("resumed r1 names pod IP %q, want the retained pod's %s", resumed.PodIP, pod.Status.PodIP)
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
	if resumed.PodIP != pod.Status.PodIP {
		t.Errorf("resumed r2 names pod IP %q, want the new pod's %s", resumed.PodIP, pod.Status.PodIP)
	}
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
	if resumed.PodIP != next.Status.PodIP {
		t.Errorf("resumed r3 names pod IP %q, want the new pod's %s", resumed.PodIP, next.Status.PodIP)
	}
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

// TestSandboxCRNeverAdoptsAcrossNamespaces: a sandbox-cr lease is its own namespace's Sandbox
// and pod, whatever another namespace holds. agent-sandbox v1.0.3 adopts an unowned pod named
// after a Sandbox that carries its adoptable label or its name-hash label; a pod in another
// namespace named like the lease's, with both and with every kubeclip label of the lease's run,
// is not adopted by the lease's Sandbox (no owner, the Sandbox reports its own pod's address),
// is not taken for the lease's pod by kubeclip (its failing and its deletion fail nothing: the
// run-watcher follows the lease's namespace only), and the lease still serves and releases as
// usual.
func TestSandboxCRNeverAdoptsAcrossNamespaces(t *testing.T) {
	t.Parallel()
	cs := clustertest.Clientset(t)
	dyn := sandboxClient(t)
	ctx := t.Context()

	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	r := env.Acquire(t, company, pt.NewID("agent"), sandboxConfig("sandbox-cr"))
	created := pt.WaitKind[events.RunCreatedEvent](r, runTimeout)
	ns, name := created.Namespace, created.WorkloadName
	pod := waitPodReady(t, cs, ns, name, "")
	sb, err := dyn.Resource(policy.SandboxGVR(policy.SandboxAPIVersionV1beta1)).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading the lease's Sandbox: %v", err)
	}
	if !metav1.IsControlledBy(pod, sb) {
		t.Fatalf("the lease's pod is controlled by %v, want its Sandbox %s", metav1.GetControllerOf(pod), sb.GetUID())
	}

	// The decoy: another namespace, the lease's name, labels and the controller's adoption labels.
	decoyNS := "kubeclip-decoy-" + strings.ToLower(pt.NewID("ns"))
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: decoyNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the decoy's namespace: %v", err)
	}
	t.Cleanup(func() {
		_ = cs.CoreV1().Namespaces().Delete(context.Background(), decoyNS, metav1.DeleteOptions{})
	})
	labels := map[string]string{}
	for k, v := range pod.Labels {
		if strings.HasPrefix(k, "paperclip.io/") || strings.HasPrefix(k, "kubeclip.io/") || strings.HasPrefix(k, "app.kubernetes.io/") {
			labels[k] = v
		}
	}
	if labels[policy.LabelRunID] == "" || labels[policy.LabelCompanyID] != company {
		t.Fatalf("the lease's pod labels %v lack the run's id or company", pod.Labels)
	}
	labels["agents.x-k8s.io/adoptable"] = "true"
	labels["agents.x-k8s.io/sandbox-name-hash"] = pod.Labels["agents.x-k8s.io/sandbox-name-hash"]
	if labels["agents.x-k8s.io/sandbox-name-hash"] == "" {
		t.Fatalf("the lease's pod has no agent-sandbox name-hash label: %v", pod.Labels)
	}
	// It runs a moment and fails: a run-watcher that took it for the lease's pod would end the
	// lease, as it would on its deletion.
	decoy := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: decoyNS, Labels: labels},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "decoy", Image: sandboxImage, ImagePullPolicy: corev1.PullNever,
				Command: []string{"sh", "-c", "sleep 3; exit 3"}}},
		},
	}
	if _, err := cs.CoreV1().Pods(decoyNS).Create(ctx, decoy, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating the decoy pod: %v", err)
	}
	// Touch the Sandbox, so the controller reconciles it with the decoy in place.
	patch := []byte(`{"metadata":{"annotations":{"kubeclip-test/poke":"1"}}}`)
	if _, err := dyn.Resource(policy.SandboxGVR(policy.SandboxAPIVersionV1beta1)).Namespace(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatalf("annotating the lease's Sandbox: %v", err)
	}
	pt.Eventually(t, runTimeout, "the decoy Failed", func() bool {
		p, err := cs.CoreV1().Pods(decoyNS).Get(ctx, name, metav1.GetOptions{})
		return err == nil && p.Status.Phase == corev1.PodFailed
	})
	time.Sleep(2 * time.Second) // reconciles of the Sandbox and the run-watcher's turn on the pods' events
	got, err := cs.CoreV1().Pods(decoyNS).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading the decoy: %v", err)
	}
	if len(got.OwnerReferences) != 0 {
		t.Errorf("the decoy in %s was adopted: owners %v", decoyNS, got.OwnerReferences)
	}
	sb, err = dyn.Resource(policy.SandboxGVR(policy.SandboxAPIVersionV1beta1)).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading the lease's Sandbox after the decoy failed: %v (did kubeclip take the decoy for the lease's pod and end the lease? failed events: %+v)",
			err, pt.All[events.RunFailedEvent](r))
	}
	if ips, _, _ := unstructured.NestedStringSlice(sb.Object, "status", "podIPs"); len(ips) != 1 || ips[0] != pod.Status.PodIP {
		t.Errorf("the Sandbox reports podIPs %v, want its own pod's %s (the decoy's is %s)", ips, pod.Status.PodIP, got.Status.PodIP)
	}

	// Deleting the decoy is nothing to the lease.
	if err := cs.CoreV1().Pods(decoyNS).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("deleting the decoy: %v", err)
	}
	pt.Eventually(t, runTimeout, "the decoy gone", func() bool {
		_, err := cs.CoreV1().Pods(decoyNS).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	time.Sleep(2 * time.Second) // the run-watcher's turn to (wrongly) see a deleted pod
	if _, err := cs.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
		t.Errorf("the lease's pod after the decoy's deletion: %v", err)
	}
	seed := execspec.DeriveSeed(env.SandboxKey, ns, name)
	out, exit := runCommand(t, newSandboxdClient(t, pod.Status.PodIP+":7070", seed), sandboxd.Spec{ID: "after-decoy", Command: "echo", Args: []string{"still here"}})
	if exit.ExitCode == nil || *exit.ExitCode != 0 || out != "still here\n" {
		t.Errorf("exec after the decoy's deletion: %q, exit %+v", out, exit)
	}
	r.Release(created.ProviderLeaseID, false)
	if released := pt.WaitKind[events.RunReleasedEvent](r, runTimeout); released.State != events.ReleaseStopped {
		t.Errorf("released = %+v, want stopped", released)
	}
	if res := pt.WaitKind[events.RunResultEvent](r, runTimeout); res.Outcome != events.OutcomeReleased {
		t.Errorf("result = %+v, want released (the decoy's deletion taken for the lease's pod?)", res)
	}
	for _, f := range pt.All[events.RunFailedEvent](r) {
		t.Errorf("failed: %+v", f)
	}
}
