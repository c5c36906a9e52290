package execsvc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
	"github.com/kubeclip/kubeclip/pkg/streamjson"
)

// Recording defaults; RecordLimits documents each.
const (
	DefaultMaxRecordedLine = 1 << 20
	DefaultFlushBytes      = 16 << 10
	DefaultFlushAfter      = 100 * time.Millisecond
	DefaultExecBudget      = 64 << 20
)

// eventOverhead is what the exec budget counts per event besides its text: subject, headers
// (message id, CloudEvents), the JSON fields and the store's per-message record; a one-byte
// event grows the stream by about 910 bytes with short ids (TestInterleavedOutputPaysWhatItStores),
// so output that defeats coalescing (stdout and stderr in turn, one byte each, every switch an
// event) uses up the exec budget as it stores. The run's and company's budgets are charged
// each event's exact size instead (events.StoredBytes, TestDribbledOutputIsChargedWhatItStores).
const eventOverhead = 1 << 10

// eventCost is what an event of n bytes of output is charged.
func eventCost(n int) int64 { return int64(n) + eventOverhead }

// lineKeep is the largest stdout line buffer the recorder keeps between lines: a longer line's
// buffer is dropped once the line ends, so one long line does not hold its memory for the
// rest of the session.
const lineKeep = 64 << 10

// RecordLimits bound what a recorded exec costs the exec-worker and the run stream.
type RecordLimits struct {
	// MaxLine bounds the stdout line the agent-result parser is fed (default 1 MiB): a longer
	// line is skipped, never buffered past the bound. A stream-json line holds a whole tool
	// result; decoding one costs about ten times its size, so the bound is what keeps a session
	// to a few MiB.
	MaxLine int
	// FlushBytes and FlushAfter coalesce output into events (default 16 KiB, 100 ms): an
	// event is published when FlushBytes are pending or FlushAfter after the first pending
	// byte, whichever comes first. An event costs about 700 bytes of headers and JSON in the
	// stream; a byte-at-a-time command made one per byte before.
	FlushBytes int
	FlushAfter time.Duration
	// ExecBytes is the most output one exec records (default 64 MiB, the plugin's own cap on
	// what it keeps of an execute): past it, recording stops with a `recordingStopped` event.
	ExecBytes int64
	// RunBytes, CompanyBytes and CompanyWindow are the run's and the company's budgets of
	// recorded output, across replicas (events.BudgetOptions; defaults 256 MiB a run and, a
	// company, its share of the run stream: events.Options.CompanyBudget).
	RunBytes      int64
	CompanyBytes  int64
	CompanyWindow time.Duration
}

func (l RecordLimits) withDefaults() RecordLimits {
	if l.MaxLine <= 0 {
		l.MaxLine = DefaultMaxRecordedLine
	}
	if l.FlushBytes <= 0 {
		l.FlushBytes = DefaultFlushBytes
	}
	if l.FlushAfter <= 0 {
		l.FlushAfter = DefaultFlushAfter
	}
	if l.ExecBytes <= 0 {
		l.ExecBytes = DefaultExecBudget
	}
	return l
}

