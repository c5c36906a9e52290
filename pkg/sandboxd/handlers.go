package sandboxd

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"golang.org/x/sys/unix"
)

// FramesContentType is the media type of an output stream.
const FramesContentType = "application/vnd.kubeclip.sandboxd-frames"

func (s *Server) routes() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/execs", s.handleStart)
	mux.HandleFunc("POST /v1/execs/{id}/stdin", s.handleStdin)
	mux.HandleFunc("GET /v1/execs/{id}/output", s.handleOutput)
	mux.HandleFunc("POST /v1/execs/{id}/signal", s.handleSignal)
	mux.HandleFunc("POST /v1/execs/{id}/resize", s.handleResize)
	mux.HandleFunc("DELETE /v1/execs/{id}", s.handleDelete)
	mux.HandleFunc("GET /v1/info", s.handleInfo)
	return mux
}

// logRequests logs every request at debug level: its route, exec id, status and duration. A
// bridge poll is a few requests every 100 ms, too many for info.
func (s *Server) logRequests(next *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := s.opts.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		s.log.Debug().Str(LogKeyMethod, r.Method).Str(LogKeyRoute, r.Pattern).Str(LogKeyExecID, r.PathValue("id")).
			Int(LogKeyStatus, rec.status).Dur(LogKeyDuration, s.opts.Now().Sub(start)).Msg("request")
	})
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach Flush.
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code, msg string, offset *int64) {
	writeJSON(w, statusOf(code), errorBody{Code: code, Message: msg, Offset: offset})
}

// execOf finds the exec named in the path and waits until its command was started.
func (s *Server) execOf(w http.ResponseWriter, r *http.Request) (*execution, bool) {
	e, ok := s.lookup(r.PathValue("id"))
	if !ok {
		writeError(w, CodeNotFound, fmt.Sprintf("no exec %q", r.PathValue("id")), nil)
		return nil, false
	}
	select {
	case <-e.started:
		return e, true
	case <-r.Context().Done():
		return nil, false
	}
}

func (s *Server) handleStart(w http.ResponseWriter, r *http.Request) {
	var spec Spec
	if err := decodeStrict(r.Body, maxSpecBytes, &spec); err != nil {
		writeBodyError(w, err)
		return
	}
	if err := spec.Validate(); err != nil {
		writeError(w, CodeInvalidRequest, err.Error(), nil)
		return
	}
	e, created, err := s.admit(spec)
	switch {
	case errors.Is(err, ErrSpecMismatch):
		writeError(w, CodeSpecMismatch, fmt.Sprintf("exec %q exists with a different spec", spec.ID), nil)
		return
	case errors.Is(err, ErrDraining):
		writeError(w, CodeDraining, "sandboxd is shutting down", nil)
		return
	}
	status := http.StatusOK
	if created {
		s.launch(e)
		status = http.StatusCreated
	} else {
		select {
		case <-e.started:
		case <-r.Context().Done():
			return
		}
	}
	writeJSON(w, status, StartResult{ID: spec.ID, PID: e.pid, StartedAt: e.startedAt})
}

func writeBodyError(w http.ResponseWriter, err error) {
	var mbe *http.MaxBytesError
	if errors.Is(err, errBodyTooLarge) || errors.As(err, &mbe) {
		writeError(w, CodeTooLarge, err.Error(), nil)
		return
	}
	writeError(w, CodeInvalidRequest, err.Error(), nil)
}

func (s *Server) handleStdin(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	offset, err := strconv.ParseInt(q.Get("offset"), 10, 64)
	if err != nil || offset < 0 {
		writeError(w, CodeInvalidRequest, "offset: must be a byte offset >= 0", nil)
		return
	}
	eof := false
	if v := q.Get("eof"); v != "" {
		if eof, err = strconv.ParseBool(v); err != nil {
			writeError(w, CodeInvalidRequest, "eof: must be 1 or 0", nil)
			return
		}
	}
	e, ok := s.execOf(w, r)
	if !ok {
		return
	}
	body := http.MaxBytesReader(w, r.Body, maxStdinBytes)
	off, err := e.writeStdin(r.Context(), offset, body, eof)
	var mbe *http.MaxBytesError
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, offsetResponse{Offset: off})
	case errors.Is(err, errOffsetMismatch):
		writeError(w, CodeOffsetMismatch, err.Error(), &off)
	case errors.Is(err, errStdinClosed):
		writeError(w, CodeStdinClosed, err.Error(), &off)
	case errors.As(err, &mbe):
		writeError(w, CodeTooLarge, err.Error(), &off)
	default: // the client went away or sent a broken body; it learns the offset on retry
		writeError(w, CodeInvalidRequest, err.Error(), &off)
	}
}

