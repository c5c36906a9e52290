package runwatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/streamjson"
)

// journal is one run's log as the run stream holds it. It owns the chunks' numbering (seq 1,
// 2, 3, ... without gaps, continued after a takeover), their batching, the fence that keeps a
// second writer out, and the replay of what was published, which positions the container log's
// cursor and feeds the agent parser. The follower adds lines; a timer publishes a partial chunk
// once its first line has waited the flush interval, and retries chunks whose publish failed;
// the tracker flushes before it publishes the run's result.
//
// It is given what it needs when it is made (the publisher, the run stream, the clock) and a
// context with every call that may publish; it knows nothing of the tracker.
type journal struct {
	ref      events.RunRef
	subjects events.Subjects
	pub      publisher
	stream   runStream
	now      func() time.Time
	interval time.Duration
	log      zerolog.Logger

	mu  sync.Mutex
	seq *sequence
	// lastStreamSeq is the stream sequence of the run's last log event. Every publish expects
	// it, so a second writer of the same run's log (a replica that lost the run without
	// noticing) is refused by the stream instead of interleaving its chunks.
	lastStreamSeq uint64
	stopped       bool
	cur           k8s.Cursor
	batcher       *LogBatcher
	// outbox holds sealed chunks not yet published, in seq order. Their seq numbers are taken,
	// so they are retried (idempotently, by message id) before anything newer goes out.
	outbox []events.RunLogEvent
	timer  *time.Timer
	// failures counts the publishes that failed in a row (0: the last one went out): the
	// timer's retry backoff, and one log line per outage rather than one per attempt.
	failures     uint64
	failingSince time.Time
	parser       streamjson.Parser
	// feedPiece and rememberPiece hold the pieces of a split line until its last piece, which
	// may come in a later chunk.
	feedPiece, rememberPiece []byte
	budgets                  budgetCharger // nil: the log has no budget
	// charged is the last seq charged to the budgets: an outbox chunk retried is not charged
	// again. stoppedBy is the budget that stopped the log: later chunks are fed to the parser
	// and dropped.
	charged   uint64
	stoppedBy events.BudgetKind
}

// budgetCharger charges a run's log to its run's and company's budgets; *events.Budgets is the
// real one (source "log").
type budgetCharger interface {
	Charge(ctx context.Context, ref events.RunRef, n int64) error
}

var _ budgetCharger = (*events.Budgets)(nil)

// journalOptions are what a journal is made with.
type journalOptions struct {
	subjects events.Subjects
	pub      publisher
	stream   runStream
	now      func() time.Time
	// interval is the longest a line waits before its chunk is published (Options.FlushInterval).
	interval time.Duration
	budgets  budgetCharger
	// log is the run's logger, its fields naming the run: the tracker's, so a run holds one
	// (a logger's fields take 500 bytes).
	log zerolog.Logger
}

// maxOutbox bounds the chunks kept while NATS is unreachable; past it the follower stops and
// resumes from its cursor later.
const maxOutbox = 64

var errOutboxFull = errors.New("log chunks are not being published")

// A chunk whose publish failed (NATS unreachable, the run stream without a leader) waits in the
// outbox and the flush timer retries it, publishRetryBase after the first failure, doubling up
// to publishRetryLimit. Retried only when the next line came, a quiet agent's lines waited for
// the run's end: 41.8 to 43.1 s after writes resumed in issue 16's cluster run. The limit is how
// long a line may wait after writes resume (plus one publish); a run-watcher's every run with
// lines waiting sends at most one publish per limit during an outage.
const (
	publishRetryBase  = 100 * time.Millisecond
	publishRetryLimit = 2 * time.Second
)

// newJournal is the journal of a run with nothing published yet.
func newJournal(ref events.RunRef, o journalOptions) *journal {
	return &journal{
		ref: ref, subjects: o.subjects, pub: o.pub, stream: o.stream, now: o.now, interval: o.interval,
		log: o.log,
		seq: newSequence(0), budgets: o.budgets,
	}
}

