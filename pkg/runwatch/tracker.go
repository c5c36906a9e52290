package runwatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/runwatch/verdict"
	"github.com/kubeclip/kubeclip/pkg/streamjson"
)

// tracker follows one run: it publishes the run's status changes, runs its log follower and
// publishes its result once the run is over and its last log line is out.
//
// Its state starts from what the run stream already holds, so a watcher that restarts (or takes
// over) resumes the log after the last published chunk and never publishes a second result.
type tracker struct {
	w         *Watcher
	stream    jetstream.Stream
	namespace string
	ref       events.RunRef
	companyID string
	runID     string
	log       zerolog.Logger

	wakeCh chan struct{}
	// ownerEvents counts changes of the run's ownership key seen by the watcher; a replica
	// that lost the race for the run waits until it moves before claiming again.
	ownerEvents atomic.Uint64

	// Owned by the run goroutine.
	backend    policy.Backend // the lease's, once ours
	blocked    bool           // another replica owns the run
	blockedAt  uint64         // ownerEvents when the claim was lost
	ours       bool           // the run has a lease in this installation's KUBECLIP_LEASES
	loaded     bool
	done       bool
	seenJob    bool
	lastPhase  events.Phase
	lastReason string
	// lastStatusSeq is the stream sequence of the run's last status event, which every status
	// publish expects (0: none yet).
	lastStatusSeq uint64
	follow        *follower
	end           *verdict.End // the run is over
	recheck       *time.Timer

	// Shared with the follower.
	logs *logState
}

func newTracker(w *Watcher, stream jetstream.Stream, namespace string, ref events.RunRef) *tracker {
	return &tracker{
		w:         w,
		stream:    stream,
		namespace: namespace,
		ref:       ref,
		companyID: ref.CompanyID,
		runID:     ref.RunID,
		log:       w.log.With().Str(events.LogKeyRunID, ref.RunID).Str(events.LogKeyTenant, ref.CompanyID).Logger(),
		wakeCh:    make(chan struct{}, 1),
		// The created event already says Pending: a status event starts with the first change.
		lastPhase: events.PhasePending,
	}
}

// poke asks the run goroutine to look at the run again; it never blocks.
func (t *tracker) poke() {
	select {
	case t.wakeCh <- struct{}{}:
	default:
	}
}

func (t *tracker) run(ctx context.Context) {
	inFlightEnded := t.w.runStarted()
	defer inFlightEnded()
	defer func() {
		if t.recheck != nil {
			t.recheck.Stop()
		}
		if t.follow != nil {
			t.follow.stopAndWait()
		}
	}()
	backoff := 100 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.wakeCh:
		}
		err := t.step(ctx)
		switch {
		case err == nil:
			backoff = 100 * time.Millisecond
		case ctx.Err() != nil:
			return
		default:
			// Publishing failed (NATS unreachable) or the stream could not be read: try again
			// with a growing pause; the Kubernetes state is still in the informer cache.
			t.log.Warn().Err(err).Dur("retry_in", backoff).Msg("tracking run failed; retrying")
			time.AfterFunc(backoff, t.poke)
			backoff = min(2*backoff, 5*time.Second)
		}
		if t.done {
			inFlightEnded()
			job, pod := t.w.objects(t.ref, t.namespace)
			if job == nil && pod == nil {
				t.w.forget(t.ref)
				return
			}
		}
	}
}

// ownerChanged is called by the watcher when the run's ownership key changed (expired, was
// released): the run may be free to take.
func (t *tracker) ownerChanged() {
	t.ownerEvents.Add(1)
	t.poke()
}

