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

// signalsPerCompany bounds one company's signal requests in progress on a replica: each is one
// short call to sandboxd, and a client sends one per exec it stops.
const signalsPerCompany = 8

// receive takes a request off the subscription: on the subscription's goroutine, it drops or
// refuses what it can without work (a reply that is not an inbox, a bad subject, a company at
// its share), takes a slot, and only then starts the request's goroutine.
func (s *Service) receive(ctx context.Context, m *nats.Msg) {
	if !s.opts.Replies.Allows(m.Reply) {
		s.dropNotInbox(m)
		return
	}
	companyID, runID, op, err := s.subjects.ParseRequest(m.Subject)
	if err != nil {
		s.replyError(m.Reply, execproto.InvalidRequest("", "subject is not <prefix>.exec.<companyId>.<runId>.start|attach|signal"))
		return
	}
	pool := s.sessionSlots
	if op == execproto.OpSignal {
		pool = s.signalSlots
	}
	release, perr := pool.take(companyID)
	if perr != nil {
		s.log.Debug().Str(events.LogKeyTenant, companyID).Str(logKeyOp, string(op)).Msg("exec request refused: no slot")
		s.opts.Observer.ExecRequest(op, perr.Code, 0)
		if op == execproto.OpSignal {
			s.answerSignal(m.Reply, execproto.Signaled{Code: string(perr.Code), Message: perr.Message})
			return
		}
		s.replyError(m.Reply, perr)
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer release()
		s.handle(ctx, m, companyID, runID, op)
	}()
}

// handle answers one request. Start and attach then serve the exec's stream, for as long as
// the command runs.
func (s *Service) handle(ctx context.Context, m *nats.Msg, companyID, runID string, op execproto.Op) {
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
	// The environment is screened in two steps, in this order, before anything reaches
	// sandboxd: a brokered key's real value is refused (it crossed NATS already; refusing tells
	// the client, where dropping would hide it), then filterEnv drops what the policy keeps
	// from pods.
	if err := s.opts.BrokeredKeys.Check(req.Env); err != nil {
		s.refuse(r, err)
		return
	}
	s.filterEnv(r, &req)
	rec, err := s.admit(ctx, r, req.ProviderLeaseID)
	if err != nil {
		s.refuse(r, err)
		return
	}
	noting := s.noteRecordedAsync(ctx, r, req)
	stop := s.heartbeatWhileWaiting(r)
	wait := s.opts.ReadyTimeout
	if t := time.Duration(req.TimeoutMs) * time.Millisecond; t > 0 && t < wait {
		wait = t
	}
	pod, client, res, err := s.startExec(ctx, r, rec, sandboxdSpec(req), wait)
	record, noted := noting()
	if err != nil {
		stop()
		s.forgetRecorded(ctx, r, req.ExecID, record)
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
	} else {
		// A repeated start: sandboxd runs the exec already (the replica that started it died
		// before it answered, or the client sent the start again). Logged, so that every exec
		// has a line naming it wherever its start was answered.
		r.log.Info().Bool("record", req.Record).Msg("exec start found it running")
	}
	s.serveRequest(ctx, r, session, rec, pod, client, req.ExecID, execproto.CommandName(req.Command), record, noted, 1, started)
}

// dropTimeout bounds the drop of a RecordedBucket entry, which runs whether or not the request
// that owns it is still wanted.
const dropTimeout = 10 * time.Second

// forgetRecorded drops the entry noteRecorded wrote for a start that is refused: the client
// that starts the exec again writes it again.
func (s *Service) forgetRecorded(ctx context.Context, r *request, execID string, record recordMode) {
	if record != recorded {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dropTimeout)
	defer cancel()
	if err := s.recorded.drop(dctx, r.ref, execID); err != nil {
		s.recorded.failures.Failed(err)
	}
}

