package k8s

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Cursor is a position in a container's log: the Kubernetes timestamp of the last line delivered
// and how many delivered lines carried exactly that timestamp. The zero Cursor is the start.
//
// Resuming from a Cursor neither repeats nor drops lines, including several lines sharing one
// timestamp, because the kubelet replays every line at or after SinceTime in file order.
// Time is the highest timestamp delivered, not the last one: the kubelet stamps stdout and stderr
// separately, so one can be a few microseconds behind the other. A line that is older than an
// already delivered line and was not yet read when the stream broke is therefore lost; that needs
// a break inside that microsecond window.
type Cursor struct {
	Time  time.Time
	Count int
}

// Line is one log line of a container.
type Line struct {
	// Time is the kubelet's timestamp of the line (for a line without one, the cursor's time).
	Time time.Time
	// TimeRaw is the timestamp as the kubelet sent it (RFC 3339 with nanoseconds), or "".
	TimeRaw string
	// Text is the line without the timestamp and without the trailing newline. A line longer
	// than FollowOptions.MaxLineBytes arrives as several Lines with the same Time.
	Text string
}

// Defaults of FollowOptions.
const (
	// DefaultMaxLineBytes caps one delivered Line. A stream-json line with a large tool result
	// can exceed bufio.Scanner's 64 KiB; 1 MiB matches NATS's default max_payload, so one Line
	// always fits one message.
	DefaultMaxLineBytes = 1 << 20
	// DefaultMinBackoff and DefaultMaxBackoff bound the wait between reconnects after the first,
	// immediate one. The cap bounds how long a pending container's first lines wait; the
	// doubling keeps a container that never starts from costing more than two requests (GetLogs
	// and the pod GET) every few seconds.
	DefaultMinBackoff = 250 * time.Millisecond
	DefaultMaxBackoff = 5 * time.Second
)

// FollowOptions tunes FollowLogs.
type FollowOptions struct {
	// IsDone reports whether the container has terminated for good, so no more lines can come.
	// Default: GET the pod; done when it is Succeeded or Failed, or when the container is
	// terminated and the pod's restartPolicy is Never.
	IsDone func(ctx context.Context) (bool, error)
	// MaxLineBytes caps one Line (DefaultMaxLineBytes when zero).
	MaxLineBytes int
	// MinBackoff and MaxBackoff bound the wait between reconnects (DefaultMinBackoff,
	// DefaultMaxBackoff when zero).
	MinBackoff, MaxBackoff time.Duration
	// Logger receives one debug record per reconnect. The zero Logger discards.
	Logger zerolog.Logger
}

func (o FollowOptions) withDefaults() FollowOptions {
	if o.MaxLineBytes <= 0 {
		o.MaxLineBytes = DefaultMaxLineBytes
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = DefaultMinBackoff
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = DefaultMaxBackoff
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = o.MinBackoff
	}
	return o
}

