package main

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execproto"
)

func intp(i int) *int       { return &i }
func strp(s string) *string { return &s }

// TestExitStatus pins how kubeclip exec reports the command's end, as shells and timeout(1) do.
func TestExitStatus(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		res  execclient.Result
		err  error
		want int
	}{
		{name: "success", res: execclient.Result{ExitCode: intp(0)}, want: 0},
		{name: "exit 3", res: execclient.Result{ExitCode: intp(3)}, want: 3},
		{name: "not found", res: execclient.Result{ExitCode: intp(127)}, want: 127},
		{name: "SIGTERM", res: execclient.Result{Signal: strp("SIGTERM")}, want: 143},
		{name: "SIGKILL", res: execclient.Result{Signal: strp("SIGKILL")}, want: 137},
		{name: "timeout", res: execclient.Result{TimedOut: true, Signal: strp("SIGKILL")}, want: 124},
		{name: "refused", err: execproto.ErrLeaseEnded, want: 1},
		{name: "interrupted", ctx: cancelled, err: context.Canceled, want: 130},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			if got := app.ExitCode(exitStatus(ctx, tc.res, tc.err)); got != tc.want {
				t.Errorf("exit status %d, want %d", got, tc.want)
			}
		})
	}
	if err := exitStatus(context.Background(), execclient.Result{}, execproto.ErrLeaseEnded); !errors.Is(err, execproto.ErrLeaseEnded) {
		t.Errorf("a service error is lost: %v", err)
	}
}

func TestPositional(t *testing.T) {
	pos, rest := positional([]string{"run-1", "exec-2", "--company", "c", "x"}, 2)
	if diff := cmp.Diff([]string{"run-1", "exec-2"}, pos); diff != "" {
		t.Error(diff)
	}
	if diff := cmp.Diff([]string{"--company", "c", "x"}, rest); diff != "" {
		t.Error(diff)
	}
	if pos, _ := positional([]string{"--company", "c"}, 1); len(pos) != 0 {
		t.Errorf("flags taken as positional: %v", pos)
	}
}

// TestTerminalRequired: -t with a stdin that is no terminal (a pipe) is a usage error that
// says so.
func TestTerminalRequired(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	_, err = openTerminal(r)
	if !errors.Is(err, errNotTerminal) || app.ExitCode(err) != 2 {
		t.Errorf("openTerminal(pipe) = %v (exit %d), want errNotTerminal, exit 2", err, app.ExitCode(err))
	}
}

// TestClampDim: a terminal's size is sent within 1..1000 whatever the local terminal reports.
func TestClampDim(t *testing.T) {
	for in, want := range map[int]int{0: 1, -3: 1, 1: 1, 80: 80, 1000: 1000, 4000: 1000} {
		if got := clampDim(in); got != want {
			t.Errorf("clampDim(%d) = %d, want %d", in, got, want)
		}
	}
}
