// Package execclient is the Go client of kubeclip's exec protocol (docs/exec.md, "NATS
// protocol"): it runs a command in an exec-capable lease's pod through the exec-workers, sends
// its stdin with offsets, collects its output in order, and survives the loss of the replica
// serving it by attaching through another one. The kubeclip CLI and the tests use it.
package execclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/oklog/ulid/v2"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// Defaults of Options.
const (
	// DefaultStallTimeout: a replica sends something every second, so three seconds of silence
	// means it is gone (or the message that would have arrived was lost): attach again.
	DefaultStallTimeout = 3 * time.Second
	// DefaultMaxOutputBytes caps the stdout and the stderr a Result keeps, each.
	DefaultMaxOutputBytes = 64 << 20
	// DefaultExitGrace is how long past the command's timeout the client waits for the exit
	// (sandboxd kills the command at its timeout; the exit frame follows).
	DefaultExitGrace = 10 * time.Second
	// DefaultNoResponders is how long the client retries a request that no exec-worker
	// receives before it gives up with ErrUnavailable.
	DefaultNoResponders = 10 * time.Second
	// stdinReplyTimeout bounds the wait for a stdin message's answer.
	stdinReplyTimeout = 10 * time.Second
)

// ErrNoExit is returned when the exit did not arrive within the command's timeout plus the
// grace: the client signalled SIGKILL and gave up.
var ErrNoExit = errors.New("execclient: no exit within the command's timeout")

// Options configure a Client.
type Options struct {
	// NATS is the connection; required.
	NATS *nats.Conn
	// Subjects carries the subject prefix.
	Subjects events.Subjects
	// StallTimeout, MaxOutputBytes, ExitGrace and NoResponders default to the constants above.
	StallTimeout   time.Duration
	MaxOutputBytes int
	ExitGrace      time.Duration
	NoResponders   time.Duration
	// Now is the clock (default time.Now); NewID makes exec ids (default a ULID).
	Now   func() time.Time
	NewID func() string
}

// Client runs execs. It is safe for concurrent use.
type Client struct {
	opts     Options
	subjects execproto.Subjects
}

