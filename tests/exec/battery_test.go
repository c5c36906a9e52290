package exec

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// TestCommandBattery runs Paperclip's kinds of command on both exec-capable lease kinds (the
// pod kubeclip makes, and an agent-sandbox Sandbox) over both exec routes: cwd, env with PATH,
// exit codes, stderr apart from stdout, 8 MiB of stdin and 16 MiB of stdout byte for byte, a
// signal, a timeout that kills a process tree, and 16 commands at once.
func TestCommandBattery(t *testing.T) {
	clustertest.RequireSandboxController(t)
	for _, backend := range []string{"pod", "sandbox-cr"} {
		for _, route := range []string{execsvc.RouteDaemon, execsvc.RouteKubeExec} {
			t.Run(backend+"/"+route, func(t *testing.T) {
				execWorkers(t, route, 1)
				c := newClient(t)
				l := acquireBackend(t, pt.NewID("co"), backend)
				l.waitReady(t)
				t.Cleanup(func() { l.run.Release(l.ProviderLeaseID, true) })
				battery(t, c, l)
			})
		}
	}
}

func battery(t *testing.T, c *execclient.Client, l *lease) {
	t.Run("cwd and env", func(t *testing.T) {
		res := mustRun(t, c, l, execclient.Exec{
			Command: "sh", Args: []string{"-c", `pwd; echo "$PATH"; echo "$GREETING"; command -v cat`}, Cwd: "/tmp",
			Env: map[string]string{"PATH": "/nonexistent:/bin", "GREETING": "hello there"},
		})
		checkExit(t, res, 0)
		if want := "/tmp\n/nonexistent:/bin\nhello there\n/bin/cat\n"; string(res.Stdout) != want {
			t.Errorf("stdout %q, want %q", res.Stdout, want)
		}
	})
	t.Run("exit codes", func(t *testing.T) {
		for _, tc := range []struct {
			command string
			args    []string
			want    int
		}{{"true", nil, 0}, {"sh", []string{"-c", "exit 3"}, 3}, {"no-such-command", nil, 127}} {
			checkExit(t, mustRun(t, c, l, execclient.Exec{Command: tc.command, Args: tc.args}), tc.want)
		}
	})
	t.Run("stderr apart", func(t *testing.T) {
		res := mustRun(t, c, l, execclient.Exec{Command: "sh", Args: []string{"-c", "echo out; echo err >&2; echo out2"}})
		if string(res.Stdout) != "out\nout2\n" || string(res.Stderr) != "err\n" {
			t.Errorf("stdout %q stderr %q, want out/out2 and err", res.Stdout, res.Stderr)
		}
	})
	t.Run("8 MiB of stdin", func(t *testing.T) {
		in := make([]byte, 8<<20)
		_, _ = rand.Read(in)
		res := mustRun(t, c, l, execclient.Exec{Command: "sha256sum", Stdin: bytes.NewReader(in), StdinBytes: int64(len(in))})
		sum := sha256.Sum256(in)
		if want := hex.EncodeToString(sum[:]) + "  -\n"; string(res.Stdout) != want {
			t.Errorf("sha256sum of the stdin: %q, want %q", res.Stdout, want)
		}
	})
	t.Run("16 MiB of stdout", func(t *testing.T) {
		const line = "abcdefghijklmno\n"
		res := mustRun(t, c, l, execclient.Exec{Command: "sh", Args: []string{"-c", "yes abcdefghijklmno | head -c 16777216"}})
		if len(res.Stdout) != 16<<20 || res.Truncated || string(res.Stdout) != strings.Repeat(line, 1<<20) {
			t.Errorf("stdout: %d bytes (truncated %v), want 16 MiB of %q", len(res.Stdout), res.Truncated, line)
		}
	})
	t.Run("signal", func(t *testing.T) {
		x := execclient.Exec{ID: pt.NewID("x"), Command: "sleep", Args: []string{"600"}}
		done := runAsync(t, c, l, x)
		eventuallySignaled(t, c, l, x.ID, "SIGTERM")
		res, err := (<-done).result()
		if err != nil || res.Signal == nil || *res.Signal != "SIGTERM" || res.ExitCode != nil {
			t.Errorf("signalled command: signal %v exit %v (%v), want SIGTERM", res.Signal, res.ExitCode, err)
		}
	})
	t.Run("timeout kills the tree", func(t *testing.T) {
		res, err := run(t, c, l, execclient.Exec{Command: "sh", Args: []string{"-c", "sleep 601 & sleep 601 & echo forked; wait"}, Timeout: 2 * time.Second})
		if err != nil || !res.TimedOut || res.ExitCode != nil || string(res.Stdout) != "forked\n" {
			t.Fatalf("timed out %v exit %v stdout %q (%v), want timedOut, no exit code", res.TimedOut, res.ExitCode, res.Stdout, err)
		}
		left := mustRun(t, c, l, execclient.Exec{Command: "sh", Args: []string{"-c",
			`for p in /proc/[0-9]*; do tr '\0' ' ' < "$p/cmdline" 2>/dev/null; echo; done | grep -c '^sleep 601 ' || true`}})
		if strings.TrimSpace(string(left.Stdout)) != "0" {
			t.Errorf("processes of the timed-out command still running: %s", left.Stdout)
		}
	})
	t.Run("16 at once", func(t *testing.T) {
		var wg sync.WaitGroup
		errs := make(chan error, 16)
		for i := range 16 {
			wg.Go(func() {
				res, err := run(t, c, l, execclient.Exec{Command: "sh", Args: []string{"-c", fmt.Sprintf("sleep 1; echo %d", i)}})
				if err == nil && string(res.Stdout) != fmt.Sprintf("%d\n", i) {
					err = fmt.Errorf("command %d printed %q", i, res.Stdout)
				}
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Error(err)
			}
		}
	})
}

// TestReleaseDuringACommand: a release lets a running command finish and publishes `released`
// only after it (and the pod) are gone; with cancelActiveWork it ends the command at once; a
// destroy also deletes the run's Secret. An exec for the released lease, or for another
// company's, is refused.
func TestReleaseDuringACommand(t *testing.T) {
	clustertest.RequireSandboxController(t)
	execWorkers(t, execsvc.RouteDaemon, 1)
	c := newClient(t)
	cs := clustertest.Clientset(t)
	for _, backend := range []string{"pod", "sandbox-cr"} {
		t.Run(backend+"/release lets the command finish", func(t *testing.T) {
			l := acquireBackend(t, pt.NewID("co"), backend)
			l.waitReady(t)
			out := &lines{}
			x := execclient.Exec{Command: "sh", Args: []string{"-c", "echo started; sleep 3; echo finished"}, Stdout: out}
			done := runAsync(t, c, l, x)
			eventually(t, time.Minute, "the command started", func() bool { return out.count() > 0 })
			started := time.Now()
			l.release(t, false, false)
			res, err := (<-done).result()
			if err != nil || res.ExitCode == nil || *res.ExitCode != 0 || out.String() != "started\nfinished\n" {
				t.Errorf("command under a release: exit %v, %q (%v), want it to finish", res.ExitCode, out.String(), err)
			}
			released := pt.WaitKind[events.RunReleasedEvent](l.run, runTimeout)
			if released.At.Before(started.Add(3 * time.Second)) {
				t.Errorf("released at %s, before the command could have finished (started %s + 3 s)", released.At, started)
			}
			checkGone(t, l)
			if _, err := run(t, c, l, execclient.Exec{Command: "true"}); !errors.Is(err, execproto.ErrLeaseEnded) {
				t.Errorf("exec on a released lease: %v, want lease_ended", err)
			}
		})
		t.Run(backend+"/cancelActiveWork ends it", func(t *testing.T) {
			l := acquireBackend(t, pt.NewID("co"), backend)
			l.waitReady(t)
			out := &lines{}
			done := runAsync(t, c, l, execclient.Exec{Command: "sh", Args: []string{"-c", "echo started; sleep 600"}, Stdout: out})
			eventually(t, time.Minute, "the command started", func() bool { return out.count() > 0 })
			l.release(t, true, false)
			select {
			case r := <-done:
				if r.err == nil && r.res.ExitCode != nil && *r.res.ExitCode == 0 {
					t.Errorf("a cancelled command exited 0")
				}
			case <-time.After(time.Minute):
				t.Fatal("the command still ran a minute after a release with cancelActiveWork")
			}
			pt.WaitKind[events.RunReleasedEvent](l.run, runTimeout)
			checkGone(t, l)
		})
		t.Run(backend+"/destroy", func(t *testing.T) {
			l := acquireBackend(t, pt.NewID("co"), backend)
			l.waitReady(t)
			done := runAsync(t, c, l, execclient.Exec{Command: "sleep", Args: []string{"600"}})
			l.release(t, true, true)
			select {
			case <-done:
			case <-time.After(time.Minute):
				t.Fatal("the command still ran a minute after a destroy")
			}
			if rel := pt.WaitKind[events.RunReleasedEvent](l.run, runTimeout); rel.State != events.ReleaseDestroyed {
				t.Errorf("released state %q, want destroyed", rel.State)
			}
			checkGone(t, l)
			secrets, err := cs.CoreV1().Secrets(l.created.Namespace).List(t.Context(), metav1.ListOptions{LabelSelector: policy.LabelRunID + "=" + l.RunID})
			if err != nil || len(secrets.Items) != 0 {
				t.Errorf("%d Secrets of the destroyed run (%v)", len(secrets.Items), err)
			}
		})
	}
	t.Run("another company's lease", func(t *testing.T) {
		victim := acquireBackend(t, pt.NewID("co"), "pod")
		t.Cleanup(func() { victim.run.Release(victim.ProviderLeaseID, true) })
		forged := *victim
		forged.CompanyID = pt.NewID("co")
		if _, err := run(t, c, &forged, execclient.Exec{Command: "true"}); !errors.Is(err, execproto.ErrLeaseNotFound) {
			t.Errorf("exec with another company's run and lease ids: %v, want lease_not_found", err)
		}
	})
}

// acquireBackend acquires an exec-capable lease of backend for company.
func acquireBackend(t *testing.T, company, backend string) *lease {
	t.Helper()
	pt.CleanupTenant(t, clustertest.Clientset(t), company)
	cfg := pt.StubConfig(nil, func(c map[string]any) {
		c["backend"] = backend
		c["podActivityDeadlineSec"] = 900
		c["adapters"].([]any)[0].(map[string]any)["runtimeImage"] = sandboxImage
	})
	r := env.Acquire(t, company, pt.NewID("agent"), cfg)
	created := pt.WaitKind[events.RunCreatedEvent](r, runTimeout)
	return &lease{run: r, created: created, Lease: execclient.Lease{CompanyID: company, RunID: r.RunID, ProviderLeaseID: created.ProviderLeaseID}}
}

// release publishes the lease's release (destroy: its destroy), cancelling active work or not.
func (l *lease) release(t *testing.T, cancelActiveWork, destroy bool) {
	t.Helper()
	pub, err := events.NewPublisher(events.PublisherOptions{JS: env.JS, Subjects: env.Subjects})
	if err != nil {
		t.Fatal(err)
	}
	req := events.ReleaseRequest{RunID: l.RunID, CompanyID: l.CompanyID, ProviderLeaseID: l.ProviderLeaseID, CancelActiveWork: cancelActiveWork, Destroy: destroy}
	if _, err := pub.Publish(t.Context(), req); err != nil {
		t.Fatal(err)
	}
}

// checkGone: the lease's pod no longer exists.
func checkGone(t *testing.T, l *lease) {
	t.Helper()
	_, err := clustertest.Clientset(t).CoreV1().Pods(l.created.Namespace).Get(t.Context(), l.created.WorkloadName, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("pod %s/%s after released: %v, want NotFound", l.created.Namespace, l.created.WorkloadName, err)
	}
}

type outcome struct {
	res execclient.Result
	err error
}

func (o outcome) result() (execclient.Result, error) { return o.res, o.err }

func runAsync(t *testing.T, c *execclient.Client, l *lease, x execclient.Exec) <-chan outcome {
	done := make(chan outcome, 1)
	go func() {
		res, err := run(t, c, l, x)
		done <- outcome{res, err}
	}()
	return done
}

func mustRun(t *testing.T, c *execclient.Client, l *lease, x execclient.Exec) execclient.Result {
	t.Helper()
	res, err := run(t, c, l, x)
	if err != nil {
		t.Fatalf("%s %v: %v", x.Command, x.Args, err)
	}
	return res
}

func checkExit(t *testing.T, res execclient.Result, want int) {
	t.Helper()
	if res.ExitCode == nil || *res.ExitCode != want {
		t.Errorf("exit code %v (signal %v), want %d", res.ExitCode, res.Signal, want)
	}
}

// eventuallySignaled sends sig to the exec until it is there to receive it.
func eventuallySignaled(t *testing.T, c *execclient.Client, l *lease, execID, sig string) {
	t.Helper()
	eventually(t, time.Minute, "the signal delivered", func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		res, err := c.Signal(ctx, l.Lease, execID, sig)
		return err == nil && res.Delivered
	})
}
