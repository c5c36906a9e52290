package events

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"
)

// Log batching bounds.
const (
	// MaxLogEventBytes bounds a log event's encoded JSON payload: big enough to carry hundreds of
	// typical lines per message, small enough that a slow reader never has to swallow a large
	// message and far under the 1 MiB stream limit.
	MaxLogEventBytes = 64 << 10
	// DefaultLogMaxLines flushes a batch of many short lines before it reaches the byte bound.
	DefaultLogMaxLines = 1000
	// DefaultLogFlushInterval is the longest a line waits in the batcher: a lone line is
	// published within 50 ms, a burst still shares one event.
	DefaultLogFlushInterval = 50 * time.Millisecond

	// maxTSLen bounds LogLine.TS (a Kubernetes timestamp is 30 bytes) so a piece always has
	// room for text.
	maxTSLen = 64
	// minLogEventBytes keeps MaxBytes large enough for the envelope plus a useful piece.
	minLogEventBytes = 1 << 10
)

// Sequence hands out a run's log event numbers: 1, 2, 3, ... without gaps. Share one Sequence
// between the batchers of a run's containers. Safe for concurrent use.
type Sequence struct{ last atomic.Uint64 }

// NewSequence continues after last (0 for a new run; LastLogSeq after a restart).
func NewSequence(last uint64) *Sequence {
	s := &Sequence{}
	s.last.Store(last)
	return s
}

// Next returns the next number.
func (s *Sequence) Next() uint64 { return s.last.Add(1) }

// Last returns the last number handed out.
func (s *Sequence) Last() uint64 { return s.last.Load() }

// LogBatcherOptions configures a LogBatcher for one container of one run.
type LogBatcherOptions struct {
	RunID     string
	CompanyID string
	Pod       string
	Container string
	// Seq numbers the events; defaults to a new Sequence starting at 1.
	Seq *Sequence
	// MaxBytes bounds an event's encoded payload (default and maximum MaxLogEventBytes).
	MaxBytes int
	// MaxLines flushes a batch at this many lines (default 1000).
	MaxLines int
	// FlushInterval is the longest a line waits before its batch is flushed (default 50 ms).
	FlushInterval time.Duration
	// Now stamps events; defaults to time.Now.
	Now func() time.Time
	// Logger reports publish retries in Run.
	Logger zerolog.Logger
}

// LogBatcher packs a container's log lines into RunLogEvents whose encoded payload never
// exceeds MaxBytes. A line too long for one event on its own is split into pieces on UTF-8
// boundaries; every piece but the last has Partial set, all share the line's TS. Nothing is
// truncated or dropped. Invalid UTF-8 is replaced with U+FFFD (JSON cannot carry it).
//
// Add and Flush are not safe for concurrent use; Run owns the batcher while it runs.
type LogBatcher struct {
	opts    LogBatcherOptions
	base    int // upper bound of the encoded size of an event without lines
	pending []LogLine
	size    int // encoded size of the pending event, base included
}

// NewLogBatcher validates opts and returns a LogBatcher.
func NewLogBatcher(opts LogBatcherOptions) (*LogBatcher, error) {
	if err := validateIDs(opts.CompanyID, opts.RunID); err != nil {
		return nil, err
	}
	if opts.MaxBytes == 0 {
		opts.MaxBytes = MaxLogEventBytes
	}
	if opts.MaxBytes < minLogEventBytes || opts.MaxBytes > MaxLogEventBytes {
		return nil, errors.New("events: LogBatcherOptions.MaxBytes must be between 1 KiB and 64 KiB")
	}
	if opts.MaxLines == 0 {
		opts.MaxLines = DefaultLogMaxLines
	}
	if opts.FlushInterval == 0 {
		opts.FlushInterval = DefaultLogFlushInterval
	}
	if opts.MaxLines < 0 || opts.FlushInterval < 0 {
		return nil, errors.New("events: LogBatcherOptions values must not be negative")
	}
	if opts.Seq == nil {
		opts.Seq = NewSequence(0)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	b := &LogBatcher{opts: opts}
	// The envelope is measured with the longest seq and time it can carry, so the bound holds
	// whatever they turn out to be.
	envelope, err := marshal(RunLogEvent{
		RunID: opts.RunID, CompanyID: opts.CompanyID,
		At:  time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.FixedZone("", -(23*3600+59*60))),
		Seq: math.MaxUint64, Pod: opts.Pod, Container: opts.Container, Lines: []LogLine{},
	})
	if err != nil {
		return nil, err
	}
	b.base = len(envelope)
	if b.base+minLogEventBytes/2 > opts.MaxBytes {
		return nil, errors.New("events: pod and container names leave no room for log lines")
	}
	return b, nil
}