// loadJournal is the journal of a run as the stream holds it: it continues after the run's last
// published chunk, with the whole published log replayed. A last message that is not kubeclip's
// leaves the numbering where a new journal starts but is what the fence expects.
func loadJournal(ctx context.Context, ref events.RunRef, o journalOptions) (*journal, error) {
	j := newJournal(ref, o)
	last, err := events.LastRunEvent[events.RunLogEvent](ctx, o.stream, o.subjects, ref)
	if err != nil {
		return nil, fmt.Errorf("reading the last published log chunk: %w", err)
	}
	if !last.Ours {
		j.lastStreamSeq = last.Seq
		return j, nil
	}
	if err := j.resume(ctx, last.Event, last.Seq); err != nil {
		return nil, err
	}
	return j, nil
}

// lastSeq is the seq of the last chunk numbered (published or waiting in the outbox).
func (j *journal) lastSeq() uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.seq.lastIssued()
}

// setPod starts batching for the pod's container; lines of a previous pod were flushed.
func (j *journal) setPod(pod, container string) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	b, err := NewLogBatcher(LogBatcherOptions{
		RunID: j.ref.RunID, CompanyID: j.ref.CompanyID, Pod: pod, Container: container,
		Now: j.now, seq: j.seq,
	})
	if err != nil {
		return err
	}
	j.batcher = b
	return nil
}

// cursor is where the container log resumes: after the last line in a chunk.
func (j *journal) cursor() k8s.Cursor {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.cur.Clone()
}

// resume continues after the last published chunk: the next seq follows it, and the run's
// whole published log is replayed into the cursor and the agent parser.
func (j *journal) resume(ctx context.Context, last events.RunLogEvent, streamSeq uint64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.seq = newSequence(last.Seq)
	j.lastStreamSeq = streamSeq
	j.charged, j.stoppedBy = last.Seq, last.LogStopped
	return j.replay(ctx, last.Seq)
}

// replay feeds every line already published for the run, up to seq last, to the cursor and the
// parser.
func (j *journal) replay(ctx context.Context, last uint64) error {
	subj, err := j.subjects.Run(j.ref.CompanyID, j.ref.RunID, events.KindLog)
	if err != nil {
		return err
	}
	cons, err := j.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
	if err != nil {
		return fmt.Errorf("replaying the published log: %w", err)
	}
	for {
		// Chunk last is in the stream (loadJournal read it), so the replay goes on until it has
		// it: a pull that comes back empty before that (one did once in 10,000 resumes on a
		// loaded server) is an error, which the step retries, never the end of the log. Ending
		// there left the cursor short, and the follower published the run's lines again
		// (issue 16, bench-scale, 10,000 Job leases). A no-wait pull, not a waiting one: the
		// replay stops at last, mid-batch, and a waiting pull would outlive it.
		batch, err := cons.FetchNoWait(256)
		if err != nil {
			return fmt.Errorf("replaying the published log: %w", err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			ev, ours, err := events.DecodeStored[events.RunLogEvent](j.subjects, msg.Subject(), msg.Headers(), msg.Data())
			if err != nil {
				return fmt.Errorf("replaying the published log: %w", err)
			}
			if !ours {
				continue
			}
			j.feed(ev.Lines)
			if err := j.remember(ev.Lines); err != nil {
				return err
			}
			if ev.Seq >= last {
				return nil
			}
		}
		if err := batch.Error(); err != nil {
			return fmt.Errorf("replaying the published log: %w", err)
		}
		if n == 0 {
			return fmt.Errorf("replaying the published log: the stream delivered nothing before chunk %d", last)
		}
	}
}

// remember adds published lines to the cursor, joining the pieces the batcher split a line
// into, so the cursor sees the lines as the container log has them.
func (j *journal) remember(lines []events.LogLine) error {
	for _, line := range lines {
		j.rememberPiece = append(j.rememberPiece, line.Text...)
		if line.Partial {
			continue // the rest of the line is in this chunk or the next
		}
		ts, err := time.Parse(time.RFC3339Nano, line.TS)
		if err != nil {
			return fmt.Errorf("parsing the timestamp of a published line: %w", err)
		}
		j.cur.Add(k8s.Line{Time: ts, TimeRaw: line.TS, Text: string(j.rememberPiece)})
		j.rememberPiece = j.rememberPiece[:0]
	}
	return nil
}

// feed hands complete lines to the agent parser, joining the pieces of a split line, which may
// span chunks.
func (j *journal) feed(lines []events.LogLine) {
	for _, line := range lines {
		if line.Partial {
			j.feedPiece = append(j.feedPiece, line.Text...)
			continue
		}
		if len(j.feedPiece) > 0 {
			j.parser.Feed(append(j.feedPiece, line.Text...))
			j.feedPiece = j.feedPiece[:0]
			continue
		}
		j.parser.Feed([]byte(line.Text))
	}
}

// add takes a line from the follower. Full chunks go out at once; a partial one when the flush
// timer fires, published with ctx (the run's, which outlives any one follow stream). A line is
// delivered (the cursor moves past it) once it is in a chunk.
func (j *journal) add(ctx context.Context, line k8s.Line) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.stopped {
		return errFenced
	}
	if len(j.outbox) >= maxOutbox {
		if err := j.publishOutboxLocked(ctx); err != nil {
			return fmt.Errorf("%w: %w", errOutboxFull, err)
		}
	}
	ts := line.TimeRaw
	if ts == "" {
		ts = line.Time.UTC().Format(time.RFC3339Nano)
	}
	j.outbox = append(j.outbox, j.batcher.Add(events.LogLine{TS: ts, Text: line.Text})...)
	j.cur.Add(line)
	if len(j.outbox) > 0 {
		// A failure here leaves the chunks in the outbox for the timer's retry, except a
		// fenced one, which ends this follower.
		if err := j.attemptLocked(ctx, j.publishOutboxLocked); errors.Is(err, errFenced) {
			return err
		}
	}
	if j.batcher.Pending() > 0 {
		j.armLocked(ctx, j.interval)
	}
	return nil
}

