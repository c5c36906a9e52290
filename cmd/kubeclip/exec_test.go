package main

import (
	"context"
	"errors"
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
