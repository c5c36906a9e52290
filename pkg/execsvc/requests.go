package execsvc

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// attachReadyTimeout bounds how long an attach waits for a pod that exists but is not ready:
// an attach follows a start that found it ready, so this is a pod restarting its container.
const attachReadyTimeout = 10 * time.Second

// handle answers one request. Start and attach then serve the exec's stream, for as long as
// the command runs.
func (s *Service) handle(ctx context.Context, m *nats.Msg) {
	if m.Reply == "" {
		s.log.Debug().Str(events.LogKeySubject, m.Subject).Msg("exec request without a reply subject dropped")
		return
	}
	companyID, runID, op, err := s.subjects.ParseRequest(m.Subject)
	if err != nil {
		s.replyError(m.Reply, execproto.InvalidRequest("", "subject is not <prefix>.exec.<companyId>.<runId>.start|attach|signal"))
		return
	}
	r := &request{
		msg: m, op: op, ref: events.Ref(companyID, runID), at: s.opts.Now(),
		log: s.log.With().Str(events.LogKeyTenant, companyID).Str(events.LogKeyRunID, runID).Str(logKeyOp, string(op)).Logger(),
	}
	switch op {
	case execproto.OpStart:
		s.start(ctx, r)
	case execproto.OpAttach:
		s.attach(ctx, r)
	case execproto.OpSignal:
		s.signal(ctx, r)
	}
}

// request is one request being answered.
type request struct {
	msg *nats.Msg
	op  execproto.Op
	ref events.RunRef
	at  time.Time
	log zerolog.Logger
}

func (s *Service) start(ctx context.Context, r *request) {
	var req execproto.StartRequest
	if err := decode(r.msg.Data, &req); err != nil {
		s.refuse(r, err)
		return
	}
	r.log = r.log.With().Str(logKeyExecID, req.ExecID).Str(logKeyCommand, execproto.CommandName(req.Command)).Logger()
	rec, err := s.admit(ctx, r, req.ProviderLeaseID)
	if err != nil {
		s.refuse(r, err)
		return
	}
	release, ok := s.acquireSlot()
	if !ok {
		s.refuse(r, execproto.NewError(execproto.CodeUnavailable, "", "the exec-worker serves its maximum of streams; try again"))
		return
	}
	defer release()
	if req.Record {
		if err := s.recorded.put(ctx, r.ref, req.ExecID, execproto.CommandName(req.Command), r.msg.Reply); err != nil {
			s.refuse(r, err)
			return
		}
	}
	stop := s.heartbeatWhileWaiting(r)
	wait := s.opts.ReadyTimeout
	if t := time.Duration(req.TimeoutMs) * time.Millisecond; t > 0 && t < wait {
		wait = t
	}
	pod, client, res, err := s.startExec(ctx, r, rec, req.Spec(), wait)
	if err != nil {
		stop()
		s.refuse(r, err)
		return
	}
	started := execproto.Started{ExecID: req.ExecID, Replica: s.opts.Replica, StdinClosed: req.StdinBytes == 0}
	session := s.opts.NewID()
	if !res.Created && req.StdinBytes != 0 {
		s.takeOver(r, req.ExecID, session)
		if started.StdinOffset, started.StdinClosed, err = stdinState(ctx, client, req.ExecID); err != nil {
			stop()
			s.refuse(r, err)
			return
		}
	}
	stop()
	if res.Created {
		r.log.Info().Int(logKeyBytes, int(req.StdinBytes)).Bool("record", req.Record).Msg("exec started")
	}
	s.serveRequest(ctx, r, session, rec, pod, client, req.ExecID, execproto.CommandName(req.Command), req.Record, 1, started)
}