// armLocked has the timer publish what waits after d, with ctx (the run's), unless it is armed
// already.
func (j *journal) armLocked(ctx context.Context, d time.Duration) {
	if j.timer != nil || j.stopped {
		return
	}
	j.timer = time.AfterFunc(d, func() {
		j.mu.Lock()
		defer j.mu.Unlock()
		j.timer = nil
		_ = j.attemptLocked(ctx, j.flushLocked)
	})
}

// attemptLocked runs publish (flushLocked or publishOutboxLocked) and, when it fails while
// chunks wait, has the timer retry with backoff: the next line may never come. It is not
// retried once fenced (another replica owns the log) or once ctx ended (the run is over here).
// The first failure of an outage and the end of it are logged, not every attempt.
func (j *journal) attemptLocked(ctx context.Context, publish func(context.Context) error) error {
	err := publish(ctx)
	switch {
	case err == nil:
		if j.failures > 0 {
			j.log.Info().Uint64(events.LogKeyAttempt, j.failures+1).Dur("waited", j.now().Sub(j.failingSince)).
				Msg("publishing the run's log resumed")
		}
		j.failures = 0
	case errors.Is(err, errFenced) || ctx.Err() != nil:
	default:
		if j.failures == 0 {
			j.failingSince = j.now()
			j.log.Warn().Err(err).Int("chunks", len(j.outbox)).Msg("publishing the run's log failed; retrying")
		}
		j.failures++
		j.armLocked(ctx, retryBackoff(j.failures))
	}
	return err
}

// retryBackoff is the wait before the retry that follows the n-th failed publish in a row.
func retryBackoff(n uint64) time.Duration {
	d := publishRetryBase
	for i := uint64(1); i < n && d < publishRetryLimit; i++ {
		d *= 2
	}
	return min(d, publishRetryLimit)
}

// flush publishes everything pending.
func (j *journal) flush(ctx context.Context) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.timer != nil {
		j.timer.Stop()
		j.timer = nil
	}
	return j.attemptLocked(ctx, j.flushLocked)
}