// New validates opts and returns a Client.
func New(opts Options) (*Client, error) {
	if opts.NATS == nil {
		return nil, errors.New("execclient: Options.NATS is required")
	}
	if opts.StallTimeout <= 0 {
		opts.StallTimeout = DefaultStallTimeout
	}
	if opts.MaxOutputBytes <= 0 {
		opts.MaxOutputBytes = DefaultMaxOutputBytes
	}
	if opts.ExitGrace <= 0 {
		opts.ExitGrace = DefaultExitGrace
	}
	if opts.NoResponders <= 0 {
		opts.NoResponders = DefaultNoResponders
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.NewID == nil {
		opts.NewID = func() string { return ulid.Make().String() }
	}
	return &Client{opts: opts, subjects: execproto.NewSubjects(opts.Subjects)}, nil
}

// Lease names the lease an exec runs in.
type Lease struct {
	CompanyID string
	RunID     string
	// ProviderLeaseID is the run's `created` event's providerLeaseId.
	ProviderLeaseID string
}

// Exec is a command to run.
type Exec struct {
	Lease
	// ID is the exec id; empty: a new ULID.
	ID      string
	Command string
	Args    []string
	Cwd     string
	Env     map[string]string
	// Timeout kills the command's process tree after this long; 0: none.
	Timeout time.Duration
	// Stdin is the command's stdin; nil: /dev/null. StdinBytes is its size when known (-1 or
	// 0 with a non-nil Stdin: unknown).
	Stdin      io.Reader
	StdinBytes int64
	// Record publishes the output as `exec` run events.
	Record bool
	// MaxOutputBytes caps the exec's journal in the pod; 0: sandboxd's cap.
	MaxOutputBytes int64
	// TTY runs the command on a pseudo-terminal of this size. Its input is Stdin (required,
	// sent as it comes), its output one stream: Stdout. Resize carries the terminal's later
	// sizes (a window resized); the latest is sent to the replica serving the exec.
	TTY    *execspec.TTY
	Resize <-chan execspec.TTY
	// Stdout and Stderr, when set, receive the output as it arrives, in order, instead of the
	// Result.
	Stdout, Stderr io.Writer
	// OnStarted, when set, is told the name of each replica that starts serving the exec (the
	// first, then one after every takeover).
	OnStarted func(replica string)
	// OnNotice, when set, is told what the exec-worker says about the exec beside its output
	// (execproto.Notice: that a budget stopped its recording).
	OnNotice func(execproto.Notice)
}

// Result is how an exec ended and what it printed.
type Result struct {
	ExecID   string
	ExitCode *int
	Signal   *string
	TimedOut bool
	// Stdout and Stderr hold the output of the streams that had no writer, each up to
	// Options.MaxOutputBytes; Truncated says that more was printed (here or in the pod's
	// journal).
	Stdout, Stderr []byte
	Truncated      bool
	// LastSeq is the exec's last journal seq; Attaches counts the attaches the client needed.
	LastSeq  uint64
	Attaches int
	// Replica is the exec-worker that sent the exit.
	Replica string
}

// Run runs e and returns its result once it exited. An `error` from the service is returned as
// an *execproto.Error (errors.Is(err, execproto.ErrLeaseEnded), …). When ctx ends first, the
// command is sent SIGKILL and ctx's error is returned with what arrived.
func (c *Client) Run(ctx context.Context, e Exec) (Result, error) {
	if e.ID == "" {
		e.ID = c.opts.NewID()
	}
	stdinBytes := e.StdinBytes
	switch {
	case e.Stdin == nil:
		stdinBytes = 0
	case stdinBytes <= 0 || e.TTY != nil: // a terminal's input has no length
		stdinBytes = -1
	}
	if e.TTY != nil && e.Stdin == nil {
		return Result{ExecID: e.ID}, errors.New("execclient: an exec with a TTY needs Stdin")
	}
	req := execproto.StartRequest{
		ExecID: e.ID, ProviderLeaseID: e.ProviderLeaseID, Command: e.Command, Args: e.Args, Cwd: e.Cwd, Env: e.Env,
		TimeoutMs: e.Timeout.Milliseconds(), StdinBytes: stdinBytes, Record: e.Record, MaxOutputBytes: e.MaxOutputBytes,
		TTY: e.TTY,
	}
	if err := req.Validate(); err != nil {
		return Result{ExecID: e.ID}, err
	}
	st, err := c.newStream(e.Lease, e.ID, e.Stdout, e.Stderr)
	if err != nil {
		return Result{ExecID: e.ID}, err
	}
	st.start, st.onStarted, st.onNotice = &req, e.OnStarted, e.OnNotice
	if e.Stdin != nil {
		st.stdin = newStdinSender(c.opts.NATS, e.Stdin)
	}
	if e.TTY != nil && e.Resize != nil {
		st.resizer = newResizer(c.opts.NATS, e.Resize)
	}
	if e.Timeout > 0 {
		st.deadline = c.opts.Now().Add(e.Timeout + c.opts.ExitGrace)
	}
	return st.run(ctx)
}

// Attach follows an exec that runs or ran (another client's, such as one started by Paperclip)
// from journal seq fromSeq (1: the whole output) until its exit. It sends no stdin and does
// not drop the journal at the end: the exec stays the starting client's.
func (c *Client) Attach(ctx context.Context, l Lease, execID string, fromSeq uint64, stdout, stderr io.Writer) (Result, error) {
	if fromSeq == 0 {
		fromSeq = 1
	}
	st, err := c.newStream(l, execID, stdout, stderr)
	if err != nil {
		return Result{ExecID: execID}, err
	}
	st.next, st.observer = fromSeq, true
	return st.run(ctx)
}

// Signal sends sig ("SIGTERM") to the exec's process group and returns the answer.
func (c *Client) Signal(ctx context.Context, l Lease, execID, sig string) (execproto.Signaled, error) {
	subj, err := c.subjects.Request(l.CompanyID, l.RunID, execproto.OpSignal)
	if err != nil {
		return execproto.Signaled{}, err
	}
	m, err := execproto.NewJSONMsg(subj, "", execproto.SignalRequest{ExecID: execID, ProviderLeaseID: l.ProviderLeaseID, Signal: sig})
	if err != nil {
		return execproto.Signaled{}, err
	}
	m.Header.Del(execproto.HeaderKind)
	reply, err := c.opts.NATS.RequestMsgWithContext(ctx, m)
	if err != nil {
		return execproto.Signaled{}, fmt.Errorf("signalling exec %s: %w", execID, err)
	}
	var res execproto.Signaled
	if err := decodeReply(reply, execproto.KindSignaled, &res); err != nil {
		return execproto.Signaled{}, fmt.Errorf("signalling exec %s: %w", execID, err)
	}
	return res, nil
}
