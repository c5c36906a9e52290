package exec

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	osexec "os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// countdown prints n numbered lines over about n*10 ms.
func countdown(n int) execclient.Exec {
	return execclient.Exec{Command: "sh", Args: []string{"-c", fmt.Sprintf(`i=1; while [ $i -le %d ]; do echo "line $i"; i=$((i+1)); sleep 0.01; done`, n)}}
}

func wantCountdown(n int) string {
	var b strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&b, "line %d\n", i)
	}
	return b.String()
}

// TestRoutes runs a pod lease's commands through each route: an exec sent before the pod is
// ready, cwd/env/exit codes, a stdin round trip, and the serving replica killed (SIGKILL)
// mid-stream with another taking over.
func TestRoutes(t *testing.T) {
	for _, route := range []string{execsvc.RouteDaemon, execsvc.RouteKubeExec} {
		t.Run(route, func(t *testing.T) {
			workers := execWorkers(t, route, 2)
			c := newClient(t)
			l := acquire(t)

			// Sent as soon as the lease exists: the pod is still starting.
			res, err := run(t, c, l, execclient.Exec{Command: "sh", Args: []string{"-c", "pwd; echo $GREETING; id -u; exit 3"}, Env: map[string]string{"GREETING": "hi"}, Timeout: time.Minute})
			if err != nil {
				t.Fatalf("exec before ready: %v", err)
			}
			if string(res.Stdout) != "/workspace\nhi\n1000\n" || res.ExitCode == nil || *res.ExitCode != 3 {
				t.Errorf("exec before ready: stdout %q exit %v, want /workspace, hi, uid 1000 and exit 3", res.Stdout, res.ExitCode)
			}
			l.waitReady(t)

			// sandboxd's binary is read-only to the agent's commands (the kube-exec route runs
			// it), and the lease seed is in no command's environment.
			res, err = run(t, c, l, execclient.Exec{Command: "sh", Args: []string{"-c", "echo replaced > /kubeclip/bin/sandboxd || echo refused; touch /kubeclip/bin/other || echo refused; env | grep -c SANDBOXD_SEED"}})
			if err != nil || string(res.Stdout) != "refused\nrefused\n0\n" {
				t.Errorf("writing sandboxd's binary, reading the seed: stdout %q stderr %q, %v; want both writes refused and no seed", res.Stdout, res.Stderr, err)
			}

			// Nor can any process in the pod find the seed: not the agent's commands, not a
			// Kubernetes exec (an operator's kubectl exec, the kube-exec route's sandboxd proxy),
			// in no environment they can read and no file.
			secret := l.secret(t)
			search := seedSearch(string(secret.Data[execspec.SeedEnv]))
			res, err = run(t, c, l, execclient.Exec{Command: "sh", Args: []string{"-c", search}})
			if err != nil || string(res.Stdout) != "searched\n" {
				t.Errorf("a command searching for the seed: stdout %q stderr %q, %v; want only searched", res.Stdout, res.Stderr, err)
			}
			if out, err := l.kubeExec(t, "sh", "-c", search); err != nil || out != "searched\n" {
				t.Errorf("a Kubernetes exec searching for the seed: %q, %v; want only searched", out, err)
			}
			// The run Secret's other keys are all in the commands' environment.
			res, err = run(t, c, l, execclient.Exec{Command: "sh", Args: []string{"-c", "env | cut -d= -f1"}})
			names := strings.Fields(string(res.Stdout))
			for k := range secret.Data {
				if k != execspec.SeedEnv && !slices.Contains(names, k) {
					t.Errorf("the run Secret's %s is not in a command's environment (%v)", k, err)
				}
			}

			res, err = run(t, c, l, execclient.Exec{Command: "no-such-command", Cwd: "/tmp"})
			if err != nil || res.ExitCode == nil || *res.ExitCode != 127 {
				t.Errorf("missing command: exit %v, %v; want 127", res.ExitCode, err)
			}

			in := make([]byte, 2<<20)
			_, _ = rand.Read(in)
			res, err = run(t, c, l, execclient.Exec{Command: "sha256sum", Stdin: bytes.NewReader(in), StdinBytes: int64(len(in))})
			sum := sha256.Sum256(in)
			if err != nil || !strings.HasPrefix(string(res.Stdout), hex.EncodeToString(sum[:])) {
				t.Errorf("stdin round trip: %q, %v", res.Stdout, err)
			}

			// SIGKILL the replica serving a stream: the other continues it.
			const n = 600
			x := countdown(n)
			out := &lines{}
			var mu sync.Mutex
			var serving []string
			x.Stdout = out
			x.OnStarted = func(r string) { mu.Lock(); serving = append(serving, r); mu.Unlock() }
			done := make(chan error, 1)
			go func() {
				res, err := run(t, c, l, x)
				if err == nil && (res.ExitCode == nil || *res.ExitCode != 0) {
					err = fmt.Errorf("exit %v", res.ExitCode)
				}
				done <- err
			}()
			eventually(t, time.Minute, "output flows", func() bool { return out.count() > 100 })
			mu.Lock()
			first := serving[0]
			mu.Unlock()
			for _, w := range workers {
				if w.ID == first {
					if err := w.Kill(); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := <-done; err != nil {
				t.Fatalf("the stream across the kill: %v", err)
			}
			if got := out.String(); got != wantCountdown(n) {
				t.Errorf("output across the kill: %d lines, want %d each once in order", strings.Count(got, "\n"), n)
			}
			mu.Lock()
			if len(serving) < 2 || serving[len(serving)-1] == first {
				t.Errorf("replicas serving the stream: %v, want another after %s died", serving, first)
			}
			mu.Unlock()
			l.run.Release(l.ProviderLeaseID, true)
		})
	}
}

// TestPodDeletedMidCommand: deleting the lease's pod under a running command ends the exec
// with workload_lost once the pod is gone.
func TestPodDeletedMidCommand(t *testing.T) {
	execWorkers(t, execsvc.RouteDaemon, 1)
	c := newClient(t)
	l := acquire(t)
	l.waitReady(t)
	out := &lines{}
	done := make(chan error, 1)
	go func() {
		_, err := run(t, c, l, execclient.Exec{Command: "sh", Args: []string{"-c", "echo started; sleep 600"}, Stdout: out})
		done <- err
	}()
	eventually(t, time.Minute, "the command started", func() bool { return out.count() > 0 })
	// sandboxd drains on SIGTERM, waiting for its commands: the kubelet kills the pod when the
	// grace period ends, and the stream breaks then.
	grace := int64(2)
	if err := clustertest.Clientset(t).CoreV1().Pods(l.created.Namespace).Delete(t.Context(), l.created.WorkloadName, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, execproto.ErrWorkloadLost) {
			t.Errorf("got %v, want workload_lost", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("no answer a minute after the pod was deleted")
	}
}

// seedSearch is a shell script naming every process environment it can read that holds seed
// (its own, sandboxd's at /proc/1, and on the kube-exec route the `sandboxd proxy` serving it
// among them) and every such file under the pod's writable directories, sandboxd's and /etc,
// then printing searched.
func seedSearch(seed string) string {
	return fmt.Sprintf(`for f in /proc/[0-9]*/environ; do grep -l -F %[1]s "$f" 2>/dev/null; done; `+
		`grep -r -l -s -F %[1]s /kubeclip /workspace /tmp "$HOME" /etc; echo searched`, seed)
}

// secret is the lease's run Secret, its sandboxd seed checked.
func (l *lease) secret(t *testing.T) *corev1.Secret {
	t.Helper()
	s, err := clustertest.Clientset(t).CoreV1().Secrets(l.created.Namespace).Get(t.Context(), l.created.SecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(s.Data[execspec.SeedEnv]); n != 2*execspec.SeedSize {
		t.Fatalf("the run Secret's %s: %d characters, want %d", execspec.SeedEnv, n, 2*execspec.SeedSize)
	}
	return s
}

// kubeExec runs argv in the lease pod's agent container with kubectl exec and returns its
// stdout.
func (l *lease) kubeExec(t *testing.T, argv ...string) (string, error) {
	t.Helper()
	args := append([]string{"--kubeconfig", clustertest.Kubeconfig(), "-n", l.created.Namespace, "exec", l.created.WorkloadName, "-c", policy.AgentContainerName, "--"}, argv...)
	var stdout, stderr bytes.Buffer
	cmd := osexec.CommandContext(t.Context(), "kubectl", args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("kubectl exec: %w: %s", err, stderr.String())
	}
	return stdout.String(), nil
}
