package leasetest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// SandboxImage is the local cluster's Paperclip sandbox: a Debian userland and node, uid 1000
// (hack/cluster/sandbox-image.sh; cluster.sh up imports it).
const SandboxImage = "kubeclip.local/sandbox:dev"

// ExecConfig is an exec-capable provider config: backend pod (sandboxd is the pod's main
// process) on the sandbox image.
func ExecConfig() json.RawMessage {
	return pipelinetest.StubConfig(nil, func(c map[string]any) {
		c["backend"] = "pod"
		c["podActivityDeadlineSec"] = 600
		c["adapters"].([]any)[0].(map[string]any)["runtimeImage"] = SandboxImage
	})
}

// The command Exec runs, and what it must print: its stdin back, who and where it runs, a line
// on stderr and an exit status of its own, so each part of the way is seen.
const (
	execStdin      = "stdin through NATS\n"
	wantExecStdout = execStdin + "uid 1000 in /workspace\n"
	wantExecStderr = "to stderr\n"
	wantExecCode   = 3
)

// ExecResult is what an exec lease produced.
type ExecResult struct {
	Created  events.RunCreatedEvent
	Exec     execclient.Result
	Released events.RunReleasedEvent
}

// Exec acquires an exec-capable lease for a fresh company, runs one command with stdin in its
// pod through the exec-workers on nc (the start waits for the pod to be ready), then the
// caller's more (each with the client and the lease), releases the lease and waits for the
// receipt. It fails t unless the command ran in the lease's pod with its stdin, stdout, stderr
// and exit status intact. The tenant namespace is deleted when the test ends.
func Exec(t *testing.T, nc *nats.Conn, js jetstream.JetStream, cs kubernetes.Interface, more ...func(*testing.T, *execclient.Client, execclient.Lease)) ExecResult {
	t.Helper()
	subjects, err := events.NewSubjects("")
	if err != nil {
		t.Fatal(err)
	}
	company, agent, runID := NewID("co"), NewID("agent"), NewID("run")
	ns, err := policy.TenantNamespace(policy.DefaultConfig(), company)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	})

	f := follow(t, js, subjects, company, runID)
	pub, err := events.NewPublisher(events.PublisherOptions{JS: js, Subjects: subjects})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, pub, "acquire", events.AcquireRequest{
		RunID: runID, CompanyID: company, EnvironmentID: "deploy", AgentID: agent, Config: ExecConfig(),
	})

	var res ExecResult
	res.Created = wait[events.RunCreatedEvent](t, f)
	if res.Created.Backend != "pod" {
		t.Fatalf("created = %+v, want backend pod", res.Created)
	}
	client, err := execclient.New(execclient.Options{NATS: nc, Subjects: subjects})
	if err != nil {
		t.Fatal(err)
	}
	// The start waits for the pod (at most the exec-worker's --ready-timeout, 2 min).
	ctx, cancel := context.WithTimeout(t.Context(), 2*Timeout)
	defer cancel()
	lease := execclient.Lease{CompanyID: company, RunID: runID, ProviderLeaseID: res.Created.ProviderLeaseID}
	res.Exec, err = client.Run(ctx, execclient.Exec{
		Lease:   lease,
		Command: "sh", Args: []string{"-c", `cat; echo "uid $(id -u) in $(pwd)"; echo to stderr >&2; exit 3`},
		Stdin: strings.NewReader(execStdin), StdinBytes: int64(len(execStdin)),
		Timeout: Timeout,
	})
	if err != nil {
		t.Fatalf("exec in lease %s: %v", res.Created.ProviderLeaseID, err)
	}
	if x := res.Exec; string(x.Stdout) != wantExecStdout || string(x.Stderr) != wantExecStderr || x.ExitCode == nil || *x.ExitCode != wantExecCode {
		code := "none"
		if x.ExitCode != nil {
			code = fmt.Sprint(*x.ExitCode)
		}
		t.Errorf("exec: stdout %q, stderr %q, exit %s; want %q, %q, %d", x.Stdout, x.Stderr, code, wantExecStdout, wantExecStderr, wantExecCode)
	}
	for _, m := range more {
		m(t, client, lease)
	}

	publish(t, pub, "release", events.ReleaseRequest{RunID: runID, CompanyID: company, ProviderLeaseID: res.Created.ProviderLeaseID})
	res.Released = wait[events.RunReleasedEvent](t, f)
	if res.Released.State != events.ReleaseStopped {
		t.Errorf("released = %+v, want stopped", res.Released)
	}
	return res
}
