package execsvc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/inbox"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// natsConn is the part of *nats.Conn a session uses.
type natsConn interface {
	PublishMsg(m *nats.Msg) error
	Subscribe(subject string, cb nats.MsgHandler) (*nats.Subscription, error)
}

var _ natsConn = (*nats.Conn)(nil)

// stdinQueue is how many stdin messages wait for sandboxd: a client sends one at a time and
// waits for its answer, so more means a client that does not follow the protocol.
const stdinQueue = 4

// resizeQueue is how many resize messages wait for sandboxd: a terminal window dragged
// sends a burst; the client sends again what got no answer.
const resizeQueue = 4

// resizeTimeout bounds one resize call to sandboxd, below the client's request timeout.
const resizeTimeout = 5 * time.Second

// stdinWriteTimeout bounds one stdin write: a command that does not read its stdin blocks the
// pipe; the client's request times out first and it sends again after the next `started`.
const stdinWriteTimeout = time.Minute

// sessionDeps is what a session needs from the service, handed to it.
type sessionDeps struct {
	nc        natsConn
	pods      Pods
	events    eventPublisher
	observer  Observer
	now       func() time.Time
	heartbeat time.Duration
	linger    time.Duration
	patience  time.Duration
	reconnect time.Duration
	recording recordingDeps // a recorded exec's
	replies   inbox.Rule
	// buffers are the replica's budget for frames read from pods and stdin queued for them,
	// lines the recorder's (limits.go): every session's buffers are taken from them as they
	// grow.
	buffers, lines *fairPool
}

// recordedFrameCopies is how many times a recorded exec's chunk is charged: the frame, its copy
// in the recorder's batch, the event's text and the event's JSON are alive at once.
const recordedFrameCopies = 4

// recordMode says whether a session records its exec's output into the run stream.
type recordMode int

const (
	notRecorded recordMode = iota
	// recorded: the exec's RecordedBucket entry says so (and how far its recording got).
	recorded
	// recordedUnnoted: the start could not write the exec's entry and went on without it
	// (Service.start); the recording writes it as it goes.
	recordedUnnoted
)

// sessionSpec is one exec stream to serve.
type sessionSpec struct {
	id      string // this session, in takeover messages
	ref     events.RunRef
	rec     lease.Record
	pod     Pod
	client  *sandboxd.Client
	execID  string
	command string // base name, for logs and recorded events
	record  recordMode
	noted   *notedExec // the exec's entry as the request wrote or read it; nil: read it
	reply   string
	ioSubj  string // this session's: stdin, acks, close
	ctlSubj string // the exec's: takeovers
	from    uint64
	started execproto.Started
}

// session serves one exec's stream to one client inbox: `started`, the output from seq from
// with flow control and heartbeats, and `exit` (or `error`); it relays the client's stdin, acks
// and close from its own io subject. Another session of the same exec for the same inbox (this
// replica's or another's, after the client attached) takes the stream over: this one stops
// without a word. Sessions of other inboxes (an observer's attach) run side by side.
type session struct {
	deps sessionDeps
	sessionSpec
	log zerolog.Logger
	// cancel ends the session's context: a takeover, the client's close.
	cancel context.CancelFunc

	win      *window
	lastSent atomic.Uint64 // the highest seq sent
	lastMsg  atomic.Int64  // when the client was last sent anything (unix nanoseconds)
	finished atomic.Bool   // exit or error sent: heartbeats stop
	closed   atomic.Bool   // the client sent close
	stdin    chan *nats.Msg
	resize   chan *nats.Msg
	// buffers and lines are the session's parts of the replica's byte budgets.
	buffers, lines *account
}

// newSession returns the session and the context to run it with; its cancel is the session's
// from the start, so a newer session of the exec can end it before it runs.
func newSession(ctx context.Context, deps sessionDeps, spec sessionSpec, log zerolog.Logger) (*session, context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	s := &session{
		deps: deps, sessionSpec: spec, log: log, cancel: cancel,
		win: newWindow(spec.from - 1), stdin: make(chan *nats.Msg, stdinQueue), resize: make(chan *nats.Msg, resizeQueue),
		buffers: newAccount(deps.buffers, spec.ref.CompanyID), lines: newAccount(deps.lines, spec.ref.CompanyID),
	}
	s.lastSent.Store(spec.from - 1)
	return s, ctx
}