// own makes sure this replica owns the run before it acts on it. It returns false when another
// replica owns it, or when the run already has its result.
func (t *tracker) own(ctx context.Context) (bool, error) {
	owners := t.w.owners
	if owners.owns(t.ref) {
		return true, nil
	}
	if t.loaded {
		t.reset("ownership of the run was lost")
	}
	gen := t.ownerEvents.Load()
	if t.blocked && gen == t.blockedAt {
		return false, nil // nothing changed since another replica won it
	}
	if !t.ours {
		// Another kubeclip installation (its own NATS) may share the cluster: only the runs
		// leased here are this watcher's. The lease record exists before the workload does,
		// and names the namespace it went into: objects claiming the run elsewhere are not it.
		rec, _, err := t.w.leases.Get(ctx, t.ref)
		if errors.Is(err, lease.ErrNotFound) {
			t.log.Debug().Msg("run has no lease here; another installation's, ignored")
			t.done = true
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if rec.Namespace != "" {
			// Objects labelled with the run elsewhere are not it (objects filters by namespace).
			t.namespace = rec.Namespace
		}
		t.backend = policy.Backend(rec.Backend)
		t.ours = true
	}
	finished, err := t.resultPublished(ctx)
	if err != nil {
		return false, err
	}
	if finished {
		t.done = true
		return false, nil
	}
	ok, err := owners.claim(ctx, t.ref)
	if err != nil {
		return false, err
	}
	t.blocked, t.blockedAt = !ok, gen
	if ok {
		t.log.Debug().Str("replica", owners.id).Msg("owning run")
	}
	return ok, nil
}

// reset forgets everything learnt about the run, so it is loaded again from the stream by
// whichever replica owns it next.
func (t *tracker) reset(why string) {
	t.log.Info().Msg(why + "; dropping the run's state")
	if t.follow != nil {
		t.follow.stopAndWait()
		t.follow = nil
	}
	if t.recheck != nil {
		t.recheck.Stop()
		t.recheck = nil
	}
	if t.logs != nil {
		t.logs.stop()
	}
	t.loaded, t.logs, t.end = false, nil, nil
	t.lastPhase, t.lastReason, t.lastStatusSeq = events.PhasePending, "", 0
}

// fenced handles a log publish refused because another replica wrote the run's log: this
// replica gives the run up and, if the run is free again, reloads it from the stream.
func (t *tracker) fenced(ctx context.Context) {
	t.w.owners.release(ctx, t.ref)
	t.reset("another replica wrote this run's log")
	t.poke()
}

// resultPublished reports whether the run's result is already in the stream.
func (t *tracker) resultPublished(ctx context.Context) (bool, error) {
	subj, err := t.w.opts.Subjects.Run(t.companyID, t.runID, events.KindResult)
	if err != nil {
		return true, nil //nolint:nilerr // a run whose ids cannot be subject tokens is never followed
	}
	_, err = t.stream.GetLastMsgForSubject(ctx, subj)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return false, nil
	default:
		return false, fmt.Errorf("reading the published result: %w", err)
	}
}

