package cli_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"testing"

	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/internal/cli"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestExitCode(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"success", nil, 0},
		{"help", flag.ErrHelp, 0},
		{"cancelled", fmt.Errorf("serving: %w", context.Canceled), 0},
		{"usage", &cli.UsageError{Err: errors.New("--x must be > 0")}, 2},
		{"wrapped usage", fmt.Errorf("serve: %w", cli.Usage(errors.New("bad flag"))), 2},
		{"usage of help", cli.Usage(flag.ErrHelp), 0},
		{"other", errors.New("boom"), 1},
		{"exit status", &cli.ExitStatus{Code: 124}, 124},
		{"wrapped exit status", fmt.Errorf("exec: %w", &cli.ExitStatus{Code: 3}), 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := cli.ExitCode(tc.err); got != tc.want {
				t.Errorf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}