// eventPublisher publishes run events; *events.Publisher is the real one.
type eventPublisher interface {
	Publish(ctx context.Context, ev events.Event, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}

var _ eventPublisher = (*events.Publisher)(nil)

// budgetCharger charges recorded bytes to the run's and the company's budgets;
// *events.Budgets is the real one.
type budgetCharger interface {
	Charge(ctx context.Context, ref events.RunRef, n int64) error
}

var _ budgetCharger = (*events.Budgets)(nil)

// BudgetObserver is told when a budget stops a recording (the exec-worker's metrics implement
// it); an Observer that does not implement it is not told.
type BudgetObserver interface {
	BudgetExceeded(source string, kind events.BudgetKind)
}

// StoreObserver is told every write to a shared bucket (KUBECLIP_EXECS, KUBECLIP_BUDGETS) that
// failed and was let through (events.StoreFailures); the exec-worker's metrics implement it.
type StoreObserver interface {
	StoreWriteFailed(bucket string)
}

// storeFailures reports the failed writes to bucket: logged once an outage, counted when
// observer is a StoreObserver.
func storeFailures(log zerolog.Logger, bucket string, observer Observer) *events.StoreFailures {
	var count func(string)
	if o, ok := observer.(StoreObserver); ok {
		count = o.StoreWriteFailed
	}
	return events.NewStoreFailures(log, bucket, count)
}

// openBudgets opens KUBECLIP_BUDGETS and returns the recorded execs' budgets. A charge the
// bucket cannot count is admitted (events.Budgets.Charge): a full bucket no longer stops every
// company's recordings. The run-watcher drops a run's counters when the run ends.
func openBudgets(ctx context.Context, js jetstream.JetStream, replicas int, storeBytes int64, limits RecordLimits, observer Observer, log zerolog.Logger) (*events.Budgets, error) {
	kv, err := events.EnsureBucket(ctx, js, events.BudgetBucketConfig(replicas, 0, storeBytes))
	if err != nil {
		return nil, fmt.Errorf("opening KV bucket %s: %w", events.BudgetBucket, err)
	}
	opts := events.BudgetOptions{
		KV: kv, Source: budgetSource, RunBytes: limits.RunBytes, CompanyBytes: limits.CompanyBytes, Window: limits.CompanyWindow,
		StoreFailures: storeFailures(log, events.BudgetBucket, observer),
	}
	if o, ok := observer.(BudgetObserver); ok {
		opts.OnExceeded = func(kind events.BudgetKind) { o.BudgetExceeded(budgetSource, kind) }
	}
	return events.NewBudgets(opts)
}

// execBudgetHook tells observer, when it is a BudgetObserver, that the exec budget stopped a
// recording.
func execBudgetHook(observer Observer) func() {
	if o, ok := observer.(BudgetObserver); ok {
		return func() { o.BudgetExceeded(budgetSource, events.BudgetExec) }
	}
	return nil
}

// budgetSource names recorded execs' counters in KUBECLIP_BUDGETS and the metric.
const budgetSource = events.BudgetSourceExec

// errRecordingTakenOver ends a session whose recording another session (a takeover) continues.
var errRecordingTakenOver = errors.New("another session records the exec now")

// recordingDeps is what a recording needs from its session.
type recordingDeps struct {
	events   eventPublisher
	subjects events.Subjects // the events' prefix, for what they store (events.StoredBytes)
	budgets  budgetCharger   // nil: no run or company budget
	progress recordedExecs
	limits   RecordLimits
	onRetry  func(error)
	// onExecBudget is told when the exec budget stops a recording (the run's and company's
	// budgets tell their own OnExceeded); nil means nobody.
	onExecBudget func()
	// lineMem is charged the stdout line's buffer as it grows (the session's, limits.go); nil:
	// not charged.
	lineMem lineBudget
	// onStop is told, once a recording, which budget stopped it (the session tells its
	// client and logs it); nil means nobody.
	onStop func(*events.BudgetExceededError)
}

// lineBudget is what a line buffer's growth is taken from: a line that cannot grow is skipped,
// never waited for (the session holds a frame meanwhile).
type lineBudget interface {
	tryTake(n int64) bool
	release(n int64)
}

// recording publishes a recorded exec's `exec` events from its journal, read from seq 1 without
// gaps. Chunks of one stream are coalesced into one event (RecordLimits); an event carries the
// last journal seq it holds, so its message id stays <…>.exec.<execId>.<seq>.
//
// Exactly once across replicas: before an event is published, the seqs it covers are written
// to the exec's RecordedBucket entry (compare-and-set on the entry's revision). A session that
// takes the stream over reads the journal from seq 1 again, rebuilding the parser and the
// budget, republishes the one event the entry names (the stream drops it if it was stored) and
// carries on from there. A session whose write finds a newer revision stops recording: the
// newer session records. Output a client was sent may reach the run stream up to FlushAfter
// later; recording no longer holds the client back.
type recording struct {
	deps    recordingDeps
	ref     events.RunRef
	execID  string
	command string

	mu       sync.Mutex
	progress recordedExec // the last event published or being published
	rev      uint64       // progress's revision
	err      error        // what a timed flush failed with, returned by the next call
	execUsed int64        // what this exec's events cost before the pending ones (eventCost each)

	pending  []byte
	pendSt   sandboxd.Stream
	pendFrom uint64 // first seq pending, 0: nothing pending
	pendTo   uint64
	timer    *time.Timer
	gen      uint64 // bumped at every flush: a timer armed for an older batch does nothing

	carry [3][]byte // per stream: the start of a character split by an event's end
	lines lineParser
}

// startRecording starts from the exec's progress entry: what a previous session of it recorded.
// noted is the entry as the session's request wrote or read it (the start's put, the attach's
// get), taken as it is: every newer write moves the revision, so the recording's first write
// finds out (errRecordingTakenOver) whether another session recorded since, as it would after
// a read here, and the recorded round trip pays one NATS round trip less. Without it the entry
// is read. An exec without an entry is one whose recording is complete (its final event stored
// and its entry dropped since its attach looked): nil, nothing to record. Unless its start could
// not write the entry (unnoted: the start went on without it, Service.start): then the
// recording starts from nothing and writes the entry with its first event.
func startRecording(ctx context.Context, deps recordingDeps, ref events.RunRef, execID string, noted *notedExec, unnoted recordedExec) (*recording, error) {
	deps.limits = deps.limits.withDefaults()
	if noted != nil {
		return newRecording(deps, ref, execID, noted.entry, noted.rev), nil
	}
	rec, rev, ok, err := deps.progress.get(ctx, ref, execID)
	if err != nil {
		return nil, err
	}
	if !ok && unnoted.Command == "" {
		return nil, nil
	}
	if !ok {
		rec = unnoted
	}
	return newRecording(deps, ref, execID, rec, rev), nil
}

func newRecording(deps recordingDeps, ref events.RunRef, execID string, rec recordedExec, rev uint64) *recording {
	return &recording{
		deps: deps, ref: ref, execID: execID, command: rec.Command, progress: rec, rev: rev, execUsed: rec.Used,
		lines: lineParser{max: deps.limits.MaxLine, mem: deps.lineMem},
	}
}

// chunk records c: fed to the agent-result parser, then held, coalesced or published.
func (r *recording) chunk(ctx context.Context, c *sandboxd.Chunk) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	if c.Stream == sandboxd.Stdout {
		r.lines.feed(c.Data)
	}
	p := r.progress
	switch {
	case p.Stopped != "" && c.Seq > p.From:
		return nil // recording stopped at a budget; the parser still reads on
	case c.Seq < p.From:
		// Stored by an earlier event: only a character split at its end matters.
		r.text(c.Stream, c.Data)
		return nil
	case p.Stopped != "" && c.Seq == p.From:
		return r.publishStop(ctx, c, events.BudgetKind(p.Stopped), false)
	case c.Seq <= p.To:
		// The event a previous session announced: rebuilt exactly, published again.
		r.hold(c)
		if c.Seq == p.To {
			return r.flush(ctx, false)
		}
		return nil
	}
	if r.pendFrom != 0 && r.pendSt != c.Stream {
		if err := r.flush(ctx, true); err != nil {
			return err
		}
	}
	if r.execUsed+eventCost(len(r.pending)+len(c.Data)) > r.deps.limits.ExecBytes {
		if err := r.flush(ctx, true); err != nil {
			return err
		}
		if r.deps.onExecBudget != nil {
			r.deps.onExecBudget()
		}
		return r.stopAt(ctx, c, &events.BudgetExceededError{Kind: events.BudgetExec, Limit: r.deps.limits.ExecBytes, Source: budgetSource, Company: r.ref.CompanyID})
	}
	r.hold(c)
	if len(r.pending) >= r.deps.limits.FlushBytes {
		return r.flush(ctx, true)
	}
	if r.timer == nil {
		gen := r.gen
		r.timer = time.AfterFunc(r.deps.limits.FlushAfter, func() { r.flushTimed(ctx, gen) })
	}
	return nil
}

