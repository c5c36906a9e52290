package sandboxd

import (
	"errors"
	"fmt"
	"net/http"
)

// Error codes of the API's error answers ({code, message, offset}). This table is the one place
// that says what a code means: its HTTP status and the sentinel a client matches with errors.Is.
const (
	CodeInvalidRequest = "invalid_request" // 400: bad JSON, unknown field, bad id, bad query
	CodeUnauthorized   = "unauthorized"    // 401: missing or wrong bearer token
	CodeNotFound       = "not_found"       // 404: no exec with this id (never started, deleted or expired)
	CodeSpecMismatch   = "spec_mismatch"   // 409: the id exists with a different spec
	CodeOffsetMismatch = "offset_mismatch" // 409: stdin offset is not the current one (offset says which is)
	CodeStdinClosed    = "stdin_closed"    // 409: stdin is closed: eof was sent, the command exited, or it has no stdin
	CodeRunning        = "running"         // 409: DELETE of a command still running
	CodeExited         = "exited"          // 409: signal to a command (and process group) that is gone
	CodeNotBound       = "not_bound"       // 409: an unbound (warm) daemon answers only its bind, on TLS
	CodeAlreadyBound   = "already_bound"   // 409: a bind to a daemon that is bound already
	CodeTooLarge       = "too_large"       // 413: body over the limit
	CodeDraining       = "draining"        // 503: sandboxd is shutting down and starts nothing new
	CodeInternal       = "internal"        // 500
)

// Sentinels for errors.Is on a client's errors.
var (
	ErrInvalidRequest = errors.New("sandboxd: invalid request")
	ErrUnauthorized   = errors.New("sandboxd: unauthorized")
	ErrNotFound       = errors.New("sandboxd: exec not found")
	ErrSpecMismatch   = errors.New("sandboxd: exec id exists with a different spec")
	ErrOffsetMismatch = errors.New("sandboxd: stdin offset mismatch")
	ErrStdinClosed    = errors.New("sandboxd: stdin closed")
	ErrRunning        = errors.New("sandboxd: exec still running")
	ErrExited         = errors.New("sandboxd: exec exited")
	ErrNotBound       = errors.New("sandboxd: not bound to a lease yet")
	ErrAlreadyBound   = errors.New("sandboxd: bound already")
	ErrTooLarge       = errors.New("sandboxd: request too large")
	ErrDraining       = errors.New("sandboxd: draining")
	ErrInternal       = errors.New("sandboxd: internal error")
	// ErrStalled is an output stream on which no frame (not even a heartbeat) arrived within
	// the client's stall timeout: the daemon or the route to it is gone.
	ErrStalled = errors.New("sandboxd: output stream stalled")
)

type codeInfo struct {
	status   int
	sentinel error
}

func codeTable() map[string]codeInfo {
	return map[string]codeInfo{
		CodeInvalidRequest: {http.StatusBadRequest, ErrInvalidRequest},
		CodeUnauthorized:   {http.StatusUnauthorized, ErrUnauthorized},
		CodeNotFound:       {http.StatusNotFound, ErrNotFound},
		CodeSpecMismatch:   {http.StatusConflict, ErrSpecMismatch},
		CodeOffsetMismatch: {http.StatusConflict, ErrOffsetMismatch},
		CodeStdinClosed:    {http.StatusConflict, ErrStdinClosed},
		CodeRunning:        {http.StatusConflict, ErrRunning},
		CodeExited:         {http.StatusConflict, ErrExited},
		CodeNotBound:       {http.StatusConflict, ErrNotBound},
		CodeAlreadyBound:   {http.StatusConflict, ErrAlreadyBound},
		CodeTooLarge:       {http.StatusRequestEntityTooLarge, ErrTooLarge},
		CodeDraining:       {http.StatusServiceUnavailable, ErrDraining},
		CodeInternal:       {http.StatusInternalServerError, ErrInternal},
	}
}

// statusOf is the HTTP status of code (500 for an unknown code: a bug).
func statusOf(code string) int {
	if c, ok := codeTable()[code]; ok {
		return c.status
	}
	return http.StatusInternalServerError
}

// APIError is an error answer from sandboxd.
type APIError struct {
	Status  int
	Code    string // one of the Code constants; empty when the answer was not sandboxd's JSON
	Message string
	// Offset is the current stdin offset, for CodeOffsetMismatch, CodeStdinClosed and
	// CodeTooLarge answers to a stdin write.
	Offset int64
}

func (e *APIError) Error() string {
	if e.Code == "" {
		return fmt.Sprintf("sandboxd: HTTP %d: %s", e.Status, e.Message)
	}
	return fmt.Sprintf("sandboxd: %s (HTTP %d): %s", e.Code, e.Status, e.Message)
}

// Is matches the sentinel of e's code, so callers write errors.Is(err, ErrNotFound).
func (e *APIError) Is(target error) bool {
	if c, ok := codeTable()[e.Code]; ok {
		return c.sentinel == target
	}
	switch e.Status { // not sandboxd's JSON (a proxy in the way, a mux error)
	case http.StatusNotFound:
		return target == ErrNotFound
	case http.StatusUnauthorized:
		return target == ErrUnauthorized
	}
	return false
}
