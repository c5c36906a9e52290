package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// terminal is kubeclip's own terminal, for `kubeclip exec -t`: its size goes to the command's
// terminal in the pod, and it is in raw mode while the command runs, so every key (^C, ^D,
// arrows) reaches the command.
type terminal struct {
	fd int
}

// errNotTerminal: -t without a terminal on stdin.
var errNotTerminal = errors.New("-t: stdin is not a terminal (run it from one, or leave -t out and pipe stdin)")

// openTerminal returns stdin's terminal, or a usage error when stdin is not one.
func openTerminal(stdin *os.File) (*terminal, error) {
	fd := int(stdin.Fd())
	if !term.IsTerminal(fd) {
		return nil, &app.UsageError{Err: errNotTerminal}
	}
	return &terminal{fd: fd}, nil
}

// size is the terminal's size, within what a pod's terminal takes.
func (t *terminal) size() (execspec.TTY, error) {
	cols, rows, err := term.GetSize(t.fd)
	if err != nil {
		return execspec.TTY{}, fmt.Errorf("reading the terminal's size: %w", err)
	}
	return execspec.TTY{Rows: clampDim(rows), Cols: clampDim(cols)}, nil
}

// clampDim keeps a terminal dimension within 1..execspec.MaxTTYDim (a terminal that reports 0,
// a screen wider than the bound).
func clampDim(n int) int { return min(max(n, 1), execspec.MaxTTYDim) }

// raw puts the terminal in raw mode; the function returned restores it.
func (t *terminal) raw() (restore func(), err error) {
	old, err := term.MakeRaw(t.fd)
	if err != nil {
		return nil, fmt.Errorf("putting the terminal in raw mode: %w", err)
	}
	return func() { _ = term.Restore(t.fd, old) }, nil
}

// resizes sends the terminal's size each time it changes (SIGWINCH) until ctx ends; only the
// latest size waits to be taken.
func (t *terminal) resizes(ctx context.Context) <-chan execspec.TTY {
	out := make(chan execspec.TTY, 1)
	winch := make(chan os.Signal, 1)
	signal.Notify(winch, unix.SIGWINCH)
	go func() {
		defer signal.Stop(winch)
		for {
			select {
			case <-ctx.Done():
				return
			case <-winch:
			}
			sz, err := t.size()
			if err != nil {
				continue
			}
			select { // drop a size not taken yet
			case <-out:
			default:
			}
			out <- sz
		}
	}()
	return out
}
