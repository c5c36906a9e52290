package sandboxd

import (
	"path/filepath"
	"strconv"
	"time"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// The server's set of execs: admission, start, end, and forgetting their journals.

func (s *Server) stopTimers() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.execs {
		if e.ttl != nil {
			e.ttl.Stop()
		}
	}
}

// admit returns the exec with spec's id, creating it when new. A new exec is refused while
// draining; an existing one is returned even then (a repeated start is an attach).
func (s *Server) admit(spec Spec) (*execution, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.execs[spec.ID]; ok {
		if !e.spec.equal(spec) {
			return nil, false, ErrSpecMismatch
		}
		return e, false, nil
	}
	if s.draining {
		return nil, false, ErrDraining
	}
	limit := s.opts.MaxOutputBytes
	if spec.MaxOutputBytes > 0 {
		limit = min(spec.MaxOutputBytes, s.opts.OutputBytesLimit)
	}
	// The counter keeps a deleted exec's file apart from a later one with the same id.
	s.journals++
	name := spec.ID + "." + strconv.FormatUint(s.journals, 10) + journalExt
	j := newJournal(filepath.Join(s.opts.JournalDir, name), limit, s.budget, s.disk)
	e := newExecution(spec, j, s.log)
	s.execs[spec.ID] = e
	s.running++
	return e, true, nil
}

// launch starts e's command and its supervisor; e.started is closed when it returns.
func (s *Server) launch(e *execution) {
	defer close(e.started)
	e.startedAt = s.opts.Now()
	p, err := spawn(s.opts.Reaper, e.spec, s.id.Load().env, s.devNull)
	if err != nil {
		s.finished(e, e.failStart(err))
		return
	}
	e.pid, e.stdin, e.tty = p.pid, p.stdin, p.tty
	e.log.Debug().Int(LogKeyPID, p.pid).Bool("stdin", e.spec.Stdin).Bool("tty", p.tty != nil).Int64("timeout_ms", e.spec.TimeoutMs).Msg("exec started")
	go func() { s.finished(e, e.supervise(p, s.opts.ExitGrace, &s.buffers)) }()
}

// finished records that e's command is over and schedules its journal's removal.
func (s *Server) finished(e *execution, exit execspec.Exit) {
	ev := e.log.Info().Int(LogKeyPID, e.pid).Bool(LogKeyTimedOut, exit.TimedOut).Bool(LogKeyTruncated, exit.Truncated).
		Int64(LogKeyStdoutBytes, exit.StdoutBytes).Int64(LogKeyStderrBytes, exit.StderrBytes).
		Dur(LogKeyDuration, s.opts.Now().Sub(e.startedAt))
	if exit.ExitCode != nil {
		ev = ev.Int(LogKeyExitCode, *exit.ExitCode)
	}
	if exit.Signal != nil {
		ev = ev.Str(LogKeySignal, *exit.Signal)
	}
	if exit.Error != "" {
		ev = ev.Str(LogKeyExecError, exit.Error) // names a command or path, never data
	}
	ev.Msg("exec finished")

	s.mu.Lock()
	defer s.mu.Unlock()
	close(e.done)
	s.running--
	if s.draining && s.running == 0 {
		close(s.drained)
	}
	if !e.forgotten { // a DELETE may follow the exit frame before this
		e.ttl = time.AfterFunc(s.opts.JournalTTL, func() { s.forget(e) })
	}
}

// forget drops e and its journal.
func (s *Server) forget(e *execution) {
	s.mu.Lock()
	e.forgotten = true
	if s.execs[e.spec.ID] == e {
		delete(s.execs, e.spec.ID)
	}
	if e.ttl != nil {
		e.ttl.Stop()
	}
	s.mu.Unlock()
	if err := e.journal.remove(); err != nil {
		e.log.Warn().Err(err).Msg("removing a journal failed")
	}
}

func (s *Server) lookup(id string) (*execution, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.execs[id]
	return e, ok
}

// pgidInUse reports whether a running exec other than e has pgid as its process group: after
// e's leader is reaped its pid may be reused by a new command, whose group must not get e's
// signals.
func (s *Server) pgidInUse(e *execution, pgid int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.execs {
		if pid, ok := o.startedPID(); o != e && ok && pid == pgid && o.running() {
			return true
		}
	}
	return false
}

func (s *Server) info() Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Info{Ready: !s.draining, Draining: s.draining, Running: s.running, Execs: len(s.execs)}
}