// step looks at the run's current Job and pod and publishes whatever changed.
func (t *tracker) step(ctx context.Context) error {
	if t.done {
		return nil
	}
	if ok, err := t.own(ctx); !ok || err != nil {
		return err
	}
	if !t.loaded {
		if err := t.load(ctx); err != nil {
			return err
		}
		t.loaded = true
	}
	if t.done {
		return nil
	}
	job, pod := t.w.objects(t.ref, t.namespace)
	if job != nil {
		t.seenJob = true
	}
	if job == nil && pod == nil && !t.seenJob {
		return nil // a pod's event raced ahead of the informer's view of the Job
	}

	if t.end == nil {
		d := t.decide(job, pod)
		if err := t.publishStatus(ctx, d.Phase, d.Reason, d.Message, pod); errors.Is(err, errFenced) {
			t.fenced(ctx)
			return nil
		} else if err != nil {
			return err
		}
		t.end = d.End
	}

	if t.follow != nil && t.follow.finished() && errors.Is(t.follow.err(), errFenced) {
		t.fenced(ctx)
		return nil
	}
	if t.follow != nil && t.end == nil && t.follow.finished() {
		// The follower gave up while the run goes on (a publish failed, the API server went
		// away): publish what it read, then follow again from the cursor.
		t.log.Warn().Err(t.follow.err()).Msg("log follower stopped early; restarting it")
		if err := t.flush(ctx); err != nil {
			return err
		}
		if t.logs == nil {
			return nil // fenced while flushing: the run is reloaded from the stream
		}
		t.follow = nil
	}
	// An exec-capable lease's container log is sandboxd's own: its commands' output reaches
	// clients through the exec service (and, when recorded, as exec events), not from here.
	if t.follow == nil && pod != nil && !t.backend.ExecCapable() && containerStarted(pod, t.w.opts.Container) {
		if err := t.logs.setPod(pod.Name, t.w.opts.Container); err != nil {
			return err
		}
		t.follow = startFollower(ctx, t, pod.Name)
	}

	if t.end == nil {
		return nil
	}
	// The run is over: let the follower read the rest of the log, then publish the result.
	if t.follow != nil {
		t.follow.stop()
		if !t.follow.finished() {
			return nil // the follower pokes when it is done
		}
		if err := t.follow.err(); err != nil && !errors.Is(err, context.Canceled) {
			t.log.Warn().Err(err).Msg("log follower ended with an error; publishing the result with the lines read")
		}
	}
	if err := t.flush(ctx); err != nil {
		return err
	}
	if t.logs == nil {
		return nil // fenced while flushing
	}
	if err := t.publishResult(ctx); err != nil {
		return err
	}
	t.done = true
	t.logs.stop()
	t.logs = nil // a finished run keeps no log state while its Job waits for its TTL
	t.w.owners.release(ctx, t.ref)
	return nil
}

// decide asks for the run's verdict on its Job and pod; a verdict that changes with time alone
// (a grace running out) has the tracker look again then.
func (t *tracker) decide(job *batchv1.Job, pod *corev1.Pod) verdict.Decision {
	opts := t.w.opts
	in := verdict.Input{Job: job, Pod: pod, SeenJob: t.seenJob, ExecCapable: t.backend.ExecCapable()}
	if job != nil {
		if q, refused := t.w.quotaRefusal(job); refused {
			in.QuotaRefusal = q.String()
		}
	}
	d := verdict.Decide(in, verdict.Options{
		Container: opts.Container, Now: opts.Now(),
		UnschedulableGrace: opts.UnschedulableGrace, StartErrorGrace: opts.StartErrorGrace,
	})
	if d.RecheckAfter > 0 {
		if t.recheck != nil {
			t.recheck.Stop()
		}
		t.recheck = time.AfterFunc(d.RecheckAfter, t.poke)
	}
	return d
}

// load reads what was already published for the run (own checked it has no result yet): its
// last status, and its last log chunk, where the log resumes.
func (t *tracker) load(ctx context.Context) error {
	s := t.w.opts.Subjects
	statusSubj, _ := s.Run(t.companyID, t.runID, events.KindStatus)
	if msg, err := t.stream.GetLastMsgForSubject(ctx, statusSubj); err == nil {
		var st events.RunStatusEvent
		if json.Unmarshal(msg.Data, &st) == nil {
			t.lastPhase, t.lastReason = st.Phase, st.Reason
		}
		t.lastStatusSeq = msg.Sequence
	} else if !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("reading the last published status: %w", err)
	}

	t.logs = newLogState(ctx, t, t.w.opts.FlushInterval)
	logSubj, _ := s.Run(t.companyID, t.runID, events.KindLog)
	msg, err := t.stream.GetLastMsgForSubject(ctx, logSubj)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the last published log chunk: %w", err)
	}
	var last events.RunLogEvent
	if err := json.Unmarshal(msg.Data, &last); err != nil {
		return fmt.Errorf("decoding the last published log chunk: %w", err)
	}
	if err := t.logs.resume(ctx, last, msg.Sequence); err != nil {
		return err
	}
	t.log.Info().Uint64("seq", last.Seq).Msg("resuming run after its last published log chunk")
	return nil
}

