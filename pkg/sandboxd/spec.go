package sandboxd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// Spec is a command to run (POST /v1/execs).
type Spec struct {
	// ID is the client's id for the exec (a ULID in kubeclip). A repeated start with the same
	// spec is answered with the existing exec, never a second process.
	ID      string   `json:"id"`
	Command string   `json:"command"`
	Args    []string `json:"args,omitempty"`
	// Cwd is the absolute working directory; empty: sandboxd's own. It must exist.
	Cwd string `json:"cwd,omitempty"`
	// Env is laid over sandboxd's environment (minus its seed). Its PATH finds Command.
	Env map[string]string `json:"env,omitempty"`
	// TimeoutMs kills the whole process tree after this long; 0: no timeout.
	TimeoutMs int64 `json:"timeoutMs,omitempty"`
	// Stdin: the command's stdin is a pipe fed by POST …/stdin; otherwise /dev/null.
	Stdin bool `json:"stdin,omitempty"`
	// MaxOutputBytes caps this exec's journal, up to the daemon's OutputBytesLimit; 0: the
	// daemon's MaxOutputBytes.
	MaxOutputBytes int64 `json:"maxOutputBytes,omitempty"`
	// TTY runs the command on a pseudo-terminal of this size (its stdin, stdout and stderr;
	// the output is one stream, stdout); it requires Stdin. nil: pipes.
	TTY *execspec.TTY `json:"tty,omitempty"`
}

// StartResult answers a start.
type StartResult struct {
	ID        string    `json:"id"`
	PID       int       `json:"pid"` // 0 when the command could not be started (see Exit.Error)
	StartedAt time.Time `json:"startedAt"`
	// Created is true for the request that started the exec (201) and false when an exec with
	// this id and spec already existed (200). Not part of the JSON body.
	Created bool `json:"-"`
}

// Info answers GET /v1/info.
type Info struct {
	Ready    bool `json:"ready"`
	Draining bool `json:"draining"`
	Running  int  `json:"running"` // execs whose command has not finished
	Execs    int  `json:"execs"`   // execs known, running or with a journal kept
}

// resizeRequest is POST /v1/execs/{id}/resize: the terminal's new size.
type resizeRequest = execspec.TTY

type signalRequest struct {
	Signal string `json:"signal"`
}

type offsetResponse struct {
	Offset int64 `json:"offset"`
}

// errorBody is every error answer: a code from errors.go, a message, and for stdin errors the
// current offset.
type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Offset  *int64 `json:"offset,omitempty"`
}

// normalize makes equal specs compare equal: absent and empty lists and maps are the same.
func (s Spec) normalize() Spec {
	if len(s.Args) == 0 {
		s.Args = nil
	}
	if len(s.Env) == 0 {
		s.Env = nil
	}
	return s
}

func (s Spec) equal(o Spec) bool {
	a, b := s.normalize(), o.normalize()
	return a.ID == b.ID && a.Command == b.Command && slices.Equal(a.Args, b.Args) &&
		a.Cwd == b.Cwd && maps.Equal(a.Env, b.Env) && a.TimeoutMs == b.TimeoutMs &&
		a.Stdin == b.Stdin && a.MaxOutputBytes == b.MaxOutputBytes && equalTTY(a.TTY, b.TTY)
}

func equalTTY(a, b *execspec.TTY) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// fieldError is a bad request naming the offending field.
type fieldError struct {
	Field string
	Msg   string
}

func (e *fieldError) Error() string { return e.Field + ": " + e.Msg }

// Validate checks what the daemon can check without running the command. A command that is
// missing from PATH or a cwd that does not exist are not request errors: they end the exec the
// way a shell would (127, 126).
func (s Spec) Validate() error {
	var errs []error
	bad := func(field, msg string) { errs = append(errs, &fieldError{Field: field, Msg: msg}) }
	if !execspec.ValidID(s.ID) {
		bad("id", fmt.Sprintf("must be 1-%d of [A-Za-z0-9_-]", execspec.MaxIDLen))
	}
	if s.Command == "" {
		bad("command", "must not be empty")
	}
	if strings.ContainsRune(s.Command, 0) {
		bad("command", "must not contain NUL")
	}
	for i, a := range s.Args {
		if strings.ContainsRune(a, 0) {
			bad(fmt.Sprintf("args[%d]", i), "must not contain NUL")
		}
	}
	if s.Cwd != "" && !filepath.IsAbs(s.Cwd) {
		bad("cwd", "must be an absolute path")
	}
	if strings.ContainsRune(s.Cwd, 0) {
		bad("cwd", "must not contain NUL")
	}
	checkEnv("env", s.Env, bad)
	if s.TimeoutMs < 0 {
		bad("timeoutMs", "must be >= 0")
	}
	if s.MaxOutputBytes < 0 {
		bad("maxOutputBytes", "must be >= 0")
	}
	if s.TTY != nil {
		if err := s.TTY.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("tty.%w", err))
		}
		if !s.Stdin {
			bad("stdin", "must be true with tty (a terminal's input is streamed)")
		}
	}
	return errors.Join(errs...)
}

// checkEnv reports each bad variable of env, named under field: a name must be non-empty and
// hold neither '=' nor NUL, a value no NUL (execve could not pass them). Messages name variables,
// never their values.
func checkEnv(field string, env map[string]string, bad func(field, msg string)) {
	for _, k := range slices.Sorted(maps.Keys(env)) {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			bad(field, fmt.Sprintf("invalid variable name %q", k))
		}
		if strings.ContainsRune(env[k], 0) {
			bad(field+"."+k, "must not contain NUL")
		}
	}
}

// decodeStrict decodes exactly one JSON object of at most limit bytes into v, rejecting unknown
// fields and trailing data.
func decodeStrict(r io.Reader, limit int64, v any) error {
	lr := &io.LimitedReader{R: r, N: limit + 1}
	dec := json.NewDecoder(lr)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if lr.N <= 0 {
			return errBodyTooLarge
		}
		return fmt.Errorf("decoding the request body: %w", err)
	}
	if err := dec.Decode(&struct{}{}); !errors.Is(err, io.EOF) {
		if lr.N <= 0 {
			return errBodyTooLarge
		}
		return errors.New("decoding the request body: more than one JSON value")
	}
	if lr.N <= 0 {
		return errBodyTooLarge // the value fit, but the byte past the limit was read too
	}
	return nil
}

var errBodyTooLarge = errors.New("request body too large")
