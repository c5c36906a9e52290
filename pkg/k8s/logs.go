package k8s

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ReorderWindow is how far out of timestamp order a line may reach the log. The kubelet stamps
// stdout and stderr lines separately, so the log file can hold a line a little older than the one
// before it; a Cursor remembers the lines of this last stretch exactly.
const ReorderWindow = 2 * time.Second

// Cursor is a position in a container's log: the highest Kubernetes timestamp delivered, and
// which lines (timestamp and text) were delivered within ReorderWindow of it. The zero Cursor is
// the start of the log.
//
// Resuming from a Cursor neither repeats nor drops a line: the kubelet replays every line from
// SinceTime (whole seconds, reaching back past the window), lines older than the window were
// delivered, and of the newer ones exactly those the Cursor counts are skipped, however many
// share a timestamp and in whatever order stdout and stderr interleaved.
type Cursor struct {
	// Time is the highest timestamp delivered.
	Time time.Time
	// recent counts the delivered lines with timestamps in [Time-ReorderWindow, Time].
	recent map[lineKey]int
	added  int
}

// lineKey identifies a line by its timestamp and text.
type lineKey struct {
	ts  int64
	sum uint64
}

func keyOf(ts time.Time, text string) lineKey {
	h := fnv.New64a()
	_, _ = h.Write([]byte(text))
	return lineKey{ts: ts.UnixNano(), sum: h.Sum64()}
}

// Add records l as delivered. FollowLogs does it for every line it emits; use it to rebuild a
// Cursor from lines delivered earlier (the run-watcher replays its published log).
func (c *Cursor) Add(l Line) {
	if c.recent == nil {
		c.recent = map[lineKey]int{}
	}
	c.recent[keyOf(l.Time, l.Text)]++
	if l.Time.After(c.Time) {
		c.Time = l.Time
	}
	// Forget what fell out of the window now and then, so memory follows the window.
	if c.added++; c.added%256 == 0 {
		floor := c.Time.Add(-ReorderWindow).UnixNano()
		for k := range c.recent {
			if k.ts < floor {
				delete(c.recent, k)
			}
		}
	}
}

// Clone returns a copy that does not share state with c.
func (c Cursor) Clone() Cursor {
	out := Cursor{Time: c.Time, added: c.added}
	if c.recent != nil {
		out.recent = make(map[lineKey]int, len(c.recent))
		for k, v := range c.recent {
			out.recent[k] = v
		}
	}
	return out
}

