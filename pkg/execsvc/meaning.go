package execsvc

import (
	"errors"
	"fmt"

	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// call is a sandboxd call whose error the service reads: what an error means depends on the
// call (a not_found on a first output read is an exec the pod never had, on a reopen a
// sandboxd that restarted and lost its journals).
type call string

const (
	callStart      call = "start"
	callOpen       call = "open output"   // the session's first output read
	callReopen     call = "reopen output" // an output read after one succeeded
	callStdinState call = "stdin state"   // an empty stdin write, for the offset
	callStdin      call = "stdin"
	callSignal     call = "signal"
	callResize     call = "resize"
	callDelete     call = "delete"
)

// fate is what a sandboxd error means for the call.
type fate string

const (
	// fateDone: the answer is the call's result (an offset mismatch carries the offset; a
	// delete of an exec that is gone or still running is nothing to do).
	fateDone fate = "done"
	// fateStdinClosed: the exec's stdin is closed; the answer says so.
	fateStdinClosed fate = "stdin closed"
	// fateExited: a signal found the command's process group gone; a resize, the command.
	fateExited fate = "exited"
	// fateTransient: the pod or the route did not answer; the call is made again while its
	// bound lasts (a start, an output stream), or the client sends again (stdin).
	fateTransient fate = "transient"
	// fateRefused: the exec error in meaning.code answers the request or ends the stream.
	fateRefused fate = "refused"
)

// meaning is what a sandboxd error means: a fate and, for fateRefused, the exec error.
type meaning struct {
	fate  fate
	code  execproto.Code
	field string
	// message is the error's message, given the exec id and the pod's name.
	message func(execID, pod string) string
}

// refused returns a fateRefused meaning.
func refused(code execproto.Code, field string, message func(execID, pod string) string) meaning {
	return meaning{fate: fateRefused, code: code, field: field, message: message}
}

// err is m's exec error.
func (m meaning) err(execID, pod string) *execproto.Error {
	return &execproto.Error{Code: m.code, Field: m.field, Message: m.message(execID, pod)}
}

// sandboxdMeanings is the one table of what a sandboxd error means to the exec service: the
// first row whose call is the call and whose sentinel the error is (errors.Is) decides.
// Errors no row names mean what otherMeaning says.
var sandboxdMeanings = []struct {
	call     call
	sentinel error
	meaning  meaning
}{
	{callStart, sandboxd.ErrSpecMismatch, refused(execproto.CodeInvalidRequest, "execId", func(string, string) string { return "exists with a different spec" })},
	{callStart, sandboxd.ErrInvalidRequest, refused(execproto.CodeInvalidRequest, "", func(string, string) string { return "sandboxd refused the command" })},
	{callStart, sandboxd.ErrTooLarge, refused(execproto.CodeInvalidRequest, "", func(string, string) string { return "sandboxd refused the command: too large" })},
	{callStart, sandboxd.ErrDraining, refused(execproto.CodeWorkloadLost, "", func(_, pod string) string { return fmt.Sprintf("pod %s is shutting down", pod) })},

	{callOpen, sandboxd.ErrNotFound, refused(execproto.CodeExecNotFound, "execId", func(id, _ string) string {
		return fmt.Sprintf("the pod has no exec %s (never started, closed, or expired)", id)
	})},
	{callOpen, sandboxd.ErrInvalidRequest, refused(execproto.CodeInvalidRequest, "fromSeq", func(string, string) string { return "is beyond the exec's journal" })},
	{callReopen, sandboxd.ErrNotFound, refused(execproto.CodeWorkloadLost, "", func(_, pod string) string {
		return fmt.Sprintf("the exec's journal is gone: sandboxd in pod %s restarted", pod)
	})},

	{callStdinState, sandboxd.ErrOffsetMismatch, meaning{fate: fateDone}},
	{callStdinState, sandboxd.ErrStdinClosed, meaning{fate: fateStdinClosed}},
	{callStdinState, sandboxd.ErrNotFound, refused(execproto.CodeExecNotFound, "execId", func(id, _ string) string {
		return fmt.Sprintf("the pod has no exec %s (never started, closed, or expired)", id)
	})},
	{callStdin, sandboxd.ErrOffsetMismatch, meaning{fate: fateDone}},
	{callStdin, sandboxd.ErrStdinClosed, meaning{fate: fateStdinClosed}},

	{callSignal, sandboxd.ErrExited, meaning{fate: fateExited}},
	{callSignal, sandboxd.ErrNotFound, refused(execproto.CodeExecNotFound, "execId", func(id, _ string) string { return fmt.Sprintf("the pod has no exec %s", id) })},
	{callSignal, sandboxd.ErrInvalidRequest, refused(execproto.CodeInvalidRequest, "signal", func(string, string) string { return "is not a signal sandboxd knows" })},

	{callResize, sandboxd.ErrExited, meaning{fate: fateExited}},
	{callResize, sandboxd.ErrNotFound, refused(execproto.CodeExecNotFound, "execId", func(id, _ string) string { return fmt.Sprintf("the pod has no exec %s", id) })},
	{callResize, sandboxd.ErrInvalidRequest, refused(execproto.CodeInvalidRequest, "tty", func(string, string) string { return "the exec was started without a terminal" })},

	{callDelete, sandboxd.ErrRunning, meaning{fate: fateDone}},
	{callDelete, sandboxd.ErrNotFound, meaning{fate: fateDone}},
}

// meaningOf is what err, from call, means. err must not be nil.
func meaningOf(c call, err error) meaning {
	for _, row := range sandboxdMeanings {
		if row.call == c && errors.Is(err, row.sentinel) {
			return row.meaning
		}
	}
	return otherMeaning(c, err)
}

// otherMeaning is the meaning of an error no row names: for a start, another refusal from
// sandboxd is final and anything else (the route, the key, the pod not listening yet)
// transient; a stdin-state query or a signal that gets no answer is unavailable; every other
// call is made again or left to the client.
func otherMeaning(c call, err error) meaning {
	var ae *sandboxd.APIError
	switch c {
	case callStart:
		if errors.As(err, &ae) {
			code := ae.Code
			return refused(execproto.CodeUnavailable, "", func(string, string) string { return fmt.Sprintf("sandboxd refused the command (%s)", code) })
		}
	case callStdinState:
		class := errorClass(err)
		return refused(execproto.CodeUnavailable, "", func(string, string) string { return "sandboxd did not answer: " + class })
	case callSignal, callResize:
		return refused(execproto.CodeUnavailable, "", func(_, pod string) string { return fmt.Sprintf("sandboxd in pod %s did not answer", pod) })
	}
	return meaning{fate: fateTransient}
}
