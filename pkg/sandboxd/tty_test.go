package sandboxd_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// screen collects an exec's output as it arrives.
type screen struct {
	mu     sync.Mutex
	out    strings.Builder
	stderr int
	exit   *execspec.Exit
	done   chan struct{}
}

// follow reads id's output from seq 1 into a screen until the exit.
func follow(t *testing.T, c *sandboxd.Client, id string) *screen {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	s, err := c.Output(ctx, id, 1)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	sc := &screen{done: make(chan struct{})}
	go func() {
		defer cancel()
		defer close(sc.done)
		defer s.Close()
		for {
			f, err := s.Next()
			if err != nil {
				return
			}
			sc.mu.Lock()
			switch f := f.(type) {
			case *sandboxd.Chunk:
				if f.Stream == sandboxd.Stdout {
					sc.out.Write(f.Data)
				} else {
					sc.stderr += len(f.Data)
				}
			case *execspec.Exit:
				sc.exit = f
			}
			sc.mu.Unlock()
		}
	}()
	return sc
}

func (sc *screen) String() string {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.out.String()
}

// waitFor waits until the output holds want.
func (sc *screen) waitFor(t *testing.T, want string) {
	t.Helper()
	eventually(t, "the terminal shows "+want, func() bool { return strings.Contains(sc.String(), want) })
}

// TestTTY runs a shell on a terminal: it is one (tty -s), its size is the start's and follows
// a resize (stty size, and SIGWINCH reaches the shell's foreground job), stderr comes through the
// terminal as stdout, the exit code is the shell's; a repeated start with the same terminal is
// an attach, with another a spec mismatch; a resize after the exit is refused as exited.
func TestTTY(t *testing.T) {
	h := startServer(t, nil)
	c := h.tls
	ctx := t.Context()
	spec := sandboxd.Spec{ID: newID(), Command: "sh", Stdin: true, TTY: &execspec.TTY{Rows: 24, Cols: 80},
		Env: map[string]string{"PS1": "$ "}}
	res, err := c.Start(ctx, spec)
	if err != nil || !res.Created {
		t.Fatalf("start: %+v, %v", res, err)
	}
	sc := follow(t, c, spec.ID)
	var off int64
	send := func(line string) {
		t.Helper()
		if off, err = c.WriteStdin(ctx, spec.ID, off, []byte(line+"\n"), false); err != nil {
			t.Fatal(err)
		}
	}

	// The terminal echoes what is typed: the quotes keep a marker out of the echo.
	send(`tty -s && echo is-a-""tty; echo to-""stderr >&2; stty size`)
	sc.waitFor(t, "is-a-tty")
	sc.waitFor(t, "to-stderr")
	sc.waitFor(t, "24 80\r\n")

	again, err := c.Start(ctx, spec)
	if err != nil || again.Created || again.PID != res.PID {
		t.Errorf("a repeated start with the same terminal: %+v, %v; want the exec (pid %d), not created", again, err, res.PID)
	}
	other := spec
	other.TTY = &execspec.TTY{Rows: 25, Cols: 80}
	if _, err := c.Start(ctx, other); !errors.Is(err, sandboxd.ErrSpecMismatch) {
		t.Errorf("a repeated start with another terminal: %v, want ErrSpecMismatch", err)
	}

	// The shell waits in a foreground job that reports SIGWINCH; then it prints the new size.
	send(`sh -c 'trap "echo got-""winch; exit" WINCH; echo wait""ing; while :; do sleep 0.05; done'; stty size`)
	sc.waitFor(t, "waiting")
	if err := c.Resize(ctx, spec.ID, execspec.TTY{Rows: 30, Cols: 100}); err != nil {
		t.Fatal(err)
	}
	sc.waitFor(t, "got-winch")
	sc.waitFor(t, "30 100\r\n")

	send("exit 7")
	<-sc.done
	if sc.exit == nil || sc.exit.ExitCode == nil || *sc.exit.ExitCode != 7 || sc.stderr != 0 {
		t.Fatalf("exit %+v with %d stderr bytes; want exit code 7 and every byte as stdout", sc.exit, sc.stderr)
	}
	if err := c.Resize(ctx, spec.ID, execspec.TTY{Rows: 24, Cols: 80}); !errors.Is(err, sandboxd.ErrExited) {
		t.Errorf("a resize after the exit: %v, want ErrExited", err)
	}
}

// TestTTYOutputCap: a terminal's output is journaled under the same cap as a pipe's.
func TestTTYOutputCap(t *testing.T) {
	h := startServer(t, func(o *sandboxd.Options) { o.MaxOutputBytes = 64 << 10 })
	spec := sandboxd.Spec{Command: "head", Args: []string{"-c", "1000000", "/dev/zero"}, Stdin: true, TTY: &execspec.TTY{Rows: 24, Cols: 80}}
	spec.ID = newID()
	if _, err := h.tls.Start(t.Context(), spec); err != nil {
		t.Fatal(err)
	}
	sc := follow(t, h.tls, spec.ID)
	<-sc.done
	if sc.exit == nil || !sc.exit.Truncated || len(sc.String()) > 64<<10 || len(sc.String()) < 32<<10 {
		t.Errorf("exit %+v with %d bytes; want truncated under 64 KiB", sc.exit, len(sc.String()))
	}
}

// TestTTYStdinEOF: an eof closes sandboxd's write end only: the terminal's output still flows,
// and the command keeps running until it ends on its own.
func TestTTYStdinEOF(t *testing.T) {
	h := startServer(t, nil)
	spec := sandboxd.Spec{ID: newID(), Command: "sh", Args: sh("read line; echo got-$line; sleep 0.2; echo after-eof"),
		Stdin: true, TTY: &execspec.TTY{Rows: 24, Cols: 80}}
	if _, err := h.tls.Start(t.Context(), spec); err != nil {
		t.Fatal(err)
	}
	sc := follow(t, h.tls, spec.ID)
	if _, err := h.tls.WriteStdin(t.Context(), spec.ID, 0, []byte("x\n"), true); err != nil {
		t.Fatal(err)
	}
	<-sc.done
	if out := sc.String(); !strings.Contains(out, "got-x") || !strings.Contains(out, "after-eof") || sc.exit == nil || *sc.exit.ExitCode != 0 {
		t.Errorf("output %q, exit %+v; want got-x, after-eof and exit 0", out, sc.exit)
	}
}