// Equal reports whether two cursors cover the same lines (used by go-cmp in tests).
func (c Cursor) Equal(o Cursor) bool {
	if !c.Time.Equal(o.Time) {
		return false
	}
	floor := c.Time.Add(-ReorderWindow).UnixNano()
	count := func(m map[lineKey]int) map[lineKey]int {
		out := map[lineKey]int{}
		for k, v := range m {
			if k.ts >= floor && v > 0 {
				out[k] = v
			}
		}
		return out
	}
	a, b := count(c.recent), count(o.recent)
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// skipper decides, for one stream that resumes at a Cursor, which lines were delivered before.
type skipper struct {
	floor  time.Time       // lines before it were delivered
	budget map[lineKey]int // how many more times each recent line may be skipped
}

func (c Cursor) skipper() skipper {
	if c.Time.IsZero() {
		return skipper{}
	}
	sk := skipper{floor: c.Time.Add(-ReorderWindow), budget: make(map[lineKey]int, len(c.recent))}
	for k, v := range c.recent {
		sk.budget[k] = v
	}
	return sk
}

// delivered reports (and counts) a line the resumed cursor already covers.
func (s *skipper) delivered(ts time.Time, text string) bool {
	if s.floor.IsZero() {
		return false
	}
	if ts.Before(s.floor) {
		return true
	}
	k := keyOf(ts, text)
	if s.budget[k] > 0 {
		s.budget[k]--
		return true
	}
	return false
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
	// OnGap is told when a stream resuming from a cursor begins after it (LogGap); nil: nobody.
	OnGap func(LogGap)
}

// LogGap is what a resumed stream showed: the kubelet no longer serves the last line delivered.
// The log API serves only a container's newest log file, so the kubelet rotated that line away
// (or the container restarted), and the lines printed between After and Next that were rotated
// away with it are lost; there may be none. A stream resuming from a cursor always begins with
// a line already delivered while the file holds the cursor's last line: SinceTime reaches back
// before it (sinceTime), and the lines before it in the file were delivered in file order.
type LogGap struct {
	// After is the cursor's time: the last line delivered. Next is the first line's time after it.
	After, Next time.Time
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
// It reads with Follow and Timestamps, from SinceTime = the start of from's reorder window
// rounded down to the second (the API takes RFC 3339 without fractions), and drops what the
// cursor says was delivered. When a stream ends (container exit, kubelet idle timeout, a
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
	d.onGap = opts.OnGap
	read := func(follow bool) error { return d.read(ctx, cs, ns, pod, container, follow, emit) }

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

// ReadLogs reads a terminated container's log from the cursor once, without following, and
// returns the cursor after the last line. The run-watcher uses it for the tail of a run whose
// end it learnt from the pod's status: one request, instead of waiting up to a second for the
// kubelet to end the follow stream. onGap, if not nil, is told of a gap (FollowOptions.OnGap).
func ReadLogs(ctx context.Context, cs kubernetes.Interface, ns, pod, container string, from Cursor, emit func(Line) error, onGap func(LogGap)) (Cursor, error) {
	d := newLogDecoder(from, DefaultMaxLineBytes)
	d.onGap = onGap
	err := d.read(ctx, cs, ns, pod, container, false, emit)
	if emitErr := (*emitError)(nil); errors.As(err, &emitErr) {
		return d.cur, emitErr.err
	}
	if err != nil {
		return d.cur, fmt.Errorf("reading logs of %s/%s[%s]: %w", ns, pod, container, err)
	}
	return d.cur, nil
}

// read requests the log from the decoder's cursor and decodes it.
func (d *logDecoder) read(ctx context.Context, cs kubernetes.Interface, ns, pod, container string, follow bool, emit func(Line) error) error {
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

// sinceTime is the SinceTime of a request resuming at c: the start of the reorder window,
// rounded down to the second because the API is second-granular.
func sinceTime(c Cursor) *metav1.Time {
	if c.Time.IsZero() {
		return nil
	}
	t := metav1.NewTime(c.Time.Add(-ReorderWindow).Truncate(time.Second))
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

// findContainerStatus returns the status of the named container (regular, then init), or nil.
func findContainerStatus(pod *corev1.Pod, name string) *corev1.ContainerStatus {
	for _, statuses := range [][]corev1.ContainerStatus{pod.Status.ContainerStatuses, pod.Status.InitContainerStatuses} {
		for i := range statuses {
			if statuses[i].Name == name {
				return &statuses[i]
			}
		}
	}
	return nil
}

// emitError marks an error returned by the caller's emit so FollowLogs returns it unchanged.
type emitError struct{ err error }

func (e *emitError) Error() string { return e.err.Error() }
func (e *emitError) Unwrap() error { return e.err }

// logDecoder turns kubelet log streams ("<RFC3339Nano> <text>\n" per line) into Lines and keeps
// the cursor. One decoder spans every stream of one FollowLogs call.
type logDecoder struct {
	cur     Cursor
	maxLine int
	// readSize is the read buffer's size. The pieces of a long line go out as the buffer fills,
	// so a stream can break after part of a line was delivered. What is delivered does not
	// depend on the size; the fuzz tests make it small to reach that case with small inputs.
	readSize  int
	delivered int
	buf       []byte
	// onGap is told when a stream resuming from a non-zero cursor begins after it.
	onGap func(LogGap)
}

func newLogDecoder(from Cursor, maxLine int) *logDecoder {
	return &logDecoder{cur: from.Clone(), maxLine: maxLine, readSize: 64 << 10}
}

// decode reads one stream that starts at or before d.cur's second and emits each line the cursor
// has not covered yet. It returns nil at EOF, the read error otherwise, or an *emitError.
//
// An unterminated last line is emitted only when final is set; otherwise it is left for the
// next stream, which sends it again, whole. A line longer than d.maxLine is emitted in pieces as
// it arrives (memory stays bounded); the cut points depend on the line's bytes only, so a replayed
// line yields the same pieces and the cursor's count skips the ones already delivered.
func (d *logDecoder) decode(r io.Reader, final bool, emit func(Line) error) error {
	br := bufio.NewReaderSize(r, d.readSize)
	st := decodeState{lastTime: d.cur.Time, skip: d.cur.skipper(), resumed: !d.cur.Time.IsZero()}
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
	// skip knows which lines of this stream were delivered before it started.
	skip skipper
	// lastTime is what a line without a timestamp inherits: the previous line's.
	lastTime time.Time
	// inLine is set once the current line's timestamp is parsed and some of it emitted.
	inLine bool
	raw    string
	ts     time.Time
	// resumed: the stream started from a non-zero cursor, and its first piece is not looked at
	// yet (LogGap).
	resumed bool
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

// deliver emits one piece unless the cursor says it was delivered already. The first piece of a
// resumed stream that was not delivered before is a LogGap.
func (d *logDecoder) deliver(st *decodeState, text string, emit func(Line) error) error {
	replayed := st.skip.delivered(st.ts, text)
	if st.resumed {
		st.resumed = false
		if !replayed && d.onGap != nil {
			d.onGap(LogGap{After: d.cur.Time, Next: st.ts})
		}
	}
	if replayed {
		return nil
	}
	// The cursor moves only past lines emit accepted, so resuming after an emit error retries
	// the line that failed.
	line := Line{Time: st.ts, TimeRaw: st.raw, Text: text}
	if err := emit(line); err != nil {
		return &emitError{err: err}
	}
	d.cur.Add(line)
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
