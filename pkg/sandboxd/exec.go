package sandboxd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// execution is one exec: its spec, process, stdin state and journal.
type execution struct {
	spec    Spec
	log     zerolog.Logger
	journal *journal

	// started is closed once pid and startedAt are set, or the command failed to start.
	started   chan struct{}
	pid       int
	startedAt time.Time

	tty *os.File // the terminal's master (set once at start); nil without a terminal

	stdinMu   sync.Mutex
	stdin     *os.File // set once at start; closed at eof or when the command exits
	stdinOff  int64
	stdinDone bool        // eof received (under stdinMu)
	exited    atomic.Bool // the command's main process has exited
	timedOut  atomic.Bool

	done      chan struct{} // closed once the server counted the command as ended
	ttl       *time.Timer   // forgets the exec after the journal TTL (under Server.mu)
	forgotten bool          // deleted (under Server.mu)

	exitSent     chan struct{} // closed once a client was sent the exit frame
	exitSentOnce sync.Once
}

func newExecution(spec Spec, j *journal, log zerolog.Logger) *execution {
	return &execution{
		spec:     spec,
		journal:  j,
		log:      log.With().Str(LogKeyExecID, spec.ID).Str(LogKeyCommand, filepath.Base(spec.Command)).Logger(),
		started:  make(chan struct{}),
		done:     make(chan struct{}),
		exitSent: make(chan struct{}),
	}
}

func (e *execution) markExitSent() { e.exitSentOnce.Do(func() { close(e.exitSent) }) }

// startedPID is the command's pid once started (0 if it could not be); ok is false before.
func (e *execution) startedPID() (pid int, ok bool) {
	select {
	case <-e.started:
		return e.pid, true
	default:
		return 0, false
	}
}

func (e *execution) running() bool {
	select {
	case <-e.done:
		return false
	default:
		return true
	}
}

