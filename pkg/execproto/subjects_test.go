package execproto_test

import (
	"errors"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execspec"
)

func TestSubjects(t *testing.T) {
	s := execproto.NewSubjects(events.Subjects{})
	subj, err := s.Request("c1", "r1", execproto.OpAttach)
	if err != nil || subj != "paperclip.exec.c1.r1.attach" {
		t.Fatalf("Request = %q, %v", subj, err)
	}
	if got := s.RequestFilter(execproto.OpStart); got != "paperclip.exec.*.*.start" {
		t.Errorf("RequestFilter = %q", got)
	}
	io, err := s.IO("c1", "r1", "x1", "s1")
	if err != nil || io != "paperclip.exec.c1.r1.io.x1.s1" {
		t.Errorf("IO = %q, %v", io, err)
	}
	ctl, err := s.Control("c1", "r1", "x1")
	if err != nil || ctl != "paperclip.exec.c1.r1.io.x1" {
		t.Errorf("Control = %q, %v", ctl, err)
	}
	for _, tc := range []struct {
		subject           string
		wantCompany, want string
		wantOp            execproto.Op
		wantErr           bool
	}{
		{subject: "paperclip.exec.c1.r1.start", wantCompany: "c1", want: "r1", wantOp: execproto.OpStart},
		{subject: "paperclip.exec.c1.r1.signal", wantCompany: "c1", want: "r1", wantOp: execproto.OpSignal},
		{subject: "paperclip.exec.c1.r1.io", wantErr: true},
		{subject: "paperclip.exec.c1.r1.io.x1", wantErr: true},
		{subject: "other.exec.c1.r1.start", wantErr: true},
		{subject: "paperclip.run.c1.r1.start", wantErr: true},
	} {
		c, r, op, err := s.ParseRequest(tc.subject)
		if tc.wantErr {
			if !errors.Is(err, events.ErrUnknownSubject) {
				t.Errorf("ParseRequest(%q) = %v, want ErrUnknownSubject", tc.subject, err)
			}
			continue
		}
		if err != nil || c != tc.wantCompany || r != tc.want || op != tc.wantOp {
			t.Errorf("ParseRequest(%q) = %q %q %q %v", tc.subject, c, r, op, err)
		}
	}
	if _, err := s.Request("c.1", "r1", execproto.OpStart); err == nil {
		t.Error("a company id with a dot makes a subject")
	}
	if _, err := s.IO("c1", "r1", "x/1", "s"); !errors.Is(err, execproto.ErrInvalidRequest) {
		t.Errorf("IO with a bad exec id: %v", err)
	}
}

func TestValidate(t *testing.T) {
	ok := execproto.StartRequest{ExecID: "x1", ProviderLeaseID: "pc-1", Command: "sh"}
	for _, tc := range []struct {
		name      string
		mod       func(*execproto.StartRequest)
		wantField string
	}{
		{"valid", func(*execproto.StartRequest) {}, ""},
		{"stdin unknown", func(r *execproto.StartRequest) { r.StdinBytes = -1 }, ""},
		{"stdin below -1", func(r *execproto.StartRequest) { r.StdinBytes = -2 }, "stdinBytes"},
		{"long exec id", func(r *execproto.StartRequest) { r.ExecID = string(make([]byte, 65)) }, "execId"},
		{"no lease", func(r *execproto.StartRequest) { r.ProviderLeaseID = "" }, "providerLeaseId"},
		{"no command", func(r *execproto.StartRequest) { r.Command = "" }, "command"},
		{"NUL in an arg", func(r *execproto.StartRequest) { r.Args = []string{"a", "b\x00"} }, "args[1]"},
		{"relative cwd", func(r *execproto.StartRequest) { r.Cwd = "w" }, "cwd"},
		{"bad env name", func(r *execproto.StartRequest) { r.Env = map[string]string{"A=B": "1"} }, "env"},
		{"negative timeout", func(r *execproto.StartRequest) { r.TimeoutMs = -1 }, "timeoutMs"},
		{"tty", func(r *execproto.StartRequest) { r.TTY, r.StdinBytes = &execspec.TTY{Rows: 24, Cols: 80}, -1 }, ""},
		{"tty without streamed stdin", func(r *execproto.StartRequest) { r.TTY = &execspec.TTY{Rows: 24, Cols: 80} }, "stdinBytes"},
		{"tty of 0 rows", func(r *execproto.StartRequest) { r.TTY, r.StdinBytes = &execspec.TTY{Cols: 80}, -1 }, "tty.rows"},
		{"tty too wide", func(r *execproto.StartRequest) { r.TTY, r.StdinBytes = &execspec.TTY{Rows: 24, Cols: 1001}, -1 }, "tty.cols"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := ok
			tc.mod(&r)
			err := r.Validate()
			var e *execproto.Error
			switch {
			case tc.wantField == "" && err != nil:
				t.Errorf("got %v", err)
			case tc.wantField != "" && (!errors.As(err, &e) || e.Field != tc.wantField || !errors.Is(err, execproto.ErrInvalidRequest)):
				t.Errorf("got %v, want invalid_request about %s", err, tc.wantField)
			}
		})
	}
}

// TestResizeOf: a resize message's size round-trips, and a missing, malformed or out-of-bounds
// header is refused naming its field.
func TestResizeOf(t *testing.T) {
	if got, err := execproto.ResizeOf(execproto.NewResizeMsg("io", execspec.TTY{Rows: 30, Cols: 100})); err != nil || got != (execspec.TTY{Rows: 30, Cols: 100}) {
		t.Errorf("round trip: %+v, %v", got, err)
	}
	for _, tc := range []struct {
		name, rows, cols, wantField string
	}{
		{"no rows", "", "80", "rows"},
		{"rows not a number", "x", "80", "rows"},
		{"0 cols", "24", "0", "cols"},
		{"cols beyond the bound", "24", "1001", "cols"},
		{"negative rows", "-1", "80", "rows"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := execproto.NewMsg("io", execproto.KindResize, nil)
			m.Header.Set(execproto.HeaderRows, tc.rows)
			m.Header.Set(execproto.HeaderCols, tc.cols)
			_, err := execproto.ResizeOf(m)
			var e *execproto.Error
			if !errors.As(err, &e) || e.Field != tc.wantField || !errors.Is(err, execproto.ErrInvalidRequest) {
				t.Errorf("got %v, want invalid_request about %s", err, tc.wantField)
			}
		})
	}
}

func TestErrorIs(t *testing.T) {
	err := execproto.NewError(execproto.CodeLeaseEnded, "", "lease %s was released", "pc-1")
	if !errors.Is(err, execproto.ErrLeaseEnded) || errors.Is(err, execproto.ErrLeaseNotFound) {
		t.Errorf("errors.Is does not match by code")
	}
	for _, c := range execproto.Codes() {
		if !c.Valid() {
			t.Errorf("%s is not valid", c)
		}
	}
	if execproto.Code("nope").Valid() {
		t.Error("an unknown code is valid")
	}
}