func (t *tracker) publishStatus(ctx context.Context, phase events.Phase, reason, message string, pod *corev1.Pod) error {
	if phase == t.lastPhase && reason == t.lastReason {
		return nil
	}
	ev := events.RunStatusEvent{RunID: t.runID, CompanyID: t.companyID, Phase: phase, Reason: reason, Message: message}
	if pod != nil {
		ev.PodName = pod.Name
	}
	// Fenced like the log: the publish expects the run's last status to be the one this replica
	// knows, so a replica that lost the run without noticing (paused, cut off) cannot append a
	// stale status after the new owner's.
	ack, err := t.w.publisher.Publish(ctx, ev, jetstream.WithExpectLastSequencePerSubject(t.lastStatusSeq))
	if isWrongLastSequence(err) {
		return fmt.Errorf("publishing status %s: %w", phase, errFenced)
	}
	if err != nil {
		return err
	}
	t.lastStatusSeq = ack.Sequence
	t.lastPhase, t.lastReason = phase, reason
	t.log.Debug().Str("phase", string(phase)).Str("reason", reason).Msg("published status")
	return nil
}

// flush publishes the pending log lines; a fenced publish gives the run up.
func (t *tracker) flush(ctx context.Context) error {
	err := t.logs.flush()
	if errors.Is(err, errFenced) {
		t.fenced(ctx)
		return nil
	}
	return err
}

// publishResult publishes the run's one result. The stream enforces "one": the publish expects
// no earlier message on the result subject, so a second result (another replica's, or this
// one's after the duplicate window) is refused, and that refusal means the run is done.
func (t *tracker) publishResult(ctx context.Context) error {
	v := t.end
	ev := events.RunResultEvent{
		RunID: t.runID, CompanyID: t.companyID,
		Outcome: v.Outcome, ExitCode: v.ExitCode, Reason: v.Reason, Message: v.Message,
		Agent: t.logs.agentResult(v.AgentExitCode()),
	}
	_, err := t.w.publisher.Publish(ctx, ev, jetstream.WithExpectLastSequencePerSubject(0))
	if isWrongLastSequence(err) {
		t.log.Info().Msg("the run's result was already published")
		return nil
	}
	if err != nil {
		return err
	}
	t.log.Info().Str("outcome", string(v.Outcome)).Str("reason", v.Reason).Msg("published result")
	return nil
}

// containerStarted reports whether the container has run, so its log can be read.
func containerStarted(pod *corev1.Pod, container string) bool {
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == container {
			return st.State.Running != nil || st.State.Terminated != nil || st.LastTerminationState.Terminated != nil
		}
	}
	return false
}

// follower runs k8s.FollowLogs for one pod in its own goroutine.
type follower struct {
	cancel  context.CancelFunc
	mu      sync.Mutex
	stopReq bool
	doneCh  chan struct{}
	lastErr error
}

func startFollower(ctx context.Context, t *tracker, pod string) *follower {
	fctx, cancel := context.WithCancel(ctx)
	f := &follower{cancel: cancel, doneCh: make(chan struct{})}
	opts := t.w.opts
	go func() {
		defer close(f.doneCh)
		defer t.poke()
		logs := t.logs
		cur, err := k8s.FollowLogs(fctx, opts.Clientset, t.namespace, pod, opts.Container, logs.cursor(), logs.add, k8s.FollowOptions{Logger: t.log})
		if errors.Is(err, context.Canceled) && ctx.Err() == nil && f.stopRequested() {
			// The run is over and the follow stream was cut short rather than waiting for the
			// kubelet to notice the exit: read the tail once, without following.
			_, err = k8s.ReadLogs(ctx, opts.Clientset, t.namespace, pod, opts.Container, cur, logs.add)
		}
		f.mu.Lock()
		f.lastErr = err
		f.mu.Unlock()
	}()
	return f
}

func (f *follower) stop() {
	f.mu.Lock()
	already := f.stopReq
	f.stopReq = true
	f.mu.Unlock()
	if !already {
		f.cancel()
	}
}

func (f *follower) stopRequested() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stopReq
}

