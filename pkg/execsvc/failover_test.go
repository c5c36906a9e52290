package execsvc_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execclient"
)

// countdown prints n numbered lines on stdout, a few on stderr, over about n*10 ms.
func countdown(n int) execclient.Exec {
	script := fmt.Sprintf(`i=1; while [ $i -le %d ]; do echo "line $i"; [ $((i %% 50)) -eq 0 ] && echo "err $i" >&2; i=$((i+1)); sleep 0.01; done`, n)
	return execclient.Exec{Command: "sh", Args: []string{"-c", script}}
}

func wantCountdown(n int) (stdout, stderr string) {
	var out, errb strings.Builder
	for i := 1; i <= n; i++ {
		fmt.Fprintf(&out, "line %d\n", i)
		if i%50 == 0 {
			fmt.Fprintf(&errb, "err %d\n", i)
		}
	}
	return out.String(), errb.String()
}

// TestReplicaDiesMidStream: the replica serving a stream is cut off; the client attaches
// through another and gets every chunk once, in order, and one exit.
func TestReplicaDiesMidStream(t *testing.T) {
	e := newEnv(t, 2)
	l := e.newLease(newID("co"))
	const n = 400
	x := countdown(n)
	live := &lines{}
	x.Stdout = live
	done := make(chan execclient.Result, 1)
	go func() { done <- e.run(l, x) }()
	eventually(t, "output flows", func() bool { return live.count() > 50 })
	first := e.serving()
	first.crash()
	e.startReplica() // the pool keeps two
	res := <-done
	wantOut, wantErr := wantCountdown(n)
	if diff := cmp.Diff(wantOut, live.String()); diff != "" {
		t.Errorf("stdout (-want +got):\n%s", diff)
	}
	if string(res.Stderr) != wantErr {
		t.Errorf("stderr = %q, want %q", res.Stderr, wantErr)
	}
	if res.ExitCode == nil || *res.ExitCode != 0 || res.Attaches == 0 || res.Replica == first.name {
		t.Errorf("result: exit %v, %d attaches, exit from %s (the dead replica was %s)", res.ExitCode, res.Attaches, res.Replica, first.name)
	}
}

// TestRecordedExecAcrossFailover: a recorded exec's output lands in the run stream as exec
// events, coalesced, in order and none twice, although the replica recording it died.
func TestRecordedExecAcrossFailover(t *testing.T) {
	e := newEnv(t, 2)
	l := e.newLease(newID("co"))
	const n = 300
	x := countdown(n)
	x.Record = true
	x.Args[1] = `echo '{"type":"system","subtype":"init","session_id":"s-1","model":"m-1"}'; ` + x.Args[1] +
		`; echo '{"type":"result","subtype":"success","is_error":false,"result":"all done","session_id":"s-1"}'`
	live := &lines{}
	x.Stdout = live
	done := make(chan execclient.Result, 1)
	go func() { done <- e.run(l, x) }()
	eventually(t, "output flows", func() bool { return live.count() > 60 })
	e.serving().crash()
	res := <-done

	evs := execEvents(t, e.js, e.subjects, l)
	var out, errb strings.Builder
	for i, ev := range evs {
		if i > 0 && ev.Seq <= evs[i-1].Seq {
			t.Fatalf("event %d has seq %d after %d: a duplicate or out of order", i, ev.Seq, evs[i-1].Seq)
		}
		if ev.ExecID != res.ExecID || ev.Command != "sh" {
			t.Errorf("event %d: exec %s command %q", i, ev.ExecID, ev.Command)
		}
		switch ev.Stream {
		case events.ExecStdout:
			out.WriteString(ev.Text)
		case events.ExecStderr:
			errb.WriteString(ev.Text)
		}
	}
	if live.String() != out.String() || string(res.Stderr) != errb.String() {
		t.Errorf("recorded output differs from the client's: %d/%d vs %d/%d bytes", out.Len(), errb.Len(), len(live.String()), len(res.Stderr))
	}
	last := evs[len(evs)-1]
	if last.Exit == nil || last.Exit.ExitCode == nil || *last.Exit.ExitCode != 0 || last.Seq != res.LastSeq+1 {
		t.Fatalf("last event = %+v, want the exit after seq %d", last, res.LastSeq)
	}
	if a := last.Agent; a == nil || a.SessionID != "s-1" || a.Model != "m-1" || a.Summary != "all done" || a.IsError {
		t.Errorf("agent = %+v, want the stream-json result", a)
	}
}

// execEvents returns the run's exec events in stream order.
func execEvents(t *testing.T, js jetstream.JetStream, s events.Subjects, l *testLease) []events.RunExecEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var out []events.RunExecEvent
	err := events.Follow(ctx, js, s, l.CompanyID, l.RunID, events.FollowOptions{}, func(r events.Received) error {
		if ev, ok := r.Event.(events.RunExecEvent); ok {
			out = append(out, ev)
			if ev.Exit != nil {
				return events.ErrStopFollowing
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading the run's events: %v", err)
	}
	return out
}

// TestAttachFromAnotherClient follows an exec another client started, side by side with it.
func TestAttachFromAnotherClient(t *testing.T) {
	e := newEnv(t, 1)
	l := e.newLease(newID("co"))
	id := newID("x")
	x := countdown(100)
	x.ID = id
	live := &lines{}
	x.Stdout = live
	done := make(chan execclient.Result, 1)
	go func() { done <- e.run(l, x) }()
	eventually(t, "output flows", func() bool { return live.count() > 10 })
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	got, err := e.client.Attach(ctx, l.Lease, id, 1, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	owner := <-done
	if owner.Attaches != 0 || got.Attaches != 0 {
		t.Errorf("the owner attached %d times, the observer %d: one client's stream must not take the other's over", owner.Attaches, got.Attaches)
	}
	if string(got.Stdout) != live.String() || got.LastSeq != owner.LastSeq {
		t.Errorf("the attached client got %d bytes up to seq %d, the owner %d up to %d", len(got.Stdout), got.LastSeq, len(live.String()), owner.LastSeq)
	}
}