// stop ends the flush timer; nothing is published after it.
func (j *journal) stop() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.stopped = true
	if j.timer != nil {
		j.timer.Stop()
		j.timer = nil
	}
}

func (j *journal) flushLocked(ctx context.Context) error {
	if j.stopped {
		return errFenced
	}
	if j.batcher != nil {
		if ev, ok := j.batcher.Flush(); ok {
			j.outbox = append(j.outbox, ev)
		}
	}
	return j.publishOutboxLocked(ctx)
}

func (j *journal) publishOutboxLocked(ctx context.Context) error {
	for len(j.outbox) > 0 {
		ev := j.outbox[0]
		if j.stoppedBy != "" {
			j.feed(ev.Lines)
			j.outbox = j.outbox[1:]
			continue
		}
		stopped, err := j.charge(ctx, ev)
		if err != nil {
			return err
		}
		lines := ev.Lines
		if stopped != "" {
			ev.Lines, ev.LogStopped = []events.LogLine{}, stopped
		}
		ack, err := j.pub.Publish(ctx, ev, jetstream.WithExpectLastSequencePerSubject(j.lastStreamSeq))
		if isWrongLastSequence(err) {
			return fmt.Errorf("publishing log chunk %d: %w", ev.Seq, errFenced)
		}
		if err != nil {
			return err
		}
		if ack.Duplicate {
			// The stream already had this seq: our own retry (same lines) or another
			// replica's chunk (different lines), which means we no longer own the log.
			same, err := j.storedMatches(ctx, ack.Sequence, ev)
			if err != nil {
				return err
			}
			if !same {
				return fmt.Errorf("log chunk %d was written by another replica: %w", ev.Seq, errFenced)
			}
		}
		j.lastStreamSeq = ack.Sequence
		j.feed(lines)
		j.outbox = j.outbox[1:]
		j.stoppedBy = ev.LogStopped
	}
	j.outbox = nil
	return nil
}

// charge counts a chunk's first publish against the run's and company's log budgets; stopped
// names the budget it does not fit.
func (j *journal) charge(ctx context.Context, ev events.RunLogEvent) (stopped events.BudgetKind, err error) {
	if j.budgets == nil || ev.Seq <= j.charged {
		return "", nil
	}
	// What the chunk stores, envelope and all (about 900 bytes, more with long ids), as
	// execsvc charges a recorded exec's events: a log dribbled a line per flush pays per event.
	n, err := events.StoredBytes(j.subjects, ev)
	if err != nil {
		return "", fmt.Errorf("sizing log chunk %d: %w", ev.Seq, err)
	}
	err = j.budgets.Charge(ctx, j.ref, n)
	var be *events.BudgetExceededError
	if errors.As(err, &be) {
		return be.Kind, nil
	}
	if err != nil {
		return "", fmt.Errorf("charging log chunk %d: %w", ev.Seq, err)
	}
	j.charged = ev.Seq
	return "", nil
}

// storedMatches reports whether the stream's message at seq carries ev's lines.
func (j *journal) storedMatches(ctx context.Context, seq uint64, ev events.RunLogEvent) (bool, error) {
	got, err := events.RunEventAt[events.RunLogEvent](ctx, j.stream, j.subjects, seq)
	if err != nil {
		return false, fmt.Errorf("reading back log chunk %d: %w", ev.Seq, err)
	}
	if !got.Ours {
		return false, nil
	}
	stored := got.Event
	if stored.Seq != ev.Seq || len(stored.Lines) != len(ev.Lines) {
		return false, nil
	}
	for i := range ev.Lines {
		if stored.Lines[i] != ev.Lines[i] {
			return false, nil
		}
	}
	return true, nil
}

// agentResult is what the agent's stream-json log says about the run, judged with the
// agent's exit code: a non-zero exit makes it an error whatever the stream's last word.
func (j *journal) agentResult(exitCode int) *events.AgentResult {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.parser.ResultWithExitCode(exitCode)
}