// noteRecorded writes the recorded exec's RecordedBucket entry as its command starts.
//
// A write that fails (the bucket full, NATS not answering) does not refuse the start. The entry
// is not needed for the command to run, nor for its recording while this session serves it:
// the session records from its own state (recordedUnnoted) and writes the entry with its first
// event. It is needed only by a session that takes the stream over (a replica's death, a client
// that attaches again) to know the exec is recorded and from where: until the entry is written,
// such a takeover serves the output without recording the rest (the run's history misses the
// exec's tail and final event). Refusing the start instead refused every company's agent
// commands once one company filled the bucket (issue 26); a company's recordings are bounded by
// its budgets, and the entries by the recordings in progress (each is dropped at its exec's end).
//
// The entry is written while the command starts, not before: neither waits for the other, and
// a recorded exec's client gets its `started` one NATS round trip sooner (on a machine another
// company's flood leaves no idle CPU, each round trip costs milliseconds: issue 26). What the
// order cost is unchanged: a replica that dies between the two leaves a running exec without an
// entry, as a write that fails does, and the client's start sent again writes it (a repeated
// start finds the command running and records it from seq 1).
func (s *Service) noteRecorded(ctx context.Context, r *request, execID, command string) (recordMode, *notedExec) {
	noted, err := s.recorded.put(ctx, r.ref, execID, command, r.msg.Reply)
	if err != nil {
		if ctx.Err() == nil {
			s.recorded.failures.Failed(err)
		}
		return recordedUnnoted, nil
	}
	s.recorded.failures.Wrote()
	return recorded, &noted
}

// noteRecordedAsync starts noteRecorded for a recorded start (nothing for another) and returns
// the wait for its outcome.
func (s *Service) noteRecordedAsync(ctx context.Context, r *request, req execproto.StartRequest) func() (recordMode, *notedExec) {
	if !req.Record {
		return func() (recordMode, *notedExec) { return notRecorded, nil }
	}
	var (
		record recordMode
		noted  *notedExec
		done   = make(chan struct{})
	)
	go func() {
		defer close(done)
		record, noted = s.noteRecorded(ctx, r, req.ExecID, execproto.CommandName(req.Command))
	}()
	return func() (recordMode, *notedExec) {
		<-done
		return record, noted
	}
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
	entry, rev, isRecorded, err := s.recorded.get(ctx, r.ref, req.ExecID)
	if err != nil {
		s.refuse(r, err)
		return
	}
	record := notRecorded
	var noted *notedExec
	if isRecorded && entry.Inbox == r.msg.Reply {
		record, noted = recorded, &notedExec{entry: entry, rev: rev}
	}
	s.serveRequest(ctx, r, session, rec, pod, client, req.ExecID, entry.Command, record, noted, req.FromSeq, started)
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

// serve runs the exec's session on this request's goroutine.
func (s *Service) serveRequest(ctx context.Context, r *request, id string, rec lease.Record, pod Pod, client *sandboxd.Client, execID, command string, record recordMode, noted *notedExec, from uint64, started execproto.Started) {
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
		record: record, noted: noted, reply: r.msg.Reply, ioSubj: ioSubj, ctlSubj: ctlSubj, from: from, started: started,
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

// filterEnv drops the start's environment keys the policy keeps from pods, before anything
// reaches sandboxd. Only the keys' names are logged, and their count measured.
func (s *Service) filterEnv(r *request, req *execproto.StartRequest) {
	var dropped []string
	req.Env, dropped = s.opts.EnvPolicy.Filter(req.Env)
	if len(dropped) > 0 {
		r.log.Info().Strs(logKeyEnvDropped, dropped).Msg("environment keys dropped by the env policy")
		s.opts.Observer.ExecEnvDropped(len(dropped))
	}
}

// dropNotInbox drops a request whose reply subject is not a client's inbox: answering it would
// publish there with the exec-worker's permissions. The payload is never logged.
func (s *Service) dropNotInbox(m *nats.Msg) {
	s.log.Debug().Str(events.LogKeySubject, m.Subject).Msg("exec request whose reply is not a client inbox dropped")
	s.opts.Observer.ExecDropped(DropReplyNotInbox)
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

// sandboxdSpec is the start's command as sandboxd runs it.
func sandboxdSpec(r execproto.StartRequest) sandboxd.Spec {
	return sandboxd.Spec{
		ID: r.ExecID, Command: r.Command, Args: r.Args, Cwd: r.Cwd, Env: r.Env,
		TimeoutMs: r.TimeoutMs, Stdin: r.StdinBytes != 0, MaxOutputBytes: r.MaxOutputBytes, TTY: r.TTY,
	}
}
