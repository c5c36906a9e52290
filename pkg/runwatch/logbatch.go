package runwatch

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// Log batching bounds. The size bound is the contract's (events.MaxLogEventBytes); how lines
// are packed under it is the run-watcher's business.
const (
	// DefaultLogMaxLines completes an event of many short lines before it reaches the byte
	// bound, so a reader never has to decode thousands of lines for one message.
	DefaultLogMaxLines = 1000

	// maxTSLen bounds LogLine.TS (a Kubernetes timestamp is 30 bytes) so a piece always has
	// room for text.
	maxTSLen = 64
	// minLogEventBytes keeps MaxBytes large enough for the envelope plus a useful piece.
	minLogEventBytes = 1 << 10
)

// sequence hands out a run's log event numbers: 1, 2, 3, ... without gaps. One sequence is
// shared by the batchers of a run's pods and containers. Safe for concurrent use.
type sequence struct{ last atomic.Uint64 }

// newSequence continues after last (0 for a new run; the last published seq after a restart).
func newSequence(last uint64) *sequence {
	s := &sequence{}
	s.last.Store(last)
	return s
}

func (s *sequence) next() uint64 { return s.last.Add(1) }

// lastIssued returns the last number handed out.
func (s *sequence) lastIssued() uint64 { return s.last.Load() }

// LogBatcherOptions configures a LogBatcher for one container of one run.
type LogBatcherOptions struct {
	RunID     string
	CompanyID string
	Pod       string
	Container string
	// MaxBytes bounds an event's encoded payload (default and maximum events.MaxLogEventBytes).
	MaxBytes int
	// MaxLines completes an event at this many lines (default DefaultLogMaxLines).
	MaxLines int
	// Now stamps events; defaults to time.Now.
	Now func() time.Time

	// seq numbers the events; a new sequence starting at 1 when nil. The run log shares its
	// run's sequence between the batchers of its pods.
	seq *sequence
}

// LogBatcher packs a container's log lines into RunLogEvents whose encoded payload never
// exceeds MaxBytes. A line too long for one event on its own is split into pieces on UTF-8
// boundaries; every piece but the last has Partial set, all share the line's TS. Nothing is
// truncated or dropped. Invalid UTF-8 is replaced with U+FFFD (JSON cannot carry it).
//
// When a partial event goes out is the caller's decision (the run log's flush timer). Add and
// Flush are not safe for concurrent use.
type LogBatcher struct {
	opts    LogBatcherOptions
	base    int // upper bound of the encoded size of an event without lines
	pending []events.LogLine
	size    int // encoded size of the pending event, base included
}

// NewLogBatcher validates opts and returns a LogBatcher.
func NewLogBatcher(opts LogBatcherOptions) (*LogBatcher, error) {
	if err := events.Ref(opts.CompanyID, opts.RunID).Validate(); err != nil {
		return nil, err
	}
	if opts.MaxBytes == 0 {
		opts.MaxBytes = events.MaxLogEventBytes
	}
	if opts.MaxBytes < minLogEventBytes || opts.MaxBytes > events.MaxLogEventBytes {
		return nil, errors.New("runwatch: LogBatcherOptions.MaxBytes must be between 1 KiB and 64 KiB")
	}
	if opts.MaxLines == 0 {
		opts.MaxLines = DefaultLogMaxLines
	}
	if opts.MaxLines < 0 {
		return nil, errors.New("runwatch: LogBatcherOptions.MaxLines must not be negative")
	}
	if opts.seq == nil {
		opts.seq = newSequence(0)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	b := &LogBatcher{opts: opts}
	// The envelope is measured with the longest seq and time it can carry, so the bound holds
	// whatever they turn out to be.
	envelope, err := marshal(events.RunLogEvent{
		RunID: opts.RunID, CompanyID: opts.CompanyID,
		At:  time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.FixedZone("", -(23*3600+59*60))),
		Seq: math.MaxUint64, Pod: opts.Pod, Container: opts.Container, Lines: []events.LogLine{},
	})
	if err != nil {
		return nil, err
	}
	b.base = len(envelope)
	if b.base+minLogEventBytes/2 > opts.MaxBytes {
		return nil, errors.New("runwatch: pod and container names leave no room for log lines")
	}
	return b, nil
}

// Pending returns the number of lines waiting for the next event.
func (b *LogBatcher) Pending() int { return len(b.pending) }

// Add queues line and returns the events it completed: zero, one, or several when a long line
// is split. Events are complete when the next line would not fit or MaxLines is reached.
func (b *LogBatcher) Add(line events.LogLine) []events.RunLogEvent {
	line.Text = strings.ToValidUTF8(line.Text, "\uFFFD")
	line.TS = truncateBytes(strings.ToValidUTF8(line.TS, "\uFFFD"), maxTSLen)
	line.Partial = false
	var out []events.RunLogEvent
	for _, piece := range b.split(line) {
		n := encodedSize(piece)
		if len(b.pending) > 0 && b.size+1+n > b.opts.MaxBytes {
			out = append(out, b.seal())
		}
		if len(b.pending) == 0 {
			b.size = b.base + n
		} else {
			b.size += 1 + n // the comma before it
		}
		b.pending = append(b.pending, piece)
		if len(b.pending) >= b.opts.MaxLines {
			out = append(out, b.seal())
		}
	}
	return out
}

// Flush returns the pending lines as an event; ok is false when nothing is pending.
func (b *LogBatcher) Flush() (ev events.RunLogEvent, ok bool) {
	if len(b.pending) == 0 {
		return events.RunLogEvent{}, false
	}
	return b.seal(), true
}

func (b *LogBatcher) seal() events.RunLogEvent {
	ev := events.RunLogEvent{
		RunID:     b.opts.RunID,
		CompanyID: b.opts.CompanyID,
		At:        b.opts.Now().UTC(),
		Seq:       b.opts.seq.next(),
		Pod:       b.opts.Pod,
		Container: b.opts.Container,
		Lines:     b.pending,
	}
	b.pending, b.size = nil, 0
	return ev
}

// split cuts a line that cannot fit in an empty event into pieces that each can.
func (b *LogBatcher) split(line events.LogLine) []events.LogLine {
	if b.base+encodedSize(line) <= b.opts.MaxBytes {
		return []events.LogLine{line}
	}
	budget := b.opts.MaxBytes - b.base - encodedSize(events.LogLine{TS: line.TS, Partial: true})
	var pieces []events.LogLine
	text := line.Text
	for text != "" {
		cut, used := 0, 0
		for cut < len(text) {
			r, size := utf8.DecodeRuneInString(text[cut:])
			cost := escapedLen(r)
			if used+cost > budget {
				break
			}
			used += cost
			cut += size
		}
		pieces = append(pieces, events.LogLine{TS: line.TS, Text: text[:cut], Partial: true})
		text = text[cut:]
	}
	pieces[len(pieces)-1].Partial = false
	return pieces
}

func encodedSize(l events.LogLine) int {
	data, err := marshal(l)
	if err != nil {
		// A LogLine is strings and a bool; it always encodes.
		panic(err)
	}
	return len(data)
}

// marshal encodes v as events.Publisher does (JSON without HTML escaping), so sizes measured
// here are the sizes published; TestLogBatcherBoundsEveryEvent measures with the Publisher.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// escapedLen is an upper bound of a rune's size inside a JSON string as marshal writes it.
func escapedLen(r rune) int {
	switch {
	case r == '"' || r == '\\' || r == '\n' || r == '\r' || r == '\t':
		return 2
	case r < 0x20 || r == '\u2028' || r == '\u2029':
		return 6
	}
	return utf8.RuneLen(r)
}

func truncateBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