func (r *recording) hold(c *sandboxd.Chunk) {
	if r.pendFrom == 0 {
		r.pendFrom, r.pendSt = c.Seq, c.Stream
	}
	r.pendTo = c.Seq
	r.pending = append(r.pending, c.Data...)
}

// flushTimed publishes the batch gen, FlushAfter after its first byte, unless it went already.
func (r *recording) flushTimed(ctx context.Context, gen uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.gen != gen || r.err != nil || r.pendFrom == 0 {
		return
	}
	r.err = r.flush(ctx, true)
}

// flush publishes what is pending as one event. live: the event is new (its bytes are charged
// and announced in the progress entry); otherwise it is the one the entry names.
func (r *recording) flush(ctx context.Context, live bool) error {
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	r.gen++
	if r.pendFrom == 0 {
		return nil
	}
	from, to, st, data := r.pendFrom, r.pendTo, r.pendSt, r.pending
	stream := events.ExecStdout
	if st == sandboxd.Stderr {
		stream = events.ExecStderr
	}
	ev := events.RunExecEvent{
		RunID: r.ref.RunID, CompanyID: r.ref.CompanyID, ExecID: r.execID, Seq: to,
		Command: r.command, Stream: stream, Text: r.text(st, data),
	}
	if live {
		if err := r.chargeAndAnnounce(ctx, ev, recordedExec{Command: r.command, Inbox: r.progress.Inbox, From: from, To: to, Used: r.execUsed}); err != nil {
			var be *events.BudgetExceededError
			if errors.As(err, &be) {
				r.dropPending()
				return r.stopAt(ctx, &sandboxd.Chunk{Seq: from, Stream: st}, be)
			}
			return err
		}
	}
	r.execUsed += eventCost(len(data))
	r.dropPending()
	return r.publish(ctx, ev)
}