func (s *Service) attach(ctx context.Context, r *request) {
	var req execproto.AttachRequest
	if err := decode(r.msg.Data, &req); err != nil {
		s.refuse(r, err)
		return
	}
	r.log = r.log.With().Str(logKeyExecID, req.ExecID).Uint64(logKeyFromSeq, req.FromSeq).Logger()
	rec, err := s.admit(ctx, r, req.ProviderLeaseID)
	if err != nil {
		s.refuse(r, err)
		return
	}
	release, ok := s.acquireSlot()
	if !ok {
		s.refuse(r, execproto.NewError(execproto.CodeUnavailable, "", "the exec-worker serves its maximum of streams; try again"))
		return
	}
	defer release()
	pod, client, err := s.reach(ctx, r, rec)
	if err != nil {
		s.refuse(r, err)
		return
	}
	// The stdin state tells whether the pod knows the exec before anything is sent. The
	// client's earlier stream is stopped first: its stdin write, blocked on a command that does
	// not read, would hold the query up.
	session := s.opts.NewID()
	s.takeOver(r, req.ExecID, session)
	offset, closed, err := stdinState(ctx, client, req.ExecID)
	if err != nil {
		s.refuse(r, err)
		return
	}
	started := execproto.Started{ExecID: req.ExecID, Replica: s.opts.Replica, StdinOffset: offset, StdinClosed: closed}
	// An attach does not repeat the start's spec: whether the exec is recorded, and under
	// which command name, is in RecordedBucket. Only its own client's stream records.
	noted, recorded, err := s.recorded.get(ctx, r.ref, req.ExecID)
	if err != nil {
		s.refuse(r, err)
		return
	}
	record := recorded && noted.Inbox == r.msg.Reply
	s.serveRequest(ctx, r, session, rec, pod, client, req.ExecID, noted.Command, record, req.FromSeq, started)
}

