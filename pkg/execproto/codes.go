package execproto

import "fmt"

// Code is the code of an `error` message: why an exec request was refused or an exec stream
// ended without an exit. This table is the one place that says what each code means.
type Code string

// Error codes.
const (
	// CodeInvalidRequest: the request does not decode, has an unknown field, a bad value, or an
	// execId that exists with a different spec.
	CodeInvalidRequest Code = "invalid_request"
	// CodeLeaseNotFound: the subject's company has no lease for the run.
	CodeLeaseNotFound Code = "lease_not_found"
	// CodeLeaseMismatch: providerLeaseId is not the run's lease.
	CodeLeaseMismatch Code = "lease_mismatch"
	// CodeLeaseEnded: the lease was released or destroyed (or is being), its run finished, or
	// its acquire failed; or, reusable, the host released it and has not resumed it since.
	CodeLeaseEnded Code = "lease_ended"
	// CodeNotExecCapable: the lease's backend runs no commands on request (a job lease).
	CodeNotExecCapable Code = "not_exec_capable"
	// CodeNotReady: the lease's pod did not become ready within the exec's timeout, or a
	// reusable lease is resuming (its new pod is not ready yet).
	CodeNotReady Code = "not_ready"
	// CodeWorkloadLost: the pod disappeared (or is shutting down) mid-command.
	CodeWorkloadLost Code = "workload_lost"
	// CodeExecNotFound: attach to an exec the pod does not know (never started, closed, or its
	// journal expired ten minutes after exit).
	CodeExecNotFound Code = "exec_not_found"
	// CodeUnavailable: the exec-worker could not serve the request (at capacity, sandboxd
	// unreachable while its pod lives). Retrying later, with the same execId, is safe.
	CodeUnavailable Code = "unavailable"
)

// Codes lists every code.
func Codes() []Code {
	return []Code{CodeInvalidRequest, CodeLeaseNotFound, CodeLeaseMismatch, CodeLeaseEnded, CodeNotExecCapable,
		CodeNotReady, CodeWorkloadLost, CodeExecNotFound, CodeUnavailable}
}

// Valid reports whether c is a documented code.
func (c Code) Valid() bool {
	for _, k := range Codes() {
		if c == k {
			return true
		}
	}
	return false
}

// Error is an `error` message: {code, message, field}. Message never holds a secret: it names
// fields, ids, the command's base name and sizes only.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
	// Field is the request field at fault, when one is.
	Field string `json:"field,omitempty"`
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s: %s: %s", e.Code, e.Field, e.Message)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Is matches an error of the same code, so callers write errors.Is(err, execproto.ErrLeaseEnded).
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Message == "" && t.Field == "" && t.Code == e.Code
}

// Sentinels for errors.Is, one per code.
var (
	ErrInvalidRequest = &Error{Code: CodeInvalidRequest}
	ErrLeaseNotFound  = &Error{Code: CodeLeaseNotFound}
	ErrLeaseMismatch  = &Error{Code: CodeLeaseMismatch}
	ErrLeaseEnded     = &Error{Code: CodeLeaseEnded}
	ErrNotExecCapable = &Error{Code: CodeNotExecCapable}
	ErrNotReady       = &Error{Code: CodeNotReady}
	ErrWorkloadLost   = &Error{Code: CodeWorkloadLost}
	ErrExecNotFound   = &Error{Code: CodeExecNotFound}
	ErrUnavailable    = &Error{Code: CodeUnavailable}
)

// NewError returns an error of code with a formatted message.
func NewError(code Code, field, format string, args ...any) *Error {
	return &Error{Code: code, Field: field, Message: fmt.Sprintf(format, args...)}
}

// InvalidRequest returns an invalid_request error about field.
func InvalidRequest(field, format string, args ...any) *Error {
	return NewError(CodeInvalidRequest, field, format, args...)
}
