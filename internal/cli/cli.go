// Package cli is the process entry every kubeclip binary shares: a context cancelled by SIGINT
// or SIGTERM, the error report, and the one mapping of errors to exit codes.
//
// It depends on the standard library, zerolog and internal/config only, so that sandboxd (a
// static binary copied into every exec-capable agent pod) can use it without linking the NATS and
// Kubernetes clients that internal/app brings in.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/internal/config"
)

// NewLogger returns a JSON logger for component writing to w; an unknown level is info.
func NewLogger(w io.Writer, level, component string) zerolog.Logger {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		lvl = zerolog.InfoLevel
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Str("component", component).Logger()
}

// UsageError marks a configuration error: the process exits 2.
type UsageError struct{ Err error }

func (e *UsageError) Error() string { return e.Err.Error() }
func (e *UsageError) Unwrap() error { return e.Err }

// ExitStatus is the exit status of a command the process ran on someone's behalf (kubeclip
// exec propagates the remote command's): the process exits with Code and prints nothing more.
type ExitStatus struct{ Code int }

func (e *ExitStatus) Error() string { return fmt.Sprintf("exit status %d", e.Code) }

// ExitCode maps the error returned by a binary's run function to its exit status:
// 0 for success, --help and cancellation, 2 for configuration errors, an ExitStatus's code,
// 1 otherwise.
func ExitCode(err error) int {
	var usage *UsageError
	var status *ExitStatus
	switch {
	case errors.As(err, &status):
		return status.Code
	case err == nil, errors.Is(err, flag.ErrHelp), errors.Is(err, context.Canceled):
		return 0
	case errors.As(err, &usage):
		return 2
	default:
		return 1
	}
}

// Usage maps a flag parse error: --help is not an error, anything else is a UsageError.
func Usage(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return &UsageError{Err: err}
}

// RunFunc is a binary's run function: everything main does, with the process's parts passed in.
type RunFunc func(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout, stderr io.Writer) error

// Main runs run with a context cancelled by SIGINT or SIGTERM, reports its error on stderr, and
// returns the exit code for main to exit with.
func Main(name string, run RunFunc) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.LookupEnv, os.Stdout, os.Stderr)
	code := ExitCode(err)
	var status *ExitStatus
	if code != 0 && !errors.As(err, &status) {
		fmt.Fprintln(os.Stderr, name+":", err)
	}
	return code
}