// run serves the stream until the exit was sent and the client closed (or lingered out), an
// error ended it, or it was taken over or cancelled.
func (s *session) run(ctx context.Context) {
	// Given back last, once nothing of the session's can take more.
	defer s.lines.close()
	defer s.buffers.close()
	defer s.cancel()
	for subj, cb := range map[string]nats.MsgHandler{s.ioSubj: s.onIO, s.ctlSubj: s.onControl} {
		sub, err := s.deps.nc.Subscribe(subj, cb)
		if err != nil {
			s.log.Warn().Err(err).Msg("subscribing to the exec's io subjects failed")
			s.sendError(execproto.NewError(execproto.CodeUnavailable, "", "the exec-worker could not subscribe to the io subject"))
			return
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	takeover := execproto.NewMsg(s.ctlSubj, execproto.KindTakeover, nil)
	takeover.Header.Set(execproto.HeaderSession, s.id)
	takeover.Header.Set(execproto.HeaderInbox, s.reply)
	_ = s.deps.nc.PublishMsg(takeover)
	// A session taken over before it began says nothing: its `started` would point the client
	// at an io subject nobody serves.
	if ctx.Err() != nil {
		return
	}
	if err := s.sendJSON(execproto.KindStarted, s.started); err != nil {
		return
	}

	var wg sync.WaitGroup
	wg.Go(func() { s.heartbeats(ctx) })
	wg.Go(func() { s.relayStdin(ctx) })
	wg.Go(func() { s.relayResize(ctx) })
	exit, err := s.relayOutput(ctx)
	s.finished.Store(true)
	var perr *execproto.Error
	switch {
	case exit != nil:
		s.log.Debug().Uint64(logKeyLastSeq, exit.LastSeq).Msg("exec stream done")
		s.lingerForClose(ctx)
	case errors.As(err, &perr):
		s.log.Info().Str(events.LogKeyCode, string(perr.Code)).Msg("exec stream ended with an error")
		s.sendError(perr)
	case ctx.Err() != nil:
		s.log.Debug().Msg("exec stream handed over or stopped")
	default:
		s.log.Info().Err(err).Msg("exec stream stopped")
	}
	s.cancel()
	wg.Wait()
	if s.closed.Load() {
		s.deleteJournal(ctx)
	}
}

// onControl stops the session when another one took its client's stream over.
func (s *session) onControl(m *nats.Msg) {
	if execproto.KindOf(m) == execproto.KindTakeover && m.Header.Get(execproto.HeaderInbox) == s.reply &&
		m.Header.Get(execproto.HeaderSession) != s.id {
		s.cancel()
	}
}

// onIO handles the session's io subject: the client's stdin, resizes, acks and close. It runs
// on the subscription's goroutine and never blocks.
func (s *session) onIO(m *nats.Msg) {
	switch execproto.KindOf(m) {
	case execproto.KindAck:
		if seq, ok := execproto.Uint(m, execproto.HeaderSeq); ok {
			s.win.ack(seq)
		}
	case execproto.KindStdin:
		if !s.deps.replies.Allows(m.Reply) {
			s.deps.observer.ExecDropped(DropReplyNotInbox)
			return
		}
		// Queued only with its bytes taken from the budget; else unanswered: the client sends
		// it again.
		if !s.buffers.tryTake(int64(len(m.Data))) {
			return
		}
		select {
		case s.stdin <- m:
		default: // unanswered: the client sends it again
			s.buffers.release(int64(len(m.Data)))
		}
	case execproto.KindResize:
		if !s.deps.replies.Allows(m.Reply) {
			s.deps.observer.ExecDropped(DropReplyNotInbox)
			return
		}
		select {
		case s.resize <- m:
		default: // unanswered: the client sends it again
		}
	case execproto.KindClose:
		s.closed.Store(true)
		s.cancel()
	}
}

// relayOutput streams the journal to the client until the exit frame, reopening a broken stream
// from the next seq while the pod lives. A recorded exec is read from seq 1 whatever the
// client needs, to rebuild the recording's state (record.go).
func (s *session) relayOutput(ctx context.Context) (*execspec.Exit, error) {
	var rec *recording
	read := s.from - 1 // the last seq read from the journal
	if s.record != notRecorded {
		var unnoted recordedExec
		if s.record == recordedUnnoted {
			unnoted = recordedExec{Command: s.command, Inbox: s.reply}
		}
		var err error
		if rec, err = startRecording(ctx, s.recordingDeps(), s.ref, s.execID, s.noted, unnoted); err != nil {
			return nil, err
		}
		if rec != nil {
			defer rec.stop()
			read = 0
		}
	}
	opened := false
	var brokenSince time.Time
	backoff := 100 * time.Millisecond
	for {
		stream, err := s.client.Output(ctx, s.execID, read+1)
		if err == nil {
			stream.Charge(s.frameBudget(ctx, rec != nil))
			opened = true
			before := read
			var exit *execspec.Exit
			exit, err = s.pump(ctx, stream, rec, &read)
			_ = stream.Close()
			var perr *execproto.Error // a frame larger than the replica's whole buffer budget
			if exit != nil || errors.Is(err, errClientGone) || errors.Is(err, errUnreachable) || isTerminal(err) || errors.Is(err, errRecordingTakenOver) || errors.As(err, &perr) {
				return exit, err
			}
			if read > before {
				brokenSince, backoff = time.Time{}, 100*time.Millisecond
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		c := callOpen
		if opened {
			c = callReopen
		}
		if m := meaningOf(c, err); m.fate == fateRefused {
			return nil, m.err(s.execID, s.rec.WorkloadName)
		}
		if cur, ok := s.deps.pods.Current(s.ref, s.rec); !ok || cur.UID != s.pod.UID {
			return nil, execproto.NewError(execproto.CodeWorkloadLost, "", "the pod of lease %s is gone", s.rec.WorkloadName)
		}
		now := s.deps.now()
		if brokenSince.IsZero() {
			brokenSince = now
		}
		if now.Sub(brokenSince) > s.deps.reconnect {
			return nil, execproto.NewError(execproto.CodeUnavailable, "", "sandboxd in pod %s stopped answering", s.rec.WorkloadName)
		}
		s.log.Debug().Err(err).Uint64(logKeyFromSeq, read+1).Msg("reopening the exec's output stream")
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// pump relays one output stream's frames; read advances with every chunk read.
func (s *session) pump(ctx context.Context, stream *sandboxd.OutputStream, rec *recording, read *uint64) (*execspec.Exit, error) {
	for {
		f, err := stream.Next()
		if err != nil {
			return nil, err
		}
		switch f := f.(type) {
		case *sandboxd.Chunk:
			err := s.relayChunk(ctx, f, rec, read)
			s.buffers.release(frameCharge(len(f.Data), rec != nil))
			if err != nil {
				return nil, err
			}
		case *execspec.Exit:
			if rec != nil {
				if err := rec.exit(ctx, f); err != nil {
					return nil, err
				}
			}
			s.log.Info().Uint64(logKeyLastSeq, f.LastSeq).Any(logKeyExitCode, f.ExitCode).Any(logKeySignal, f.Signal).
				Bool(logKeyTimedOut, f.TimedOut).Int64(logKeyBytes, f.StdoutBytes+f.StderrBytes).Msg("exec exited")
			err := s.sendJSON(execproto.KindExit, f)
			if rec != nil {
				rec.complete(ctx)
			}
			if err != nil {
				return nil, err
			}
			return f, nil
		}
	}
}

// relayChunk records a chunk and sends it to the client.
func (s *session) relayChunk(ctx context.Context, f *sandboxd.Chunk, rec *recording, read *uint64) error {
	if f.Seq != *read+1 {
		return fmt.Errorf("%w: chunk %d after %d", sandboxd.ErrProtocol, f.Seq, *read)
	}
	*read = f.Seq
	if rec != nil {
		if err := rec.chunk(ctx, f); err != nil {
			return err
		}
		if f.Seq < s.from {
			return nil // the client has it
		}
	}
	if err := s.win.wait(ctx, len(f.Data), execproto.MaxUnacked, s.deps.patience); err != nil {
		return err
	}
	m := execproto.NewMsg(s.reply, execproto.KindOut, f.Data)
	execproto.SetUint(m, execproto.HeaderSeq, f.Seq)
	m.Header.Set(execproto.HeaderStream, f.Stream.String())
	s.win.add(f.Seq, len(f.Data))
	if err := s.publish(m); err != nil {
		return err
	}
	s.lastSent.Store(f.Seq)
	s.deps.observer.ExecOutput(len(f.Data))
	return nil
}

// frameCharge is what a frame of n bytes is charged to the session's buffers.
func frameCharge(n int, recorded bool) int64 {
	if recorded {
		return int64(n) * recordedFrameCopies
	}
	return int64(n)
}

// frameBudget charges the frames the session reads to its buffers: a frame is read once its
// bytes are granted, and waits (its reader with it, and so sandboxd's writer) until they are.
func (s *session) frameBudget(ctx context.Context, recorded bool) sandboxd.Budget {
	return budgetFuncs{
		take:    func(n int) error { return s.buffers.wait(ctx, frameCharge(n, recorded)) },
		release: func(n int) { s.buffers.release(frameCharge(n, recorded)) },
	}
}

// budgetFuncs is a sandboxd.Budget of two funcs.
type budgetFuncs struct {
	take    func(n int) error
	release func(n int)
}

func (b budgetFuncs) Take(n int) error { return b.take(n) }
func (b budgetFuncs) Release(n int)    { b.release(n) }

// recordingDeps is what the session's recording needs: its retries are logged, and a budget
// that stops it is logged and told to the client.
func (s *session) recordingDeps() recordingDeps {
	deps := s.deps.recording
	deps.lineMem = s.lines
	deps.onRetry = func(err error) {
		s.log.Warn().Err(err).Msg("storing a recorded exec's event failed; retrying")
	}
	deps.onStop = s.recordingStopped
	return deps
}

// recordingStopped tells the client, and the log, that budget be stopped the exec's recording:
// the company sees why its run's history stops there (the Paperclip plugin writes the notice
// into the run's log), the operator which company and budget (one line a stopped recording).
func (s *session) recordingStopped(be *events.BudgetExceededError) {
	s.log.Info().Str(logKeyBudget, string(be.Kind)).Int64(logKeyLimit, be.Limit).
		Msg("recording stopped: the company's budget is used up; the command goes on unrecorded")
	n := execproto.Notice{
		ExecID: s.execID, Reason: execproto.NoticeRecordingStopped,
		Message: "output recording stopped because " + be.Budget() + " was reached; the command goes on and its output still reaches you, but the run's history keeps no more of it",
	}
	_ = s.sendJSON(execproto.KindNotice, n)
}

// heartbeats tells the client the stream is alive whenever it was sent nothing for a
// heartbeat interval; the header carries the last seq sent, so a client that lost the last
// chunk before a quiet spell notices the gap.
func (s *session) heartbeats(ctx context.Context) {
	t := time.NewTicker(s.deps.heartbeat / 4)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if s.finished.Load() {
			return
		}
		if s.deps.now().Sub(time.Unix(0, s.lastMsg.Load())) < s.deps.heartbeat {
			continue
		}
		m := execproto.NewMsg(s.reply, execproto.KindHeartbeat, nil)
		execproto.SetUint(m, execproto.HeaderSeq, s.lastSent.Load())
		_ = s.publish(m)
	}
}

// relayStdin writes the client's stdin messages to sandboxd, one at a time, and answers each
// with sandboxd's offset. A write that fails in transport is not answered: the client sends it
// again after its request times out.
func (s *session) relayStdin(ctx context.Context) {
	for {
		var m *nats.Msg
		select {
		case <-ctx.Done():
			return
		case m = <-s.stdin:
		}
		offset, ok := execproto.Uint(m, execproto.HeaderOffset)
		if !ok {
			s.buffers.release(int64(len(m.Data)))
			continue
		}
		eof := m.Header.Get(execproto.HeaderEOF) == "1"
		wctx, cancel := context.WithTimeout(ctx, stdinWriteTimeout)
		got, err := s.client.WriteStdin(wctx, s.execID, int64(offset), m.Data, eof)
		cancel()
		s.buffers.release(int64(len(m.Data)))
		reply := execproto.StdinReply{Offset: got}
		if err != nil {
			switch meaningOf(callStdin, err).fate {
			case fateDone:
			case fateStdinClosed:
				reply.Closed = true
			default:
				s.log.Debug().Err(err).Uint64(logKeyOffset, offset).Msg("writing stdin failed")
				continue
			}
		}
		data, _ := json.Marshal(reply)
		_ = m.Respond(data)
	}
}

// relayResize sets the size of the exec's terminal in sandboxd for each resize message, in
// order, and answers each with whether it took.
func (s *session) relayResize(ctx context.Context) {
	for {
		var m *nats.Msg
		select {
		case <-ctx.Done():
			return
		case m = <-s.resize:
		}
		_ = s.respondJSON(m, s.resizeTerminal(ctx, m))
	}
}

// resizeTerminal is a resize message's answer.
func (s *session) resizeTerminal(ctx context.Context, m *nats.Msg) execproto.ResizeReply {
	sz, err := execproto.ResizeOf(m)
	if err == nil {
		rctx, cancel := context.WithTimeout(ctx, resizeTimeout)
		err = s.client.Resize(rctx, s.execID, sz)
		cancel()
	}
	if err == nil {
		return execproto.ResizeReply{Resized: true}
	}
	var perr *execproto.Error
	if !errors.As(err, &perr) {
		mn := meaningOf(callResize, err)
		if mn.fate == fateExited {
			return execproto.ResizeReply{Code: execproto.SignalExited, Message: "the command exited; its terminal is closed"}
		}
		if mn.code == execproto.CodeUnavailable {
			s.log.Debug().Err(err).Msg("resizing the exec's terminal failed")
		}
		perr = mn.err(s.execID, s.rec.WorkloadName)
	}
	msg := perr.Message
	if perr.Field != "" {
		msg = perr.Field + ": " + msg
	}
	return execproto.ResizeReply{Code: string(perr.Code), Message: msg}
}

// lingerForClose keeps the io subscription after the exit for the client's close (which drops
// the journal), a takeover, or the linger bound.
func (s *session) lingerForClose(ctx context.Context) {
	t := time.NewTimer(s.deps.linger)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// deleteJournal drops the exec's journal at the client's close; a command still running (the
// client gave up on it) keeps its journal until it exits and expires.
func (s *session) deleteJournal(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := s.client.Delete(ctx, s.execID); err != nil && meaningOf(callDelete, err).fate != fateDone {
		s.log.Debug().Err(err).Msg("dropping the exec's journal failed")
	}
}

func (s *session) sendError(e *execproto.Error) {
	_ = s.sendJSON(execproto.KindError, e)
}

// respondJSON answers a client's io request with v as JSON.
func (s *session) respondJSON(m *nats.Msg, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return m.Respond(data)
}

func (s *session) sendJSON(kind execproto.Kind, v any) error {
	m, err := execproto.NewJSONMsg(s.reply, kind, v)
	if err != nil {
		return err
	}
	return s.publish(m)
}

// errUnreachable ends a session that cannot send: its connection to NATS is closed.
var errUnreachable = errors.New("the NATS connection is closed")

func (s *session) publish(m *nats.Msg) error {
	if err := s.deps.nc.PublishMsg(m); err != nil {
		return fmt.Errorf("sending %s to the client: %w: %w", execproto.KindOf(m), errUnreachable, err)
	}
	s.lastMsg.Store(s.deps.now().UnixNano())
	return nil
}

// isTerminal reports an error that reopening the stream cannot fix: a recorded event the run
// stream refuses.
func isTerminal(err error) bool {
	_, ok := events.AsTerminal(err)
	return ok
}