func (s *Service) signal(ctx context.Context, r *request) {
	var req execproto.SignalRequest
	answer := func(res execproto.Signaled) {
		res.ExecID = req.ExecID
		if m, err := execproto.NewJSONMsg(r.msg.Reply, execproto.KindSignaled, res); err == nil {
			_ = s.opts.NATS.PublishMsg(m)
		}
	}
	fail := func(err error) {
		perr := r.asProtocolError(err)
		answer(execproto.Signaled{Code: string(perr.Code), Message: perr.Message})
	}
	if err := decode(r.msg.Data, &req); err != nil {
		fail(err)
		return
	}
	r.log = r.log.With().Str(logKeyExecID, req.ExecID).Logger()
	rec, err := s.admit(ctx, r, req.ProviderLeaseID)
	if err != nil {
		fail(err)
		return
	}
	pod, ok := s.opts.Pods.Current(r.ref, rec)
	if !ok {
		fail(execproto.NewError(execproto.CodeWorkloadLost, "", "lease %s has no pod", rec.WorkloadName))
		return
	}
	client, err := s.clients.get(r.ref, rec, pod, s.opts.Now())
	if err != nil {
		fail(err)
		return
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = client.Signal(sctx, req.ExecID, req.Signal)
	switch {
	case err == nil:
		r.log.Info().Str(logKeySignal, req.Signal).Msg("exec signalled")
		answer(execproto.Signaled{Delivered: true})
	case errors.Is(err, sandboxd.ErrExited):
		answer(execproto.Signaled{Code: execproto.SignalExited, Message: "the command and its process group are gone"})
	case errors.Is(err, sandboxd.ErrNotFound):
		fail(execproto.NewError(execproto.CodeExecNotFound, "execId", "the pod has no exec %s", req.ExecID))
	case errors.Is(err, sandboxd.ErrInvalidRequest):
		fail(execproto.InvalidRequest("signal", "is not a signal sandboxd knows"))
	default:
		r.log.Warn().Err(err).Msg("signalling an exec failed")
		fail(execproto.NewError(execproto.CodeUnavailable, "", "sandboxd in pod %s did not answer", pod.Name))
	}
}

// admit checks the request's lease (checkLease).
func (s *Service) admit(ctx context.Context, r *request, providerLeaseID string) (lease.Record, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	rec, err := checkLease(rctx, s.leases, r.ref, providerLeaseID)
	var perr *execproto.Error
	if err != nil && !errors.As(err, &perr) {
		r.log.Warn().Err(err).Msg("reading the lease record failed")
		return rec, execproto.NewError(execproto.CodeUnavailable, "", "the lease record could not be read; try again")
	}
	if err == nil {
		r.log = r.log.With().Str(events.LogKeyNamespace, rec.Namespace).Str(logKeyPod, rec.WorkloadName).Logger()
	}
	return rec, err
}

// startExec starts spec in the lease's pod once the pod is ready and sandboxd answers, within
// wait. Starting again after a failure in transport is safe: a repeated start of the same id
// and spec is answered with the exec that runs.
func (s *Service) startExec(ctx context.Context, r *request, rec lease.Record, spec sandboxd.Spec, wait time.Duration) (Pod, *sandboxd.Client, sandboxd.StartResult, error) {
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	backoff := 50 * time.Millisecond
	var lastErr error
	for {
		pod, err := s.opts.Pods.Ready(wctx, r.ref, rec)
		if err != nil {
			if ctx.Err() != nil {
				return Pod{}, nil, sandboxd.StartResult{}, ctx.Err()
			}
			return Pod{}, nil, sandboxd.StartResult{}, execproto.NewError(execproto.CodeNotReady, "", "the pod of lease %s was not ready within %s", rec.WorkloadName, wait)
		}
		client, err := s.clients.get(r.ref, rec, pod, s.opts.Now())
		if err != nil {
			return Pod{}, nil, sandboxd.StartResult{}, err
		}
		res, err := client.Start(wctx, spec)
		var ae *sandboxd.APIError
		switch {
		case err == nil:
			return pod, client, res, nil
		case errors.As(err, &ae):
			return Pod{}, nil, sandboxd.StartResult{}, startRefusal(ae, rec)
		case errors.Is(err, sandboxd.ErrServerKeyMismatch) && !errors.Is(lastErr, sandboxd.ErrServerKeyMismatch):
			r.log.Error().Err(err).Msg("sandboxd does not hold the lease's key: is --sandbox-key-file the dispatcher's?")
		}
		lastErr = err
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return Pod{}, nil, sandboxd.StartResult{}, ctx.Err()
			}
			if errors.Is(lastErr, sandboxd.ErrServerKeyMismatch) {
				return Pod{}, nil, sandboxd.StartResult{}, execproto.NewError(execproto.CodeUnavailable, "", "sandboxd in pod %s does not hold the lease's key", pod.Name)
			}
			r.log.Info().Err(lastErr).Msg("sandboxd did not answer")
			return Pod{}, nil, sandboxd.StartResult{}, execproto.NewError(execproto.CodeNotReady, "", "sandboxd in pod %s did not answer within %s", pod.Name, wait)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// startRefusal maps sandboxd's refusal of a start.
func startRefusal(ae *sandboxd.APIError, rec lease.Record) *execproto.Error {
	switch {
	case errors.Is(ae, sandboxd.ErrSpecMismatch):
		return execproto.InvalidRequest("execId", "exists with a different spec")
	case errors.Is(ae, sandboxd.ErrInvalidRequest), errors.Is(ae, sandboxd.ErrTooLarge):
		return execproto.InvalidRequest("", "sandboxd refused the command: %s", ae.Message)
	case errors.Is(ae, sandboxd.ErrDraining):
		return execproto.NewError(execproto.CodeWorkloadLost, "", "the pod of lease %s is shutting down", rec.WorkloadName)
	}
	return execproto.NewError(execproto.CodeUnavailable, "", "sandboxd refused the command (%s)", ae.Code)
}

// reach returns the client of the lease's pod for an attach: the pod must exist.
func (s *Service) reach(ctx context.Context, r *request, rec lease.Record) (Pod, *sandboxd.Client, error) {
	if _, ok := s.opts.Pods.Current(r.ref, rec); !ok {
		return Pod{}, nil, execproto.NewError(execproto.CodeWorkloadLost, "", "lease %s has no pod", rec.WorkloadName)
	}
	wctx, cancel := context.WithTimeout(ctx, attachReadyTimeout)
	defer cancel()
	pod, err := s.opts.Pods.Ready(wctx, r.ref, rec)
	if err != nil {
		return Pod{}, nil, execproto.NewError(execproto.CodeNotReady, "", "the pod of lease %s is not ready", rec.WorkloadName)
	}
	client, err := s.clients.get(r.ref, rec, pod, s.opts.Now())
	return pod, client, err
}

// stdinState asks sandboxd how much stdin it has, with an empty write at offset 0: answered
// with the current offset (a mismatch says it), or that stdin is closed.
func stdinState(ctx context.Context, client *sandboxd.Client, execID string) (int64, bool, error) {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	off, err := client.WriteStdin(qctx, execID, 0, nil, false)
	switch {
	case err == nil, errors.Is(err, sandboxd.ErrOffsetMismatch):
		return off, false, nil
	case errors.Is(err, sandboxd.ErrStdinClosed):
		return off, true, nil
	case errors.Is(err, sandboxd.ErrNotFound):
		return 0, false, execproto.NewError(execproto.CodeExecNotFound, "execId", "the pod has no exec %s (never started, closed, or expired)", execID)
	}
	return 0, false, execproto.NewError(execproto.CodeUnavailable, "", "sandboxd did not answer: %s", errorClass(err))
}

// serve runs the exec's session on this request's goroutine.
func (s *Service) serveRequest(ctx context.Context, r *request, id string, rec lease.Record, pod Pod, client *sandboxd.Client, execID, command string, record bool, from uint64, started execproto.Started) {
	ioSubj, err := s.subjects.IO(r.ref.CompanyID, r.ref.RunID, execID, id)
	if err != nil {
		s.refuse(r, err)
		return
	}
	ctlSubj, _ := s.subjects.Control(r.ref.CompanyID, r.ref.RunID, execID)
	started.IOSubject = ioSubj
	s.opts.Observer.ExecRequest(r.op, "", s.opts.Now().Sub(r.at))
	if command == "" {
		command = "?" // an attach of an exec that is not recorded: logs only
	}
	s.serve(ctx, sessionSpec{
		id: id, ref: r.ref, rec: rec, pod: pod, client: client, execID: execID, command: command,
		record: record, reply: r.msg.Reply, ioSubj: ioSubj, ctlSubj: ctlSubj, from: from, started: started,
	}, r.log)
}

// takeOver tells every session serving the client's stream of the exec, on any replica, to
// stop: session is about to serve it.
func (s *Service) takeOver(r *request, execID, session string) {
	ctl, err := s.subjects.Control(r.ref.CompanyID, r.ref.RunID, execID)
	if err != nil {
		return
	}
	m := execproto.NewMsg(ctl, execproto.KindTakeover, nil)
	m.Header.Set(execproto.HeaderSession, session)
	m.Header.Set(execproto.HeaderInbox, r.msg.Reply)
	_ = s.opts.NATS.PublishMsg(m)
	// Also this replica's own session of the stream, at once.
	s.mu.Lock()
	if old := s.active[streamKey{ref: r.ref, execID: execID, inbox: r.msg.Reply}]; old != nil {
		old.cancel()
	}
	s.mu.Unlock()
}

// heartbeatWhileWaiting tells the client the start is being worked on while it waits for the
// pod, so it does not send the start again; the returned func stops it.
func (s *Service) heartbeatWhileWaiting(r *request) func() {
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(s.opts.Heartbeat)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				_ = s.opts.NATS.PublishMsg(execproto.NewMsg(r.msg.Reply, execproto.KindHeartbeat, nil))
			}
		}
	}()
	return func() {
		select {
		case <-done:
		default:
			close(done)
			<-stopped
		}
	}
}