func (s *Server) handleOutput(w http.ResponseWriter, r *http.Request) {
	from := uint64(1)
	if v := r.URL.Query().Get("from"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 {
			writeError(w, CodeInvalidRequest, "from: must be a seq >= 1", nil)
			return
		}
		from = n
	}
	e, ok := s.execOf(w, r)
	if !ok {
		return
	}
	f, err := e.journal.follow(from)
	switch {
	case errors.Is(err, errFromBeyond):
		writeError(w, CodeInvalidRequest, err.Error(), nil)
		return
	case err != nil: // removed meanwhile
		writeError(w, CodeNotFound, err.Error(), nil)
		return
	}
	w.Header().Set("Content-Type", FramesContentType)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	if err := f.stream(r.Context(), w, rc.Flush, s.opts.Heartbeat); err != nil {
		e.log.Debug().Err(err).Msg("output stream ended early")
		return
	}
	e.markExitSent()
}

func (s *Server) handleSignal(w http.ResponseWriter, r *http.Request) {
	var req signalRequest
	if err := decodeStrict(r.Body, maxSignalBytes, &req); err != nil {
		writeBodyError(w, err)
		return
	}
	sig := unix.SignalNum(req.Signal)
	if sig == 0 {
		writeError(w, CodeInvalidRequest, fmt.Sprintf("signal: unknown signal %q (use names such as SIGTERM)", req.Signal), nil)
		return
	}
	e, ok := s.execOf(w, r)
	if !ok {
		return
	}
	// The group outlives its leader while background processes remain, so an exited exec can
	// still be signalled (to stop a server it started), unless its pid went to a newer exec.
	if e.pid == 0 || (e.exited.Load() && s.pgidInUse(e, e.pid)) {
		writeError(w, CodeExited, "the command and its process group are gone", nil)
		return
	}
	if err := unix.Kill(-e.pid, sig); err != nil {
		if errors.Is(err, unix.ESRCH) {
			writeError(w, CodeExited, "the command and its process group are gone", nil)
			return
		}
		writeError(w, CodeInternal, fmt.Sprintf("signalling the process group: %v", err), nil)
		return
	}
	writeJSON(w, http.StatusOK, struct{}{})
}

func (s *Server) handleResize(w http.ResponseWriter, r *http.Request) {
	var req resizeRequest
	if err := decodeStrict(r.Body, maxSignalBytes, &req); err != nil {
		writeBodyError(w, err)
		return
	}
	if err := req.Validate(); err != nil {
		writeError(w, CodeInvalidRequest, err.Error(), nil)
		return
	}
	e, ok := s.execOf(w, r)
	if !ok {
		return
	}
	err := e.resize(req)
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, struct{}{})
	case errors.Is(err, errNoTTY):
		writeError(w, CodeInvalidRequest, "tty: the exec was started without a terminal", nil)
	case errors.Is(err, errPTYClosed):
		writeError(w, CodeExited, "the command exited; its terminal is closed", nil)
	default:
		writeError(w, CodeInternal, err.Error(), nil)
	}
}

func (s *Server) handleDelete(w http.ResponseWriter, r *http.Request) {
	e, ok := s.execOf(w, r)
	if !ok {
		return
	}
	// The exit frame, not the server's bookkeeping just after it, decides: a client that read
	// the exit may delete at once.
	if !e.journal.exited() {
		writeError(w, CodeRunning, "the command is still running; signal it first", nil)
		return
	}
	s.forget(e)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleInfo(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.info())
}