func (f *follower) stopAndWait() {
	f.cancel()
	<-f.doneCh
}

func (f *follower) finished() bool {
	select {
	case <-f.doneCh:
		return true
	default:
		return false
	}
}

func (f *follower) err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastErr
}

// logState numbers, batches and publishes a run's log lines and feeds them to the agent parser.
// The follower adds lines; a timer publishes a partial chunk once its first line has waited
// the flush interval; the tracker flushes before it publishes the result.
type logState struct {
	// ctx is the watcher's: chunks flushed by the timer outlive any one follow stream.
	ctx      context.Context //nolint:containedctx // see above
	t        *tracker
	interval time.Duration

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
	parser streamjson.Parser
	// feedPiece and rememberPiece hold the pieces of a split line until its last piece, which
	// may come in a later chunk.
	feedPiece, rememberPiece []byte
}

// maxOutbox bounds the chunks kept while NATS is unreachable; past it the follower stops and
// resumes from its cursor later.
const maxOutbox = 64

var errOutboxFull = errors.New("log chunks are not being published")

// errFenced: the stream refused a log chunk because another replica wrote the run's log.
var errFenced = errors.New("another replica wrote this run's log")

func newLogState(ctx context.Context, t *tracker, interval time.Duration) *logState {
	return &logState{ctx: ctx, t: t, interval: interval, seq: newSequence(0)}
}

// setPod starts batching for the pod's container; lines of a previous pod were flushed.
func (l *logState) setPod(pod, container string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	b, err := NewLogBatcher(LogBatcherOptions{
		RunID: l.t.runID, CompanyID: l.t.companyID, Pod: pod, Container: container,
		Now: l.t.w.opts.Now, seq: l.seq,
	})
	if err != nil {
		return err
	}
	l.batcher = b
	return nil
}

func (l *logState) cursor() k8s.Cursor {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur.Clone()
}

// resume continues after the last published chunk: the next seq follows it, and the run's
// whole published log is replayed into the cursor (where the container log resumes) and the
// agent parser.
func (l *logState) resume(ctx context.Context, last events.RunLogEvent, streamSeq uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.seq = newSequence(last.Seq)
	l.lastStreamSeq = streamSeq
	return l.replay(ctx, last.Seq)
}

// replay feeds every line already published for the run, up to seq last, to the cursor and the
// parser.
func (l *logState) replay(ctx context.Context, last uint64) error {
	t := l.t
	subj, _ := t.w.opts.Subjects.Run(t.companyID, t.runID, events.KindLog)
	cons, err := t.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
	if err != nil {
		return fmt.Errorf("replaying the published log: %w", err)
	}
	for {
		batch, err := cons.FetchNoWait(256)
		if err != nil {
			return fmt.Errorf("replaying the published log: %w", err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			var ev events.RunLogEvent
			if json.Unmarshal(msg.Data(), &ev) != nil {
				continue
			}
			l.feed(ev.Lines)
			if err := l.remember(ev.Lines); err != nil {
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
			return nil
		}
	}
}

// remember adds published lines to the cursor, joining the pieces the batcher split a line
// into, so the cursor sees the lines as the container log has them.
func (l *logState) remember(lines []events.LogLine) error {
	for _, line := range lines {
		l.rememberPiece = append(l.rememberPiece, line.Text...)
		if line.Partial {
			continue // the rest of the line is in this chunk or the next
		}
		ts, err := time.Parse(time.RFC3339Nano, line.TS)
		if err != nil {
			return fmt.Errorf("parsing the timestamp of a published line: %w", err)
		}
		l.cur.Add(k8s.Line{Time: ts, TimeRaw: line.TS, Text: string(l.rememberPiece)})
		l.rememberPiece = l.rememberPiece[:0]
	}
	return nil
}

// feed hands complete lines to the agent parser, joining the pieces of a split line, which may
// span chunks.
func (l *logState) feed(lines []events.LogLine) {
	for _, line := range lines {
		if line.Partial {
			l.feedPiece = append(l.feedPiece, line.Text...)
			continue
		}
		if len(l.feedPiece) > 0 {
			l.parser.Feed(append(l.feedPiece, line.Text...))
			l.feedPiece = l.feedPiece[:0]
			continue
		}
		l.parser.Feed([]byte(line.Text))
	}
}

// add takes a line from the follower. Full chunks go out at once; a partial one when the flush
// timer fires. A line is delivered (the cursor moves past it) once it is in a chunk.
func (l *logState) add(line k8s.Line) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return errFenced
	}
	if len(l.outbox) >= maxOutbox {
		if err := l.publishOutboxLocked(); err != nil {
			return fmt.Errorf("%w: %w", errOutboxFull, err)
		}
	}
	ts := line.TimeRaw
	if ts == "" {
		ts = line.Time.UTC().Format(time.RFC3339Nano)
	}
	l.outbox = append(l.outbox, l.batcher.Add(events.LogLine{TS: ts, Text: line.Text})...)
	l.cur.Add(line)
	if len(l.outbox) > 0 {
		// A failure here leaves the chunks in the outbox for the next attempt, except a
		// fenced one, which ends this follower.
		if err := l.publishOutboxLocked(); errors.Is(err, errFenced) {
			return err
		}
	}
	if l.timer == nil && l.batcher.Pending() > 0 {
		l.timer = time.AfterFunc(l.interval, func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.timer = nil
			_ = l.flushLocked()
		})
	}
	return nil
}