// refuse answers the request with an `error`.
func (s *Service) refuse(r *request, err error) {
	perr := r.asProtocolError(err)
	r.log.Info().Str(events.LogKeyCode, string(perr.Code)).Str(events.LogKeyField, perr.Field).Msg("exec request refused")
	s.opts.Observer.ExecRequest(r.op, perr.Code, s.opts.Now().Sub(r.at))
	s.replyError(r.msg.Reply, perr)
}

// asProtocolError returns err as the *execproto.Error to answer with: unavailable for anything
// that is not one (logged here, never sent: it may name internals).
func (r *request) asProtocolError(err error) *execproto.Error {
	var perr *execproto.Error
	if errors.As(err, &perr) {
		return perr
	}
	if errors.Is(err, context.Canceled) {
		return execproto.NewError(execproto.CodeUnavailable, "", "the exec-worker is stopping; try again")
	}
	r.log.Warn().Err(err).Msg("exec request failed")
	return execproto.NewError(execproto.CodeUnavailable, "", "the exec-worker could not serve the request; try again")
}

func (s *Service) replyError(reply string, e *execproto.Error) {
	if m, err := execproto.NewJSONMsg(reply, execproto.KindError, e); err == nil {
		_ = s.opts.NATS.PublishMsg(m)
	}
}

// decode reads a request strictly and validates it.
func decode(data []byte, v interface{ Validate() error }) error {
	if err := execproto.Decode(data, v); err != nil {
		return err
	}
	return v.Validate()
}

// errorClass names an error's kind without its text, for messages to clients.
func errorClass(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timed out"
	case errors.Is(err, sandboxd.ErrStalled):
		return "stalled"
	}
	return "connection failed"
}
