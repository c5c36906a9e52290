package events

import (
	"errors"
	"fmt"
	"time"
)

// Code is the machine-readable reason of a `failed` event.
type Code string

// The codes a `failed` event can carry.
const (
	CodeInvalidConfig       Code = "invalid_config"
	CodeInvalidRequest      Code = "invalid_request"
	CodeUnknownAdapter      Code = "unknown_adapter"
	CodeImageNotAllowed     Code = "image_not_allowed"
	CodeQuotaExceeded       Code = "quota_exceeded"
	CodeAgentBusy           Code = "agent_busy"
	CodeNamespaceNotAllowed Code = "namespace_not_allowed"
	CodeLeaseNotFound       Code = "lease_not_found"
	CodeBackendUnavailable  Code = "backend_unavailable"
	CodeInternal            Code = "internal"
)

// Codes lists every Code, in the order docs/contract.md documents them.
func Codes() []Code {
	return []Code{
		CodeInvalidConfig, CodeInvalidRequest, CodeUnknownAdapter, CodeImageNotAllowed,
		CodeQuotaExceeded, CodeAgentBusy, CodeNamespaceNotAllowed, CodeLeaseNotFound,
		CodeBackendUnavailable, CodeInternal,
	}
}

// BlamesRequest reports whether the code says the request itself is wrong (or cannot be served
// as asked): its message is kubeclip's own explanation naming the field, safe to show the
// tenant. The other codes are failures of the cluster or of kubeclip, whose details stay in
// the logs.
func (c Code) BlamesRequest() bool {
	switch c {
	case CodeBackendUnavailable, CodeInternal:
		return false
	}
	return c.Valid()
}

// description is the tenant-facing text of a code whose details are kubeclip's business.
func (c Code) description() string {
	switch c {
	case CodeBackendUnavailable:
		return "the Kubernetes API kept failing; kubeclip gave up after retrying (details are in kubeclip's logs)"
	case CodeQuotaExceeded:
		return "the tenant's ResourceQuota refuses the run"
	}
	return "kubeclip could not carry out the request (details are in kubeclip's logs)"
}

// Valid reports whether c is one of the documented codes.
func (c Code) Valid() bool {
	for _, k := range Codes() {
		if c == k {
			return true
		}
	}
	return false
}

// TerminalError is an error that must not be retried: redelivering the message would fail the
// same way. Consume terms the message and hands the error to ConsumeOptions.OnTerminal, which
// publishes the run's `failed` event with Code and Field. Find it with errors.As.
//
// What the tenant reads is Public: Message when set, else Err's text for a code that blames
// the request (its message names the field and the reason, and must never hold a secret), else
// a fixed text for the code. Err itself goes to kubeclip's logs only: it may name API server
// addresses, Secrets and other cluster internals.
type TerminalError struct {
	Code  Code
	Field string // the offending payload field (JSON name), e.g. "config.egressAllowCidrs[0]"; may be empty
	Err   error
	// Message, when set, is what the tenant reads instead of Err.
	Message string
}

// Public is the text the run's `failed` event carries, with the field in front when there is
// one.
func (e *TerminalError) Public() string {
	msg := e.Message
	switch {
	case msg != "":
	case e.Code.BlamesRequest() && e.Err != nil:
		msg = e.Err.Error()
	default:
		msg = e.Code.description()
	}
	if e.Field != "" {
		return e.Field + ": " + msg
	}
	return msg
}

func (e *TerminalError) Error() string {
	msg := "terminal error"
	if e.Err != nil {
		msg = e.Err.Error()
	}
	if e.Field != "" {
		return e.Field + ": " + msg
	}
	return msg
}

func (e *TerminalError) Unwrap() error { return e.Err }

// Terminal wraps err as a TerminalError. An unknown code becomes CodeInternal so a `failed`
// event never carries a code the contract does not list.
func Terminal(code Code, field string, err error) error {
	if !code.Valid() {
		code = CodeInternal
	}
	return &TerminalError{Code: code, Field: field, Err: err}
}

// Terminalf is Terminal with a formatted message.
func Terminalf(code Code, field, format string, args ...any) error {
	return Terminal(code, field, fmt.Errorf(format, args...))
}

// InvalidRequest reports a malformed or inconsistent payload.
func InvalidRequest(field, format string, args ...any) error {
	return Terminalf(CodeInvalidRequest, field, format, args...)
}

// AsTerminal finds a TerminalError in err's chain.
func AsTerminal(err error) (*TerminalError, bool) {
	var te *TerminalError
	if errors.As(err, &te) {
		return te, true
	}
	return nil, false
}

// RetryableError marks an error as worth retrying and refines how: Code is what the run's
// `failed` event carries if the retries run out (instead of CodeInternal), e.g.
// CodeBackendUnavailable when the Kubernetes API kept refusing connections; After, when set,
// replaces the backoff before the next delivery. Any error that is not a TerminalError is
// retried; this type only refines it.
type RetryableError struct {
	Code  Code
	After time.Duration
	Err   error
}

func (e *RetryableError) Error() string {
	if e.Err == nil {
		return "retryable error"
	}
	return e.Err.Error()
}

func (e *RetryableError) Unwrap() error { return e.Err }
