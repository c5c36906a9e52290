package execproto

import (
	"encoding/json"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// Headers of inbox and io messages.
const (
	// HeaderKind says what a message is (Kind).
	HeaderKind = "Kubeclip-Exec"
	// HeaderSeq is an out message's journal seq, a heartbeat's last seq sent, an ack's highest
	// contiguous seq held.
	HeaderSeq = "Kubeclip-Exec-Seq"
	// HeaderStream is an out message's stream: stdout or stderr.
	HeaderStream = "Kubeclip-Exec-Stream"
	// HeaderOffset is a stdin message's offset: the stdin bytes sent before this one.
	HeaderOffset = "Kubeclip-Exec-Offset"
	// HeaderEOF ("1") marks the last stdin message.
	HeaderEOF = "Kubeclip-Exec-Eof"
	// HeaderRows and HeaderCols are a resize message's new terminal size.
	HeaderRows = "Kubeclip-Exec-Rows"
	HeaderCols = "Kubeclip-Exec-Cols"
	// HeaderSession and HeaderInbox name the session that took a stream over and the client
	// inbox it serves, on a takeover message (exec-worker to exec-worker on the control
	// subject; clients never see it).
	HeaderSession = "Kubeclip-Exec-Session"
	HeaderInbox   = "Kubeclip-Exec-Inbox"
)

// Kind is a message's HeaderKind.
type Kind string

// Inbox message kinds (exec-worker → client).
const (
	KindStarted   Kind = "started"
	KindOut       Kind = "out"
	KindHeartbeat Kind = "heartbeat"
	KindExit      Kind = "exit"
	KindError     Kind = "error"
	KindSignaled  Kind = "signaled"
	// KindNotice is something the exec-worker tells the client about its exec beside the
	// command's output (Notice); no part of the stream, it never ends it.
	KindNotice Kind = "notice"
)

// io message kinds (client → exec-worker, on the io subject).
const (
	KindStdin Kind = "stdin"
	KindAck   Kind = "ack"
	KindClose Kind = "close"
	// KindResize sets the size of an exec's terminal (a start with tty).
	KindResize Kind = "resize"
	// KindTakeover is sent by a session that starts serving an exec's stream to a client
	// inbox, so that any other session serving the same inbox (this replica's or another's)
	// stops.
	KindTakeover Kind = "takeover"
)

// Output streams of HeaderStream.
const (
	StreamStdout = "stdout"
	StreamStderr = "stderr"
)

// KindOf returns a message's kind ("" without the header).
func KindOf(m *nats.Msg) Kind {
	if m.Header == nil {
		return ""
	}
	return Kind(m.Header.Get(HeaderKind))
}

// NewMsg returns a message of kind to subject with data as its body.
func NewMsg(subject string, kind Kind, data []byte) *nats.Msg {
	m := nats.NewMsg(subject)
	m.Header.Set(HeaderKind, string(kind))
	m.Data = data
	return m
}

// NewJSONMsg returns a message of kind to subject with v as its JSON body.
func NewJSONMsg(subject string, kind Kind, v any) (*nats.Msg, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding %s message: %w", kind, err)
	}
	return NewMsg(subject, kind, data), nil
}

// Uint reads a non-negative integer header; ok is false when it is absent or malformed.
func Uint(m *nats.Msg, header string) (uint64, bool) {
	if m.Header == nil {
		return 0, false
	}
	v := m.Header.Get(header)
	if v == "" {
		return 0, false
	}
	n, err := strconv.ParseUint(v, 10, 64)
	return n, err == nil
}

// SetUint sets an integer header.
func SetUint(m *nats.Msg, header string, n uint64) { m.Header.Set(header, strconv.FormatUint(n, 10)) }

// NewResizeMsg returns a resize message for the io subject: the terminal's new size.
func NewResizeMsg(subject string, sz execspec.TTY) *nats.Msg {
	m := NewMsg(subject, KindResize, nil)
	SetUint(m, HeaderRows, uint64(max(sz.Rows, 0)))
	SetUint(m, HeaderCols, uint64(max(sz.Cols, 0)))
	return m
}

// ResizeOf reads a resize message's size; an absent, malformed or out-of-bounds header is an
// invalid_request *Error naming it ("rows", "cols").
func ResizeOf(m *nats.Msg) (execspec.TTY, error) {
	var sz execspec.TTY
	for _, h := range []struct {
		header, field string
		dim           *int
	}{{HeaderRows, "rows", &sz.Rows}, {HeaderCols, "cols", &sz.Cols}} {
		n, ok := Uint(m, h.header)
		if !ok || n < 1 || n > execspec.MaxTTYDim {
			return execspec.TTY{}, InvalidRequest(h.field, "header %s must be 1-%d", h.header, execspec.MaxTTYDim)
		}
		*h.dim = int(n)
	}
	return sz, nil
}