// Pending returns the number of lines waiting for the next event.
func (b *LogBatcher) Pending() int { return len(b.pending) }

// Add queues line and returns the events it completed: zero, one, or several when a long line
// is split. Events are complete when the next line would not fit or MaxLines is reached.
func (b *LogBatcher) Add(line LogLine) []RunLogEvent {
	line.Text = strings.ToValidUTF8(line.Text, "\uFFFD")
	line.TS = truncateBytes(strings.ToValidUTF8(line.TS, "\uFFFD"), maxTSLen)
	line.Partial = false
	var out []RunLogEvent
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
func (b *LogBatcher) Flush() (ev RunLogEvent, ok bool) {
	if len(b.pending) == 0 {
		return RunLogEvent{}, false
	}
	return b.seal(), true
}

func (b *LogBatcher) seal() RunLogEvent {
	ev := RunLogEvent{
		RunID:     b.opts.RunID,
		CompanyID: b.opts.CompanyID,
		At:        b.opts.Now().UTC(),
		Seq:       b.opts.Seq.Next(),
		Pod:       b.opts.Pod,
		Container: b.opts.Container,
		Lines:     b.pending,
	}
	b.pending, b.size = nil, 0
	return ev
}

// split cuts a line that cannot fit in an empty event into pieces that each can.
func (b *LogBatcher) split(line LogLine) []LogLine {
	if b.base+encodedSize(line) <= b.opts.MaxBytes {
		return []LogLine{line}
	}
	budget := b.opts.MaxBytes - b.base - encodedSize(LogLine{TS: line.TS, Partial: true})
	var pieces []LogLine
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
		pieces = append(pieces, LogLine{TS: line.TS, Text: text[:cut], Partial: true})
		text = text[cut:]
	}
	pieces[len(pieces)-1].Partial = false
	return pieces
}

// Run batches lines until the channel is closed, then flushes and returns nil. A batch is
// emitted when it is full or when its first line has waited FlushInterval. emit failures are
// retried (publishing is idempotent by message id) until they succeed, emit returns a
// TerminalError, or ctx ends; so seq has no gaps unless Run returns an error. Pending lines are
// not flushed when ctx ends.
func (b *LogBatcher) Run(ctx context.Context, lines <-chan LogLine, emit func(context.Context, RunLogEvent) error) error {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	var timerC <-chan time.Time
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				if ev, ok := b.Flush(); ok {
					return b.emit(ctx, emit, ev)
				}
				return nil
			}
			ready := b.Add(line)
			for _, ev := range ready {
				if err := b.emit(ctx, emit, ev); err != nil {
					return err
				}
			}
			switch {
			case b.Pending() == 0:
				timer.Stop()
				timerC = nil
			case timerC == nil || len(ready) > 0:
				// A new batch started: its first line may wait FlushInterval.
				timer.Reset(b.opts.FlushInterval)
				timerC = timer.C
			}
		case <-timerC:
			timerC = nil
			if ev, ok := b.Flush(); ok {
				if err := b.emit(ctx, emit, ev); err != nil {
					return err
				}
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (b *LogBatcher) emit(ctx context.Context, emit func(context.Context, RunLogEvent) error, ev RunLogEvent) error {
	wait := 100 * time.Millisecond
	for {
		err := emit(ctx, ev)
		if err == nil {
			return nil
		}
		if _, terminal := AsTerminal(err); terminal || ctx.Err() != nil {
			return err
		}
		b.opts.Logger.Warn().Err(err).Str(LogKeyRunID, ev.RunID).Uint64(LogKeySeq, ev.Seq).Dur(LogKeyDelay, wait).
			Msg("publishing log event failed; retrying")
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return ctx.Err()
		}
		wait = min(2*wait, 5*time.Second)
	}
}

func encodedSize(l LogLine) int {
	data, err := marshal(l)
	if err != nil {
		// A LogLine is strings and a bool; it always encodes.
		panic(err)
	}
	return len(data)
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
