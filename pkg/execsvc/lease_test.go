package execsvc_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// TestRefusals: every request is checked against the lease record of the subject's company and
// run before anything reaches a pod.
func TestRefusals(t *testing.T) {
	e := newEnv(t, 1)
	l := e.newLease(newID("co"))
	released := e.newLease(newID("co"))
	e.setState(released, lease.StateReleased)
	finished := e.newLease(newID("co"))
	e.setState(finished, lease.StateFinished)
	// A reusable lease between runs: its pod kept (retained), being deleted (suspending) or gone
	// (suspended), or a new one coming up (resuming). Commands wait for the host's resume.
	kept := map[lease.State]*testLease{}
	for _, st := range []lease.State{lease.StateRetained, lease.StateSuspending, lease.StateSuspended, lease.StateResuming} {
		kept[st] = e.newLease(newID("co"))
		e.setState(kept[st], st)
	}
	job := e.newLease(newID("co"))
	if _, err := e.records.Modify(t.Context(), job.ref, func(r *lease.Record) (bool, error) { r.Backend = string(policy.BackendJob); return true, nil }); err != nil {
		t.Fatal(err)
	}

	other := *l
	other.CompanyID = newID("co") // the same run id under another company
	wrongLease := *l
	wrongLease.ProviderLeaseID = "pc-someone-elses"
	unknown := *l
	unknown.RunID = newID("run")

	for _, tc := range []struct {
		name  string
		lease *testLease
		want  *execproto.Error
	}{
		{"another company's run", &other, execproto.ErrLeaseNotFound},
		{"unknown run", &unknown, execproto.ErrLeaseNotFound},
		{"wrong providerLeaseId", &wrongLease, execproto.ErrLeaseMismatch},
		{"released lease", released, execproto.ErrLeaseEnded},
		{"finished run", finished, execproto.ErrLeaseEnded},
		{"job backend", job, execproto.ErrNotExecCapable},
		{"retained reusable lease", kept[lease.StateRetained], execproto.ErrLeaseEnded},
		{"suspending reusable lease", kept[lease.StateSuspending], execproto.ErrLeaseEnded},
		{"suspended reusable lease", kept[lease.StateSuspended], execproto.ErrLeaseEnded},
		{"resuming reusable lease", kept[lease.StateResuming], execproto.ErrNotReady},
	} {
		t.Run(tc.name, func(t *testing.T) {
			marker := tc.lease.daemon.dir + "/ran"
			_, err := e.try(tc.lease, execclient.Exec{Command: "touch", Args: []string{marker}})
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if _, err := e.client.Attach(t.Context(), tc.lease.Lease, newID("x"), 1, nil, nil); !errors.Is(err, tc.want) {
				t.Errorf("attach: got %v, want %v", err, tc.want)
			}
			if res, err := e.client.Signal(t.Context(), tc.lease.Lease, newID("x"), "SIGTERM"); err != nil || res.Delivered || res.Code != string(tc.want.Code) {
				t.Errorf("signal: got %+v, %v; want code %v", res, err, tc.want)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Error("the command ran")
			}
		})
	}
	if _, err := e.try(l, execclient.Exec{Command: "true"}); err != nil {
		t.Errorf("the lease itself: %v", err)
	}
}