// chargeAndAnnounce charges a new event to the run's and company's budgets and writes its seqs
// to the progress entry (announce), the two at once: they are independent writes to two
// buckets, and each NATS round trip in a recorded exec's path costs milliseconds on a machine
// another company's flood leaves no idle CPU (issue 26). A takeover of the entry ends the
// recording whatever the charge said; otherwise a budget the charge finds used up is returned
// (a *events.BudgetExceededError: the caller stops the recording there, and the stop's own
// announce replaces this one).
//
// What the two at once cost: a session that dies between this announce and that stop's leaves
// the entry naming an event the budget refused, and the session that takes over publishes it,
// uncharged: one event (at most FlushBytes of output) past the budget, once per such death.
func (r *recording) chargeAndAnnounce(ctx context.Context, ev events.RunExecEvent, next recordedExec) error {
	var charged error
	var wg sync.WaitGroup
	if r.deps.budgets != nil {
		// The run and company are charged what the event stores, envelope and all: output
		// dribbled a byte at a time pays per event.
		cost, err := events.StoredBytes(r.deps.subjects, ev)
		if err != nil {
			return err
		}
		wg.Go(func() {
			charged = retrying(ctx, r.deps.onRetry, func() error { return r.deps.budgets.Charge(ctx, r.ref, cost) })
		})
	}
	announced := r.announce(ctx, next)
	wg.Wait()
	if announced != nil {
		return announced
	}
	return charged
}

// dropPending empties the batch; a buffer grown past two batches is released.
func (r *recording) dropPending() {
	r.pendFrom, r.pendTo = 0, 0
	r.pending = r.pending[:0]
	if cap(r.pending) > 2*r.deps.limits.FlushBytes {
		r.pending = nil
	}
}

// stopAt stops recording at c, over budget be: the stop event, and the session is told.
func (r *recording) stopAt(ctx context.Context, c *sandboxd.Chunk, be *events.BudgetExceededError) error {
	if err := r.publishStop(ctx, c, be.Kind, true); err != nil {
		return err
	}
	if r.deps.onStop != nil {
		r.deps.onStop(be)
	}
	return nil
}

