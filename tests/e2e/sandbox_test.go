package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/internal/sandboxtest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execspec"
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

	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	r := env.Acquire(t, company, pt.NewID("agent"), sandboxConfig("sandbox-cr"))
	checkExecLease(t, cs, r, "sandbox-cr")
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