// TestStrictRequests: requests are decoded strictly; every problem is an invalid_request error
// naming the field.
func TestStrictRequests(t *testing.T) {
	e := newEnv(t, 1)
	l := e.newLease(newID("co"))
	subj, _ := execproto.NewSubjects(e.subjects).Request(l.CompanyID, l.RunID, execproto.OpStart)
	valid := `"execId":"x1","providerLeaseId":"` + l.ProviderLeaseID + `","command":"true"`
	for _, tc := range []struct {
		name, body, wantField string
	}{
		{"unknown field", `{` + valid + `,"shell":true}`, "shell"},
		{"duplicate key", `{` + valid + `,"command":"false"}`, "command"},
		{"case variant", `{` + valid + `,"Command":"false"}`, "Command"},
		{"bad exec id", `{"execId":"a/b","providerLeaseId":"p","command":"true"}`, "execId"},
		{"relative cwd", `{` + valid + `,"cwd":"tmp"}`, "cwd"},
		{"wrong type", `{` + valid + `,"timeoutMs":"soon"}`, "timeoutMs"},
		{"two values", `{` + valid + `}{}`, ""},
		{"not an object", `[]`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			reply, err := e.clientNC.RequestWithContext(ctx, subj, []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			var got execproto.Error
			if execproto.KindOf(reply) != execproto.KindError || json.Unmarshal(reply.Data, &got) != nil {
				t.Fatalf("reply %q %s, want an error", execproto.KindOf(reply), reply.Data)
			}
			if got.Code != execproto.CodeInvalidRequest || got.Field != tc.wantField {
				t.Errorf("error = %+v, want invalid_request about %q", got, tc.wantField)
			}
		})
	}
	t.Run("oversized", func(t *testing.T) {
		big := make([]byte, execproto.MaxRequestBytes+1)
		for i := range big {
			big[i] = ' '
		}
		reply, err := e.clientNC.Request(subj, big, 10*time.Second)
		if errors.Is(err, nats.ErrMaxPayload) {
			return // the connection refuses it before the server does
		}
		if err != nil {
			t.Fatal(err)
		}
		if execproto.KindOf(reply) != execproto.KindError {
			t.Errorf("reply %q, want an error", execproto.KindOf(reply))
		}
	})
}

// TestPodNotReady: a start waits for the pod within its timeout, then fails not_ready.
func TestPodNotReady(t *testing.T) {
	e := newEnv(t, 1)
	l := e.newLease(newID("co"))
	pod, _ := e.pods.Current(l.ref, l.rec)
	e.pods.set(l.ref, pod, false)
	start := time.Now()
	_, err := e.try(l, execclient.Exec{Command: "true", Timeout: 1500 * time.Millisecond})
	if !errors.Is(err, execproto.ErrNotReady) {
		t.Fatalf("got %v, want not_ready", err)
	}
	if took := time.Since(start); took < time.Second {
		t.Errorf("gave up after %s, before the timeout", took)
	}
}

// TestExecBeforeReady: a start sent before the pod is ready waits for it (heartbeats keep the
// client from sending it again meanwhile) and runs once.
func TestExecBeforeReady(t *testing.T) {
	e := newEnv(t, 2)
	l := e.newLease(newID("co"))
	pod, _ := e.pods.Current(l.ref, l.rec)
	e.pods.set(l.ref, pod, false)
	go func() {
		time.Sleep(4 * time.Second) // longer than the client's 3 s stall timeout
		e.pods.set(l.ref, pod, true)
	}()
	res := e.run(l, execclient.Exec{Command: "sh", Args: []string{"-c", "echo ran >> runs; cat runs"}, Timeout: 30 * time.Second})
	if string(res.Stdout) != "ran\n" {
		t.Errorf("stdout = %q, want the command to have run once", res.Stdout)
	}
	if res.Attaches != 0 {
		t.Errorf("the client resent its request %d times while the pod was starting", res.Attaches)
	}
}

// TestPodLostMidCommand: the pod disappearing under a running command ends the exec with
// workload_lost.
func TestPodLostMidCommand(t *testing.T) {
	e := newEnv(t, 1)
	l := e.newLease(newID("co"))
	out := &lines{}
	done := make(chan error, 1)
	go func() {
		_, err := e.try(l, execclient.Exec{Command: "sh", Args: []string{"-c", "echo started; sleep 60"}, Stdout: out})
		done <- err
	}()
	eventually(t, "the command started", func() bool { return out.count() > 0 })
	e.pods.remove(l.ref)
	l.daemon.kill()
	select {
	case err := <-done:
		if !errors.Is(err, execproto.ErrWorkloadLost) {
			t.Errorf("got %v, want workload_lost", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no answer 30s after the pod went")
	}
}