// publishStop publishes the event that says recording stopped at c, over budget kind; later
// output reaches the client only.
func (r *recording) publishStop(ctx context.Context, c *sandboxd.Chunk, kind events.BudgetKind, live bool) error {
	if live {
		if err := r.announce(ctx, recordedExec{Command: r.command, Inbox: r.progress.Inbox, From: c.Seq, To: c.Seq, Used: r.execUsed, Stopped: string(kind)}); err != nil {
			return err
		}
	}
	stream := events.ExecStdout
	if c.Stream == sandboxd.Stderr {
		stream = events.ExecStderr
	}
	return r.publish(ctx, events.RunExecEvent{
		RunID: r.ref.RunID, CompanyID: r.ref.CompanyID, ExecID: r.execID, Seq: c.Seq,
		Command: r.command, Stream: stream, RecordingStopped: kind,
	})
}

// announce writes the next event's seqs to the progress entry before it is published.
//
// A write the bucket refuses (full, or NATS not answering) does not hold the recording: the
// event is published all the same (fail open) and the next announce writes the entry again, at
// the revision it last took. What that costs is exactly-once across a takeover in between: the
// session that takes over finds the entry behind, republishes the event it names and records
// again from there, so events after it may be stored twice, under other message ids. Holding
// every recording of every company until the bucket takes writes again (a retry loop, before)
// cost more: a full bucket stalled the output of every recorded exec.
func (r *recording) announce(ctx context.Context, next recordedExec) error {
	rev, err := r.deps.progress.advance(ctx, r.ref, r.execID, next, r.rev)
	switch {
	case err == nil:
		r.rev = rev
		r.deps.progress.failures.Wrote()
	case errors.Is(err, errRecordingTakenOver) || ctx.Err() != nil:
		return err
	default:
		r.deps.progress.failures.Failed(err)
	}
	r.progress = next
	return nil
}

// exit publishes what is pending and the final event. The final event is never charged to a
// budget: it carries the agent's result.
func (r *recording) exit(ctx context.Context, e *execspec.Exit) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	if r.progress.Stopped == "" {
		if err := r.flush(ctx, true); err != nil {
			return err
		}
	}
	ev := events.RunExecEvent{
		RunID: r.ref.RunID, CompanyID: r.ref.CompanyID, ExecID: r.execID, Seq: e.LastSeq + 1, Command: r.command,
		Exit: &events.ExecExit{
			ExitCode: e.ExitCode, Signal: e.Signal, TimedOut: e.TimedOut,
			Truncated: e.Truncated || r.progress.Stopped != "",
		},
		RecordingStopped: events.BudgetKind(r.progress.Stopped),
	}
	if r.lines.flushLine() {
		code := 1
		if e.ExitCode != nil {
			code = *e.ExitCode
		}
		ev.Agent = r.lines.parser.ResultWithExitCode(code)
	}
	return r.publish(ctx, ev)
}

// complete drops the entry of a recording whose final event is stored (exit): a takeover from
// here finds no entry and records nothing (startRecording); the final event it would republish
// is stored. The session calls it once the client has its exit, which waits for nothing but
// the final event; the client's close may end the session's context meanwhile, so the drop
// runs on a context of its own. A drop that fails leaves the entry to the bucket's TTL.
func (r *recording) complete(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dropTimeout)
	defer cancel()
	if err := r.deps.progress.drop(ctx, r.ref, r.execID); err != nil {
		r.deps.progress.failures.Failed(err)
	}
}

// stop ends the timer of a recording whose session ends.
func (r *recording) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.timer != nil {
		r.timer.Stop()
		r.timer = nil
	}
	r.gen++
}

func (r *recording) publish(ctx context.Context, ev events.RunExecEvent) error {
	return publishRetrying(ctx, r.deps.events, ev, r.deps.onRetry)
}

