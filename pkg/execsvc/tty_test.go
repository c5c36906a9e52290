package execsvc_test

import (
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// TestTTY runs a shell on a terminal through NATS: typed input reaches it as it comes, a
// resize reaches the shell's foreground job as SIGWINCH and changes `stty size`, every byte
// comes back as stdout, and the exit code is the shell's.
func TestTTY(t *testing.T) {
	e := newEnv(t, 1)
	l := e.newLease(newID("co"))
	in, typed := io.Pipe()
	t.Cleanup(func() { _ = typed.Close() })
	screen := &lines{}
	resize := make(chan execspec.TTY, 1)
	done := make(chan execclient.Result, 1)
	go func() {
		done <- e.run(l, execclient.Exec{Command: "sh", Env: map[string]string{"PS1": "$ "}, Stdin: in,
			TTY: &execspec.TTY{Rows: 24, Cols: 80}, Resize: resize, Stdout: screen, Stderr: screen})
	}()
	typeLine := func(s string) {
		t.Helper()
		if _, err := io.WriteString(typed, s+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	shows := func(want string) {
		t.Helper()
		eventually(t, "the terminal shows "+want, func() bool { return strings.Contains(screen.String(), want) })
	}
	// The terminal echoes what is typed: the quotes keep a marker out of the echo.
	typeLine(`tty -s && echo is-a-""tty; echo to-""stderr >&2; stty size`)
	shows("is-a-tty")
	shows("to-stderr")
	shows("24 80\r\n")
	typeLine(`sh -c 'trap "echo got-""winch; exit" WINCH; echo wait""ing; while :; do sleep 0.05; done'; stty size`)
	shows("waiting")
	resize <- execspec.TTY{Rows: 30, Cols: 100}
	shows("got-winch")
	shows("30 100\r\n")
	typeLine("exit 7")
	res := <-done
	if res.ExitCode == nil || *res.ExitCode != 7 {
		t.Errorf("exit code %v, want 7", res.ExitCode)
	}
}

// TestResizeRefused: a resize of an exec without a terminal, or of a size out of bounds, is
// answered not resized with the field at fault; one whose reply subject is no inbox is dropped
// unanswered.
func TestResizeRefused(t *testing.T) {
	e := newEnv(t, 1)
	l := e.newLease(newID("co"))
	subj, err := execproto.NewSubjects(e.subjects).Request(l.CompanyID, l.RunID, execproto.OpStart)
	if err != nil {
		t.Fatal(err)
	}
	inbox := e.clientNC.NewRespInbox()
	ch := make(chan *nats.Msg, 64)
	sub, err := e.clientNC.ChanSubscribe(inbox, ch)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	execID := newID("x")
	data, _ := json.Marshal(execproto.StartRequest{ExecID: execID, ProviderLeaseID: l.ProviderLeaseID, Command: "sleep", Args: []string{"30"}})
	if err := e.clientNC.PublishRequest(subj, inbox, data); err != nil {
		t.Fatal(err)
	}
	var started execproto.Started
	for started.IOSubject == "" {
		select {
		case m := <-ch:
			if execproto.KindOf(m) == execproto.KindStarted {
				if err := json.Unmarshal(m.Data, &started); err != nil {
					t.Fatal(err)
				}
			}
		case <-time.After(time.Minute):
			t.Fatal("no started")
		}
	}
	t.Cleanup(func() { _, _ = e.client.Signal(t.Context(), l.Lease, execID, "SIGKILL") })

	for _, tc := range []struct {
		name       string
		rows, cols string
		wantCode   execproto.Code
		wantField  string
	}{
		{"0 rows", "0", "80", execproto.CodeInvalidRequest, "rows"},
		{"cols beyond the bound", "24", "1001", execproto.CodeInvalidRequest, "cols"},
		{"no terminal", "24", "80", execproto.CodeInvalidRequest, "tty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := execproto.NewMsg(started.IOSubject, execproto.KindResize, nil)
			m.Header.Set(execproto.HeaderRows, tc.rows)
			m.Header.Set(execproto.HeaderCols, tc.cols)
			resp, err := e.clientNC.RequestMsgWithContext(t.Context(), m)
			if err != nil {
				t.Fatal(err)
			}
			var reply execproto.ResizeReply
			if err := json.Unmarshal(resp.Data, &reply); err != nil {
				t.Fatal(err)
			}
			if reply.Resized || reply.Code != string(tc.wantCode) || !strings.HasPrefix(reply.Message, tc.wantField+":") {
				t.Errorf("reply %+v, want not resized, %s about %s", reply, tc.wantCode, tc.wantField)
			}
		})
	}

	r := e.serving()
	before := r.dropped.Load()
	m := execproto.NewResizeMsg(started.IOSubject, execspec.TTY{Rows: 24, Cols: 80})
	// Another user's inbox: nats-server (v2.15.3 on) refuses a reply under $JS. before the
	// replica sees it, so the replica's own rule is shown with a subject the server passes.
	m.Reply = "_INBOX_kubeclip.x"
	if err := e.clientNC.PublishMsg(m); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the replica dropped the resize without an inbox", func() bool { return r.dropped.Load() > before })
	if _, err := e.js.Stream(t.Context(), e.subjects.RunStream()); err != nil {
		t.Errorf("stream %s: %v: a reply deleted it", e.subjects.RunStream(), err)
	}
}
