package execproto

import (
	"fmt"
	"path/filepath"
	"strings"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// Limits both sides keep.
const (
	// MaxRequestBytes bounds a request's JSON: NATS's default maximum payload. A start's args
	// and env go to execve, which takes about 2 MiB in all, so a real command fits with room.
	MaxRequestBytes = 1 << 20
	// MaxStdinChunk is the most stdin one message carries.
	MaxStdinChunk = 512 << 10
	// MaxUnacked is the most output bytes a replica sends beyond the client's last ack.
	MaxUnacked = 8 << 20
	// AckEvery is how often, in output bytes, a client acknowledges at least; well below
	// MaxUnacked so a replica never waits on a client that keeps up.
	AckEvery = 2 << 20
	// maxProviderLeaseIDLen bounds providerLeaseId, as pkg/events bounds free-form ids.
	maxProviderLeaseIDLen = 256
)

// StartRequest runs a command in the lease's pod: <prefix>.exec.<c>.<r>.start. A repeated start
// with the same execId and spec is an attach from seq 1, never a second run.
type StartRequest struct {
	// ExecID is the client's id for the exec, a ULID: 1-64 of [A-Za-z0-9_-].
	ExecID string `json:"execId"`
	// ProviderLeaseID must be the run's lease (the `created` event's providerLeaseId).
	ProviderLeaseID string   `json:"providerLeaseId"`
	Command         string   `json:"command"`
	Args            []string `json:"args,omitempty"`
	// Cwd is absolute; empty: the pod's working directory.
	Cwd string `json:"cwd,omitempty"`
	// Env is laid over the pod's environment; its PATH finds Command.
	Env map[string]string `json:"env,omitempty"`
	// TimeoutMs kills the command's whole process tree after this long; 0: no timeout.
	TimeoutMs int64 `json:"timeoutMs,omitempty"`
	// StdinBytes is how many bytes of stdin the client will send: 0 for none (the command's
	// stdin is /dev/null), -1 when the client does not know yet (a pipe); the last stdin
	// message carries Kubeclip-Exec-Eof either way.
	StdinBytes int64 `json:"stdinBytes,omitempty"`
	// Record publishes the output as `exec` run events.
	Record bool `json:"record,omitempty"`
	// MaxOutputBytes caps the exec's journal, up to sandboxd's --output-bytes-limit (1280 MiB);
	// 0: sandboxd's --max-output-bytes (256 MiB).
	MaxOutputBytes int64 `json:"maxOutputBytes,omitempty"`
	// TTY runs the command on a pseudo-terminal of this size: its stdin, stdout and stderr,
	// the output one stream (stdout). Its stdin is streamed: StdinBytes must be -1.
	TTY *execspec.TTY `json:"tty,omitempty"`
}

// Validate checks what can be checked without the pod; the error is an *Error naming the field.
func (r StartRequest) Validate() error {
	if err := validateCommon(r.ExecID, r.ProviderLeaseID); err != nil {
		return err
	}
	switch {
	case r.Command == "":
		return InvalidRequest("command", "must not be empty")
	case strings.ContainsRune(r.Command, 0):
		return InvalidRequest("command", "must not contain NUL")
	case r.Cwd != "" && !filepath.IsAbs(r.Cwd):
		return InvalidRequest("cwd", "must be an absolute path")
	case strings.ContainsRune(r.Cwd, 0):
		return InvalidRequest("cwd", "must not contain NUL")
	case r.TimeoutMs < 0:
		return InvalidRequest("timeoutMs", "must be >= 0")
	case r.StdinBytes < -1:
		return InvalidRequest("stdinBytes", "must be >= 0, or -1 when unknown")
	case r.MaxOutputBytes < 0:
		return InvalidRequest("maxOutputBytes", "must be >= 0")
	case r.TTY != nil && r.StdinBytes != -1:
		return InvalidRequest("stdinBytes", "must be -1 with tty (a terminal's input is streamed)")
	}
	if r.TTY != nil {
		if err := r.TTY.Validate(); err != nil {
			field, msg, _ := strings.Cut(err.Error(), ": ")
			return InvalidRequest("tty."+field, "%s", msg)
		}
	}
	for i, a := range r.Args {
		if strings.ContainsRune(a, 0) {
			return InvalidRequest(fmt.Sprintf("args[%d]", i), "must not contain NUL")
		}
	}
	for k, v := range r.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return InvalidRequest("env", "has an invalid variable name")
		}
		if strings.ContainsRune(v, 0) {
			return InvalidRequest("env", "a value contains NUL")
		}
	}
	return nil
}