// FollowLogs streams a container's log to emit, starting after from, until the container has
// terminated and its whole log was delivered, and returns the cursor after the last delivered
// line. It returns early with ctx's error, or with emit's error (emit errors abort and are
// returned as is).
//
// It reads with Follow and Timestamps, from SinceTime = from.Time truncated to the second (the
// API takes RFC 3339 without fractions, so the kubelet replays the whole second) and drops what
// the cursor says was delivered. When a stream ends (container exit, kubelet idle timeout, a
// broken connection) it asks IsDone; while the container runs it reconnects from the cursor,
// the first time at once and then after a doubling backoff (reset by any delivered line). Once
// the container has terminated it reads the log once more without Follow, to catch lines the
// follow stream missed at exit, and returns.
//
// Errors other than ctx's and emit's (the pod deleted, RBAC) are returned wrapped with the
// cursor reached; resume from it.
func FollowLogs(ctx context.Context, cs kubernetes.Interface, ns, pod, container string, from Cursor, emit func(Line) error, opts FollowOptions) (Cursor, error) {
	opts = opts.withDefaults()
	isDone := opts.IsDone
	if isDone == nil {
		isDone = func(ctx context.Context) (bool, error) { return podContainerDone(ctx, cs, ns, pod, container) }
	}
	d := newLogDecoder(from, opts.MaxLineBytes)
	read := func(follow bool) error {
		req := cs.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{
			Container:  container,
			Follow:     follow,
			Timestamps: true,
			SinceTime:  sinceTime(d.cur),
		})
		rc, err := req.Stream(ctx)
		if err != nil {
			return fmt.Errorf("opening log stream: %w", err)
		}
		defer rc.Close()
		// A non-follow read ends at the real end of the log, so its unterminated last line is
		// complete; a follow stream may be cut in the middle of one.
		return d.decode(rc, !follow, emit)
	}

	failures := 0
	for {
		before := d.delivered
		err := read(true)
		if emitErr := (*emitError)(nil); errors.As(err, &emitErr) {
			return d.cur, emitErr.err
		}
		if ctx.Err() != nil {
			return d.cur, ctx.Err()
		}
		done, derr := isDone(ctx)
		if derr != nil {
			if ctx.Err() != nil {
				return d.cur, ctx.Err()
			}
			return d.cur, fmt.Errorf("following logs of %s/%s[%s]: checking container: %w", ns, pod, container, derr)
		}
		if done {
			err := read(false)
			if emitErr := (*emitError)(nil); errors.As(err, &emitErr) {
				return d.cur, emitErr.err
			}
			if ctx.Err() != nil {
				return d.cur, ctx.Err()
			}
			if err != nil {
				return d.cur, fmt.Errorf("reading final logs of %s/%s[%s]: %w", ns, pod, container, err)
			}
			return d.cur, nil
		}
		if d.delivered > before {
			failures = 0
		}
		failures++
		wait := reconnectBackoff(failures, opts.MinBackoff, opts.MaxBackoff)
		opts.Logger.Debug().Str(logKeyNamespace, ns).Str(logKeyPod, pod).Str(logKeyContainer, container).
			Int(logKeyAttempt, failures).Dur(logKeyBackoff, wait).AnErr(logKeyError, err).Msg("log stream ended; reconnecting")
		if err := sleepCtx(ctx, wait); err != nil {
			return d.cur, err
		}
	}
}

// reconnectBackoff is the wait before the n-th consecutive reconnect: none for the first, then
// min, 2·min, ... up to max.
func reconnectBackoff(n int, minWait, maxWait time.Duration) time.Duration {
	if n <= 1 {
		return 0
	}
	d := minWait
	for i := 2; i < n && d < maxWait; i++ {
		d *= 2
	}
	return min(d, maxWait)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// sinceTime is the SinceTime of a request resuming at c: the API is second-granular, so the
// second the cursor is in.
func sinceTime(c Cursor) *metav1.Time {
	if c.Time.IsZero() {
		return nil
	}
	t := metav1.NewTime(c.Time.Truncate(time.Second))
	return &t
}

// podContainerDone is the default FollowOptions.IsDone.
func podContainerDone(ctx context.Context, cs kubernetes.Interface, ns, pod, container string) (bool, error) {
	p, err := cs.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	return containerDone(p, container), nil
}

func containerDone(p *corev1.Pod, container string) bool {
	if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
		return true
	}
	st := findContainerStatus(p, container)
	return st != nil && st.State.Terminated != nil && p.Spec.RestartPolicy == corev1.RestartPolicyNever
}

// emitError marks an error returned by the caller's emit so FollowLogs returns it unchanged.
type emitError struct{ err error }

func (e *emitError) Error() string { return e.err.Error() }
func (e *emitError) Unwrap() error { return e.err }

// logDecoder turns kubelet log streams ("<RFC3339Nano> <text>\n" per line) into Lines and keeps
// the cursor. One decoder spans every stream of one FollowLogs call.
type logDecoder struct {
	cur       Cursor
	maxLine   int
	delivered int
	buf       []byte
}

func newLogDecoder(from Cursor, maxLine int) *logDecoder {
	return &logDecoder{cur: from, maxLine: maxLine}
}