// text decodes data as UTF-8 for stream s: the start of a character that data's end splits is
// held back for the stream's next event, whose text begins with it.
func (r *recording) text(s sandboxd.Stream, data []byte) string {
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

// lineParser splits stdout into lines for the agent-result parser. A line over max is skipped:
// its bytes are dropped as they come, so the buffer never grows past max, and a buffer grown
// past lineKeep is released when its line ends.
type lineParser struct {
	max     int
	mem     lineBudget // charged cap(line); nil: nothing
	line    []byte     // stdout since its last newline
	skip    bool       // the current line is over max: not parsed
	parser  streamjson.Parser
	sawJSON bool
}

func (p *lineParser) feed(data []byte) {
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			p.appendLine(data)
			return
		}
		switch {
		case len(p.line) == 0 && !p.skip && i <= p.max:
			p.parseLine(data[:i]) // whole in this chunk: parsed where it is, never copied
		default:
			p.appendLine(data[:i])
			if !p.skip {
				p.parseLine(p.line)
			}
		}
		p.endLine()
		data = data[i+1:]
	}
}

// endLine empties the buffer for the next line; a buffer grown past lineKeep is released, and
// a charged one always (a session waiting for its next line holds none).
func (p *lineParser) endLine() {
	p.line, p.skip = p.line[:0], false
	if cap(p.line) > lineKeep || (p.mem != nil && cap(p.line) > 0) {
		p.drop()
	}
}

// drop releases the line's buffer.
func (p *lineParser) drop() {
	if p.mem != nil {
		p.mem.release(int64(cap(p.line)))
	}
	p.line = nil
}

// flushLine parses the last line, which no newline ended; it reports whether it was JSON.
func (p *lineParser) flushLine() bool {
	if len(p.line) > 0 && !p.skip {
		p.parseLine(p.line)
	}
	p.endLine()
	return p.sawJSON
}

func (p *lineParser) appendLine(b []byte) {
	if p.skip {
		return
	}
	if len(p.line)+len(b) > p.max {
		p.skip = true
		p.drop()
		return
	}
	if need := len(p.line) + len(b); need > cap(p.line) {
		// Doubling, capped at max: a line of max bytes costs at most 2×max in buffers
		// (append's own growth of large slices, 1.25×, costs five times that). A line the
		// budget has no room for is skipped as a long one is.
		size := min(max(2*cap(p.line), need), p.max)
		if p.mem != nil && !p.mem.tryTake(int64(size)) {
			p.skip = true
			p.drop()
			return
		}
		grown := make([]byte, len(p.line), size)
		copy(grown, p.line)
		if p.mem != nil {
			p.mem.release(int64(cap(p.line)))
		}
		p.line = grown
	}
	p.line = append(p.line, b...)
}

// parseCopies is what parsing a line of n bytes allocates, in n: an assistant message's line
// of 1 MiB allocated 5.0 MiB in the stream-json parser (runtime.MemStats.TotalAlloc).
const parseCopies = 5

func (p *lineParser) parseLine(line []byte) {
	// A parse the budget has no room for is skipped: the line is still recorded and sent,
	// only the agent's summary misses it.
	if p.mem != nil {
		cost := int64(len(line)) * parseCopies
		if !p.mem.tryTake(cost) {
			return
		}
		defer p.mem.release(cost)
	}
	if t := bytes.TrimSpace(line); len(t) > 0 && t[0] == '{' && utf8.Valid(t) && json.Valid(t) {
		p.sawJSON = true
	}
	p.parser.Feed(line)
}

// publishRetrying stores ev, retrying until it is stored or ctx ends.
func publishRetrying(ctx context.Context, pub eventPublisher, ev events.Event, onRetry func(error)) error {
	return retrying(ctx, onRetry, func() error {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := pub.Publish(pctx, ev)
		return err
	})
}

// retrying calls try until it succeeds, fails for good (a terminal error, a budget, a
// takeover) or ctx ends.
func retrying(ctx context.Context, onRetry func(error), try func() error) error {
	backoff := 100 * time.Millisecond
	for {
		err := try()
		if err == nil {
			return nil
		}
		var be *events.BudgetExceededError
		if _, terminal := events.AsTerminal(err); terminal || errors.As(err, &be) || errors.Is(err, errRecordingTakenOver) {
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