// CommandName is the command's base name: all of a request that logs, errors, metrics and
// recorded events may name.
func CommandName(command string) string {
	name := filepath.Base(command)
	if len(name) > 64 {
		name = name[:64]
	}
	return strings.ToValidUTF8(name, "?")
}

// AttachRequest continues an exec's output from journal seq FromSeq: after a replica died, on a
// gap, or from another client (the CLI's attach): <prefix>.exec.<c>.<r>.attach.
type AttachRequest struct {
	ExecID          string `json:"execId"`
	ProviderLeaseID string `json:"providerLeaseId"`
	// FromSeq is the first seq the client needs: 1 for the whole output.
	FromSeq uint64 `json:"fromSeq"`
}

// Validate checks the request.
func (r AttachRequest) Validate() error {
	if err := validateCommon(r.ExecID, r.ProviderLeaseID); err != nil {
		return err
	}
	if r.FromSeq == 0 {
		return InvalidRequest("fromSeq", "must be at least 1")
	}
	return nil
}

// SignalRequest signals an exec's process group: <prefix>.exec.<c>.<r>.signal. It is answered
// with one `signaled` message.
type SignalRequest struct {
	ExecID          string `json:"execId"`
	ProviderLeaseID string `json:"providerLeaseId"`
	// Signal is a name such as "SIGTERM".
	Signal string `json:"signal"`
}

// Validate checks the request.
func (r SignalRequest) Validate() error {
	if err := validateCommon(r.ExecID, r.ProviderLeaseID); err != nil {
		return err
	}
	if !strings.HasPrefix(r.Signal, "SIG") || len(r.Signal) > 16 {
		return InvalidRequest("signal", "must be a signal name such as SIGTERM")
	}
	return nil
}

// Started tells the client that its exec runs (or ran) and where to send stdin, acks and close.
type Started struct {
	ExecID string `json:"execId"`
	// Replica names the exec-worker serving the stream, for logs.
	Replica string `json:"replica"`
	// IOSubject is <prefix>.exec.<c>.<r>.io.<execId>.
	IOSubject string `json:"ioSubject"`
	// StdinOffset is how many stdin bytes sandboxd has: a resumed client sends from there.
	StdinOffset int64 `json:"stdinOffset"`
	// StdinClosed: sandboxd takes no more stdin (eof was sent, or the command exited).
	StdinClosed bool `json:"stdinClosed,omitempty"`
}

// Signaled answers a signal request. It is no part of the exec's stream and never ends it.
type Signaled struct {
	ExecID string `json:"execId"`
	// Delivered: the signal reached the process group.
	Delivered bool `json:"delivered"`
	// Code says why not: "exited" when the command and its process group are gone, else an
	// error code.
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

// SignalExited is the Signaled code of a command whose process group is gone.
const SignalExited = "exited"

// Notice is what the exec-worker tells the client about its exec beside the command's output,
// for a person (the Paperclip plugin writes it into the run's log). It is no part of the exec's
// stream: it has no seq and never ends it.
type Notice struct {
	ExecID string `json:"execId"`
	// Reason says what happened: NoticeRecordingStopped.
	Reason string `json:"reason"`
	// Message says it in one line; it never holds a secret or the command's output.
	Message string `json:"message"`
}

// NoticeRecordingStopped is the Reason of a Notice that a budget stopped the exec's recording
// into the run's history; the command goes on and its client still receives all of its output.
const NoticeRecordingStopped = "recordingStopped"

// StdinReply answers a stdin message: how many stdin bytes sandboxd has.
type StdinReply struct {
	Offset int64 `json:"offset"`
	// Closed: sandboxd takes no more stdin (eof was sent, or the command exited); send nothing
	// more.
	Closed bool `json:"closed,omitempty"`
}

// ResizeReply answers a resize message.
type ResizeReply struct {
	// Resized: the terminal has the new size (its foreground process group got SIGWINCH).
	Resized bool `json:"resized"`
	// Code says why not: "exited" when the command exited, else an error code
	// (invalid_request: the exec has no terminal, or a size out of bounds).
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

func validateCommon(execID, lease string) error {
	if !execspec.ValidID(execID) {
		return InvalidRequest("execId", "must be %s", execspec.IDRule)
	}
	if lease == "" {
		return InvalidRequest("providerLeaseId", "must not be empty")
	}
	if len(lease) > maxProviderLeaseIDLen || strings.ContainsFunc(lease, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return InvalidRequest("providerLeaseId", "must be at most %d bytes without control characters", maxProviderLeaseIDLen)
	}
	return nil
}
