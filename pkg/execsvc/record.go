package execsvc

import (
	"bytes"
	"context"
	"encoding/json"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
	"github.com/kubeclip/kubeclip/pkg/streamjson"
)

// maxRecordedLine bounds the stdout line the agent-result parser is fed: stream-json lines carry
// whole tool results, so they can be large, but not without end.
const maxRecordedLine = 8 << 20

// eventPublisher publishes run events; *events.Publisher is the real one.
type eventPublisher interface {
	Publish(ctx context.Context, ev events.Event, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}

var _ eventPublisher = (*events.Publisher)(nil)

// recorder turns a recorded exec's journal, read from seq 1 without gaps, into its `exec` run
// events. Everything it carries between chunks (a character split by a read, the line the
// agent-result parser has not seen the end of) is rebuilt by reading the journal again, which
// is how a replica that takes a stream over continues one.
type recorder struct {
	ref     events.RunRef
	execID  string
	command string

	carry   [3][]byte // per stream: the start of a character split by the chunk's end
	line    []byte    // stdout since its last newline
	skip    bool      // the current stdout line is over maxRecordedLine: not parsed
	parser  streamjson.Parser
	sawJSON bool
}

func newRecorder(ref events.RunRef, execID, command string) *recorder {
	return &recorder{ref: ref, execID: execID, command: command}
}

// chunk returns the event of c and feeds c to the agent-result parser.
func (r *recorder) chunk(c *sandboxd.Chunk) events.RunExecEvent {
	if c.Stream == sandboxd.Stdout {
		r.feed(c.Data)
	}
	stream := events.ExecStdout
	if c.Stream == sandboxd.Stderr {
		stream = events.ExecStderr
	}
	return events.RunExecEvent{
		RunID: r.ref.RunID, CompanyID: r.ref.CompanyID, ExecID: r.execID, Seq: c.Seq,
		Command: r.command, Stream: stream, Text: r.text(c.Stream, c.Data),
	}
}

// exit returns the final event.
func (r *recorder) exit(e *execspec.Exit) events.RunExecEvent {
	if len(r.line) > 0 && !r.skip {
		r.parseLine(r.line)
	}
	ev := events.RunExecEvent{
		RunID: r.ref.RunID, CompanyID: r.ref.CompanyID, ExecID: r.execID, Seq: e.LastSeq + 1, Command: r.command,
		Exit: &events.ExecExit{ExitCode: e.ExitCode, Signal: e.Signal, TimedOut: e.TimedOut, Truncated: e.Truncated},
	}
	if r.sawJSON {
		code := 1
		if e.ExitCode != nil {
			code = *e.ExitCode
		}
		ev.Agent = r.parser.ResultWithExitCode(code)
	}
	return ev
}

// text decodes data as UTF-8 for stream s: the start of a character that data's end splits is
// held back for the stream's next chunk, whose text begins with it.
func (r *recorder) text(s sandboxd.Stream, data []byte) string {
	b := append(r.carry[s][:len(r.carry[s]):len(r.carry[s])], data...)
	r.carry[s] = nil
	if cut := incompleteTail(b); cut > 0 {
		r.carry[s] = bytes.Clone(b[len(b)-cut:])
		b = b[:len(b)-cut]
	}
	return string(bytes.ToValidUTF8(b, []byte("\uFFFD")))
}

// incompleteTail returns how many bytes at the end of b start a UTF-8 character that is not
// complete yet (0 to 3).
func incompleteTail(b []byte) int {
	for i := 1; i <= 3 && i <= len(b); i++ {
		c := b[len(b)-i]
		if c < 0x80 {
			return 0 // ASCII: nothing pending
		}
		if c >= 0xC0 { // a leading byte: complete if its length fits
			if need := leadLen(c); need > i {
				return i
			}
			return 0
		}
	}
	return 0
}

func leadLen(c byte) int {
	switch {
	case c >= 0xF0:
		return 4
	case c >= 0xE0:
		return 3
	default:
		return 2
	}
}

// feed splits stdout into lines for the parser.
func (r *recorder) feed(data []byte) {
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			r.appendLine(data)
			return
		}
		r.appendLine(data[:i])
		if !r.skip {
			r.parseLine(r.line)
		}
		r.line, r.skip = r.line[:0], false
		data = data[i+1:]
	}
}

func (r *recorder) appendLine(b []byte) {
	if r.skip {
		return
	}
	if len(r.line)+len(b) > maxRecordedLine {
		r.skip, r.line = true, r.line[:0]
		return
	}
	r.line = append(r.line, b...)
}

func (r *recorder) parseLine(line []byte) {
	if t := bytes.TrimSpace(line); len(t) > 0 && t[0] == '{' && utf8.Valid(t) && json.Valid(t) {
		r.sawJSON = true
	}
	r.parser.Feed(line)
}

// publish stores ev, retrying until it is stored or ctx ends: a chunk is relayed to the client
// only after its event is in the stream, so a replica that takes over from the client's
// position never leaves an event unpublished.
func publishRetrying(ctx context.Context, pub eventPublisher, ev events.Event, onRetry func(error)) error {
	backoff := 100 * time.Millisecond
	for {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := pub.Publish(pctx, ev)
		cancel()
		if err == nil {
			return nil
		}
		if _, terminal := events.AsTerminal(err); terminal {
			return err
		}
		onRetry(err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}