// decode reads one stream that starts at or before d.cur's second and emits each line the cursor
// has not covered yet. It returns nil at EOF, the read error otherwise, or an *emitError.
//
// An unterminated last line is emitted only when final is set; otherwise it is left for the
// next stream, which sends it again, whole. A line longer than d.maxLine is emitted in pieces as
// it arrives (memory stays bounded); the cut points depend on the line's bytes only, so a replayed
// line yields the same pieces and the cursor's count skips the ones already delivered.
func (d *logDecoder) decode(r io.Reader, final bool, emit func(Line) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	st := decodeState{lastTime: d.cur.Time}
	for {
		frag, err := br.ReadSlice('\n')
		complete := err == nil
		if complete {
			frag = frag[:len(frag)-1]
		}
		d.buf = append(d.buf, frag...)
		switch {
		case complete:
			if err := d.flush(&st, true, emit); err != nil {
				return err
			}
			continue
		case errors.Is(err, bufio.ErrBufferFull):
			if err := d.flush(&st, false, emit); err != nil {
				return err
			}
			continue
		}
		// End of stream.
		if errors.Is(err, io.EOF) && final && (len(d.buf) > 0 || st.inLine) {
			if ferr := d.flush(&st, true, emit); ferr != nil {
				return ferr
			}
		}
		d.buf = d.buf[:0] // a cut line: the next stream resends it
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
}

// decodeState is the per-stream part of decoding.
type decodeState struct {
	// seenAtCursor counts lines with the cursor's exact timestamp seen in this stream; the first
	// d.cur.Count of them were delivered before.
	seenAtCursor int
	// lastTime is what a line without a timestamp inherits: the previous line's.
	lastTime time.Time
	// inLine is set once the current line's timestamp is parsed and some of it emitted.
	inLine bool
	raw    string
	ts     time.Time
}

// flush emits what d.buf holds of the current line: everything when the line is complete, else
// only whole pieces of d.maxLine bytes (keeping the tail until more arrives).
func (d *logDecoder) flush(st *decodeState, complete bool, emit func(Line) error) error {
	if !st.inLine {
		if !complete && len(d.buf) <= maxTimestampLen {
			return nil // not enough to parse the timestamp yet
		}
		raw, rest, ts, ok := splitTimestamp(d.buf)
		if !ok {
			ts = st.lastTime
		}
		st.raw, st.ts, st.lastTime, st.inLine = raw, ts, ts, true
		d.buf = d.buf[:copy(d.buf, rest)]
	}
	for len(d.buf) > d.maxLine {
		cut := pieceLen(d.buf, d.maxLine)
		if err := d.deliver(st, string(d.buf[:cut]), emit); err != nil {
			return err
		}
		d.buf = d.buf[:copy(d.buf, d.buf[cut:])]
	}
	if !complete {
		return nil
	}
	err := d.deliver(st, string(d.buf), emit)
	d.buf = d.buf[:0]
	st.inLine = false
	return err
}

// deliver emits one piece unless the cursor says it was delivered already.
func (d *logDecoder) deliver(st *decodeState, text string, emit func(Line) error) error {
	var next Cursor
	switch {
	case st.ts.Before(d.cur.Time):
		return nil
	case st.ts.Equal(d.cur.Time):
		st.seenAtCursor++
		if st.seenAtCursor <= d.cur.Count {
			return nil
		}
		next = Cursor{Time: d.cur.Time, Count: d.cur.Count + 1}
	default:
		next = Cursor{Time: st.ts, Count: 1}
		st.seenAtCursor = 1
	}
	// The cursor moves only past lines emit accepted, so resuming after an emit error retries
	// the line that failed.
	if err := emit(Line{Time: st.ts, TimeRaw: st.raw, Text: text}); err != nil {
		return &emitError{err: err}
	}
	d.cur = next
	d.delivered++
	return nil
}

// maxTimestampLen is the longest timestamp prefix the kubelet writes (RFC 3339 with nanoseconds
// and a numeric zone), plus its space.
const maxTimestampLen = len("2006-01-02T15:04:05.000000000-07:00 ")

// splitTimestamp splits "<RFC3339Nano> <text>" into its parts. ok is false when the line does not
// start with a timestamp; text is then the whole line.
func splitTimestamp(line []byte) (raw string, text []byte, ts time.Time, ok bool) {
	i := bytes.IndexByte(line, ' ')
	if i <= 0 || i >= maxTimestampLen {
		return "", line, time.Time{}, false
	}
	t, err := time.Parse(time.RFC3339Nano, string(line[:i]))
	if err != nil {
		return "", line, time.Time{}, false
	}
	return string(line[:i]), line[i+1:], t, true
}

// pieceLen is where to cut a too long text: at maxBytes, moved back to the start of a UTF-8
// rune when one is within reach. It depends on text[:maxBytes+1] only.
func pieceLen(text []byte, maxBytes int) int {
	for back := 0; back < utf8.UTFMax && maxBytes-back > 0; back++ {
		if utf8.RuneStart(text[maxBytes-back]) {
			return maxBytes - back
		}
	}
	return maxBytes
}