// supervise waits for the command's exit (or kills its tree at the timeout), drains its pipes
// for at most grace after that, and journals the exit.
func (e *execution) supervise(p *process, grace time.Duration, buffers *sync.Pool) execspec.Exit {
	var wg sync.WaitGroup
	for _, s := range []struct {
		f      *os.File
		stream Stream
	}{{p.stdout, Stdout}, {p.stderr, Stderr}} {
		if s.f == nil { // a terminal's output is one stream
			continue
		}
		wg.Go(func() {
			buf := buffers.Get().(*[frameHeaderSize + readSize]byte)
			defer buffers.Put(buf)
			pump(s.f, s.stream, e.journal, buf[:])
		})
	}
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()

	var timeout <-chan time.Time
	if e.spec.TimeoutMs > 0 {
		t := time.NewTimer(time.Duration(e.spec.TimeoutMs) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	var ws syscall.WaitStatus
wait:
	for {
		select {
		case ws = <-p.status:
			break wait
		case <-timeout:
			e.timedOut.Store(true)
			killTree(p.pid)
			timeout = nil
		}
	}
	e.exited.Store(true)
	if p.stdin != nil {
		_ = p.stdin.Close() // unblocks a stdin write stuck on a pipe a background process holds
	}
	// Like exec.Cmd's WaitDelay: a background process that inherited stdout or stderr must not
	// hold the exec open. One that redirected its output (a server started with nohup … &) is
	// not affected and keeps running.
	t := time.NewTimer(grace)
	select {
	case <-drained:
	case <-t.C:
	}
	t.Stop()
	closeAll([]*os.File{p.stdout, p.stderr})
	<-drained

	exit := execspec.Exit{TimedOut: e.timedOut.Load()}
	switch {
	case ws.Exited():
		code := ws.ExitStatus()
		exit.ExitCode = &code
	case ws.Signaled():
		name := unix.SignalName(ws.Signal())
		exit.Signal = &name
	}
	return e.journal.finish(exit)
}

// failStart ends an exec whose command could not start, as a shell would: the message on
// stderr and its exit code.
func (e *execution) failStart(err error) execspec.Exit {
	code := exitCannotRun
	var se *startError
	if errors.As(err, &se) {
		code = se.code
	}
	msg := "sandboxd: " + err.Error() + "\n"
	buf := make([]byte, frameHeaderSize+len(msg))
	copy(buf[frameHeaderSize:], msg)
	e.journal.append(Stderr, buf)
	e.exited.Store(true)
	return e.journal.finish(execspec.Exit{ExitCode: &code, Error: err.Error()})
}

// pump journals every read of f as one chunk until f ends or is closed. buf is scratch space of
// frameHeaderSize+readSize bytes.
func pump(f *os.File, stream Stream, j *journal, buf []byte) {
	for {
		n, err := f.Read(buf[frameHeaderSize:])
		if n > 0 {
			j.append(stream, buf[:frameHeaderSize+n])
		}
		if err != nil {
			return
		}
	}
}

// errNoTTY is a resize of an exec started without a terminal.
var errNoTTY = errors.New("the exec has no terminal")

// resize sets the size of the exec's terminal while its command runs.
func (e *execution) resize(sz execspec.TTY) error {
	if e.tty == nil {
		return errNoTTY
	}
	if e.exited.Load() {
		return errPTYClosed
	}
	return resizePTY(e.tty, sz)
}

// Errors of writeStdin, mapped to API codes by the handler.
var (
	errOffsetMismatch = errors.New("offset is not the current stdin offset")
	errStdinClosed    = errors.New("stdin is closed")
)

// writeStdin copies body to the command's stdin if offset is the number of bytes received so
// far, and closes stdin after it when eof. It returns the new offset. Writes are serialised;
// ctx interrupts a write blocked on a full pipe.
func (e *execution) writeStdin(ctx context.Context, offset int64, body io.Reader, eof bool) (int64, error) {
	e.stdinMu.Lock()
	defer e.stdinMu.Unlock()
	if offset != e.stdinOff {
		return e.stdinOff, fmt.Errorf("%w: got %d, at %d", errOffsetMismatch, offset, e.stdinOff)
	}
	if e.stdin == nil || e.stdinDone || e.exited.Load() {
		// A retried final write (eof, nothing more) is answered as it was the first time.
		if e.stdinDone && eof && isEmpty(body) {
			return e.stdinOff, nil
		}
		return e.stdinOff, errStdinClosed
	}
	stop := context.AfterFunc(ctx, func() { _ = e.stdin.SetWriteDeadline(time.Now()) })
	n, err := copyStdin(e.stdin, body)
	if !stop() {
		err = errors.Join(err, ctx.Err())
	}
	_ = e.stdin.SetWriteDeadline(time.Time{})
	e.stdinOff += n
	if err != nil {
		return e.stdinOff, err
	}
	if eof {
		e.stdinDone = true
		if err := e.stdin.Close(); err != nil && !errors.Is(err, os.ErrClosed) {
			return e.stdinOff, fmt.Errorf("closing stdin: %w", err)
		}
	}
	return e.stdinOff, nil
}

// copyStdin copies body into w. A failed write means the command's stdin is gone
// (errStdinClosed); a failed read is the request's fault and is returned as is.
func copyStdin(w *os.File, body io.Reader) (int64, error) {
	buf := make([]byte, 64<<10)
	var n int64
	for {
		m, rerr := body.Read(buf)
		if m > 0 {
			k, werr := w.Write(buf[:m])
			n += int64(k)
			if werr != nil {
				if errors.Is(werr, os.ErrDeadlineExceeded) {
					return n, fmt.Errorf("writing stdin: %w", werr)
				}
				return n, fmt.Errorf("%w: %w", errStdinClosed, werr)
			}
		}
		if errors.Is(rerr, io.EOF) {
			return n, nil
		}
		if rerr != nil {
			return n, fmt.Errorf("reading the request body: %w", rerr)
		}
	}
}

func isEmpty(r io.Reader) bool {
	var b [1]byte
	n, _ := io.ReadFull(r, b[:])
	return n == 0
}