// flush publishes everything pending.
func (l *logState) flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
	return l.flushLocked()
}

// stop ends the flush timer; nothing is published after it.
func (l *logState) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stopped = true
	if l.timer != nil {
		l.timer.Stop()
		l.timer = nil
	}
}

func (l *logState) flushLocked() error {
	if l.stopped {
		return errFenced
	}
	if l.batcher != nil {
		if ev, ok := l.batcher.Flush(); ok {
			l.outbox = append(l.outbox, ev)
		}
	}
	return l.publishOutboxLocked()
}

func (l *logState) publishOutboxLocked() error {
	for len(l.outbox) > 0 {
		ev := l.outbox[0]
		ack, err := l.t.w.publisher.Publish(l.ctx, ev, jetstream.WithExpectLastSequencePerSubject(l.lastStreamSeq))
		if isWrongLastSequence(err) {
			return fmt.Errorf("publishing log chunk %d: %w", ev.Seq, errFenced)
		}
		if err != nil {
			return err
		}
		if ack.Duplicate {
			// The stream already had this seq: our own retry (same lines) or another
			// replica's chunk (different lines), which means we no longer own the log.
			same, err := l.storedMatches(ack.Sequence, ev)
			if err != nil {
				return err
			}
			if !same {
				return fmt.Errorf("log chunk %d was written by another replica: %w", ev.Seq, errFenced)
			}
		}
		l.lastStreamSeq = ack.Sequence
		l.feed(ev.Lines)
		l.outbox = l.outbox[1:]
	}
	l.outbox = nil
	return nil
}

// storedMatches reports whether the stream's message at seq carries ev's lines.
func (l *logState) storedMatches(seq uint64, ev events.RunLogEvent) (bool, error) {
	msg, err := l.t.stream.GetMsg(l.ctx, seq)
	if err != nil {
		return false, fmt.Errorf("reading back log chunk %d: %w", ev.Seq, err)
	}
	var stored events.RunLogEvent
	if err := json.Unmarshal(msg.Data, &stored); err != nil {
		return false, fmt.Errorf("decoding log chunk %d: %w", ev.Seq, err)
	}
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

// isWrongLastSequence reports the stream refusing a publish whose expected last sequence did
// not match (codes 10071, and 10164 on replicated streams).
func isWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// agentResult is what the agent's stream-json log says about the run, judged with the
// agent's exit code: a non-zero exit makes it an error whatever the stream's last word.
func (l *logState) agentResult(exitCode int) *events.AgentResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.parser.ResultWithExitCode(exitCode)
}
