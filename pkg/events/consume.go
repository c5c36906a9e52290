package events

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Handler does the work a message asks for. Its return value decides the message's fate:
// nil acks it; an error with a *TerminalError in its chain terms it and reports it through
// ConsumeOptions.OnTerminal; any other error retries it later. Handlers never ack themselves.
// ctx stays valid after Consume's context is cancelled, until the drain timeout runs out.
type Handler func(ctx context.Context, m jetstream.Msg) error

// TerminalFunc reports a message that will not be retried, typically by publishing the run's
// `failed` event (NewRunFailed). It runs before the message is termed; if it fails, the message
// is retried so the report is not lost, unless this was the last delivery.
type TerminalFunc func(ctx context.Context, m jetstream.Msg, err *TerminalError) error

// Consume defaults.
const (
	// DefaultConcurrency handlers run at once per Consume call: enough to overlap Kubernetes
	// round-trips, few enough not to flood the API server from one replica.
	DefaultConcurrency = 8
	// DefaultDrainTimeout is how long a stopping worker lets the work in hand finish (running
	// handlers, exec streams), and the default of every worker's --shutdown-timeout. The
	// manifests give a worker pod 40 s (terminationGracePeriodSeconds), which covers this plus
	// the NATS connection's drain (up to 10 s) with room to spare.
	DefaultDrainTimeout = 20 * time.Second
	// DefaultPollTimeout is how long one pull request waits on the server for messages.
	DefaultPollTimeout = 30 * time.Second
	// DefaultSettleTimeout bounds OnTerminal plus the ack that follows.
	DefaultSettleTimeout = 10 * time.Second

	// abandonGrace is how long Consume still waits, after the drain timeout cancelled them,
	// for handlers to return, so handlers that honour their context do not outlive it.
	abandonGrace = time.Second
	// fetchRetryPause spaces pull attempts after a transient pull error.
	fetchRetryPause = time.Second
)

// ErrDrainTimeout is returned (wrapped) when handlers were still running when the drain
// timeout ran out; their messages were handed back for redelivery.
var ErrDrainTimeout = errors.New("drain timeout expired with handlers still running")

// errShutdown is the fate of a message pulled while Consume was stopping: it was never started.
var errShutdown = errors.New("consumer shutting down before the message was handled")

// ConsumeOptions configures Consume. The zero value of every field means its default.
type ConsumeOptions struct {
	// Logger receives one line per settled message and per failure; never payloads.
	Logger zerolog.Logger
	// Concurrency is the number of messages handled at once (default 8).
	Concurrency int
	// DrainTimeout bounds how long a cancelled Consume waits for running handlers (default
	// DefaultDrainTimeout).
	DrainTimeout time.Duration
	// Backoff is the NakWithDelay delay after the attempt-th delivery failed (default
	// DefaultBackoff). The consumer's BackOff does not apply to Nak, so this is the schedule.
	Backoff func(attempt uint64) time.Duration
	// OnTerminal reports a message that will not be retried; nil only logs it.
	OnTerminal TerminalFunc
	// MaxMsgSize rejects larger payloads before the handler sees them (default 1 MiB).
	MaxMsgSize int
	// PollTimeout is how long one pull waits for messages (default 30 s).
	PollTimeout time.Duration
	// KeepAliveInterval is how often a running handler's message gets InProgress (default a
	// third of the consumer's shortest ack deadline).
	KeepAliveInterval time.Duration
	// SettleTimeout bounds OnTerminal plus the ack (default 10 s).
	SettleTimeout time.Duration
	// MaxAttempts bounds the deliveries of a message whose handler keeps failing (default: the
	// consumer's MaxDeliver). Deferrals (a RetryableError with After) are bounded by MaxDeliver
	// alone, so a consumer can allow a long wait without retrying real failures as often.
	MaxAttempts int
	// Observer is told the fate of every settled message (metrics); nil means none.
	Observer ConsumeObserver
	// Retries, when set, moves a message whose handler failed retryably out of this consumer
	// into the worker's retry queue, and acknowledges it here: retries waiting for their backoff
	// hold no slot of the consumer's window and are never redelivered ahead of new messages, so
	// one company's failing backlog does not delay another company's first attempt. Work the
	// queue through with a second Consume, with the same Retries, on
	// RetryConsumerConfig(Retries.Name). Deferrals (a RetryableError with After) stay on their
	// consumer. nil keeps retries on the consumer (NakWithDelay).
	Retries *RetryQueue
	// QueueKey, when set, makes Consume pull ahead of its handlers into one queue per key (the
	// company: CompanyKey) and start the keys' messages in turn, so one company's flood of
	// requests does not delay another company's first (fair.go). nil handles messages in
	// stream order, pulling only what a free handler slot can start.
	QueueKey func(subject string) string
	// QueueLimit bounds the messages held in the queues (default ConsumerMaxAckPending).
	QueueLimit int
	// QueueBytes bounds the payload bytes held in the queues (default DefaultQueueBytes).
	QueueBytes int
}

func (o ConsumeOptions) withDefaults(cfg jetstream.ConsumerConfig) (ConsumeOptions, error) {
	if o.Concurrency < 0 || o.DrainTimeout < 0 || o.PollTimeout < 0 || o.KeepAliveInterval < 0 || o.SettleTimeout < 0 || o.MaxMsgSize < 0 || o.MaxAttempts < 0 || o.QueueLimit < 0 || o.QueueBytes < 0 {
		return o, errors.New("events: ConsumeOptions values must not be negative")
	}
	if o.Concurrency == 0 {
		o.Concurrency = DefaultConcurrency
	}
	if o.MaxAttempts == 0 || o.MaxAttempts > cfg.MaxDeliver {
		o.MaxAttempts = cfg.MaxDeliver
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = DefaultDrainTimeout
	}
	if o.Backoff == nil {
		o.Backoff = DefaultBackoff
	}
	if o.MaxMsgSize == 0 {
		o.MaxMsgSize = DefaultMaxMsgSize
	}
	if o.PollTimeout == 0 {
		o.PollTimeout = DefaultPollTimeout
	}
	if o.SettleTimeout == 0 {
		o.SettleTimeout = DefaultSettleTimeout
	}
	if o.QueueLimit == 0 {
		o.QueueLimit = ConsumerMaxAckPending
	}
	if o.QueueBytes == 0 {
		o.QueueBytes = DefaultQueueBytes
	}
	if o.KeepAliveInterval == 0 {
		deadline := cfg.AckWait
		for _, b := range cfg.BackOff {
			if b > 0 && (deadline <= 0 || b < deadline) {
				deadline = b
			}
		}
		if deadline <= 0 {
			deadline = ConsumerAckWait
		}
		o.KeepAliveInterval = deadline / 3
	}
	return o, nil
}

// DefaultBackoff waits 1 s after the first failed delivery and doubles up to 30 s.
func DefaultBackoff(attempt uint64) time.Duration {
	return exponentialBackoff(time.Second, 30*time.Second)(attempt)
}

// exponentialBackoff returns base·2^(attempt-1), capped at limit.
func exponentialBackoff(base, limit time.Duration) func(attempt uint64) time.Duration {
	return func(attempt uint64) time.Duration {
		d := base
		for i := uint64(1); i < attempt && d < limit; i++ {
			d *= 2
		}
		return min(d, limit)
	}
}

// Consume pulls messages from cons and hands each to h, with at most opts.Concurrency handlers
// running. One classifier (settle) decides every message's fate and is the only code that acks:
//
//   - h returned nil: DoubleAck, so a lost ack is logged rather than silent.
//   - h returned a TerminalError: OnTerminal (which publishes `failed`), then TermWithReason;
//     the message is never redelivered.
//   - h returned another error or panicked: NakWithDelay(Backoff(attempt)), or an immediate
//     Nak while shutting down so another replica picks it up at once. On the consumer's last
//     delivery (NumDelivered ≥ MaxDeliver) it is terminal instead, with CodeInternal or the
//     RetryableError's code, so nothing retries forever and the caller still hears `failed`.
//
// Without QueueKey, messages are pulled only when a handler slot is free, so none ages in a
// client buffer while its ack deadline runs; with it, Consume pulls ahead into per-key queues
// (bounded by QueueLimit and QueueBytes) and starts the keys' messages in turn (fair.go), and
// held messages get InProgress too. Running handlers' messages get InProgress every
// KeepAliveInterval.
// The consumer must use explicit acks and a positive MaxDeliver.
//
// When ctx is cancelled Consume stops pulling, hands back messages it pulled but did not start,
// waits up to DrainTimeout for running handlers, then cancels their context and hands their
// messages back (never acking unfinished work). It returns nil after a clean drain,
// ErrDrainTimeout if handlers had to be abandoned, or the error that stopped pulling (closed
// connection, deleted consumer).
func Consume(ctx context.Context, cons jetstream.Consumer, h Handler, opts ConsumeOptions) error {
	if h == nil {
		return errors.New("events: Consume needs a handler")
	}
	info := cons.CachedInfo()
	if info == nil {
		var err error
		if info, err = cons.Info(ctx); err != nil {
			return fmt.Errorf("reading consumer info: %w", err)
		}
	}
	cfg := info.Config
	if cfg.AckPolicy != jetstream.AckExplicitPolicy {
		return fmt.Errorf("consumer %s: ack policy must be explicit, got %s", info.Name, cfg.AckPolicy)
	}
	if cfg.MaxDeliver <= 0 {
		return fmt.Errorf("consumer %s: MaxDeliver must be positive so no message retries forever, got %d", info.Name, cfg.MaxDeliver)
	}
	opts, err := opts.withDefaults(cfg)
	if err != nil {
		return err
	}
	l := &consumeLoop{
		cons:       cons,
		handler:    h,
		opts:       opts,
		maxDeliver: cfg.MaxDeliver,
		name:       info.Name,
		log:        opts.Logger.With().Str(LogKeyStream, info.Stream).Str(LogKeyConsumer, info.Name).Logger(),
		inflight:   make(map[*delivery]struct{}),
	}
	return l.run(ctx)
}

type consumeLoop struct {
	cons       jetstream.Consumer
	handler    Handler
	opts       ConsumeOptions
	maxDeliver int
	name       string
	log        zerolog.Logger

	mu       sync.Mutex
	inflight map[*delivery]struct{}
}

// delivery is one message being handled.
type delivery struct {
	m       jetstream.Msg
	attempt uint64
	log     zerolog.Logger

	settled       sync.Once
	stopKeepAlive func()
	// started is when the handler started (zero if it never did); for the Observer.
	started time.Time
	// pulled is when a fair queue took it in (QueueKey), for its keep-alive while it waits.
	pulled time.Time
	// due is when a retry from a RetryQueue may run (zero for any other message), and before
	// how many deliveries it had until then.
	due    time.Time
	before uint64
}

func (l *consumeLoop) run(ctx context.Context) error {
	// Handlers run on a context that survives ctx until the drain timeout.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()

	slots := make(chan struct{}, l.opts.Concurrency)
	var wg sync.WaitGroup
	start := func(d *delivery) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			l.handle(ctx, workCtx, d)
		}()
	}
	var stopErr error
	if l.opts.QueueKey != nil {
		stopErr = l.pullFair(ctx, start, slots)
	} else {
		stopErr = l.pullInOrder(ctx, start, slots)
	}

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	timer := time.NewTimer(l.opts.DrainTimeout)
	defer timer.Stop()
	select {
	case <-done:
		return stopErr
	case <-timer.C:
	}
	cancelWork()
	abandoned := l.abandonInFlight(ctx)
	select {
	case <-done:
	case <-time.After(abandonGrace):
	}
	return errors.Join(stopErr, fmt.Errorf("%w: handed back %d messages", ErrDrainTimeout, abandoned))
}

// pullInOrder is Consume's pull loop without QueueKey: it pulls only what its free handler
// slots can start, in stream order. It returns the error that stopped pulling.
func (l *consumeLoop) pullInOrder(ctx context.Context, start func(*delivery), slots chan struct{}) error {
	for ctx.Err() == nil {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		free := 1
	claim:
		for free < l.opts.Concurrency {
			select {
			case slots <- struct{}{}:
				free++
			default:
				break claim
			}
		}
		started, err := l.fetch(ctx, free, start)
		for range free - started {
			<-slots
		}
		if err := l.pullFailed(ctx, err); err != nil {
			return err
		}
	}
	return nil
}

// pullFailed returns err wrapped when no retry can fix it (closed connection, deleted
// consumer); any other error is logged and, after a pause, retried (nil).
func (l *consumeLoop) pullFailed(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if fatalPullError(err) {
		return fmt.Errorf("pulling messages: %w", err)
	}
	l.log.Warn().Err(err).Msg("pulling messages failed; retrying")
	select {
	case <-time.After(fetchRetryPause):
	case <-ctx.Done():
	}
	return nil
}

// fetch pulls up to n messages and starts each (or, with QueueKey, queues each), as it
// arrives; it returns how many it started.
func (l *consumeLoop) fetch(ctx context.Context, n int, start func(*delivery)) (int, error) {
	pollCtx, cancel := context.WithTimeout(ctx, l.opts.PollTimeout)
	defer cancel()
	batch, err := l.cons.Fetch(n, jetstream.FetchContext(pollCtx))
	if err != nil {
		if ctx.Err() != nil {
			return 0, nil
		}
		return 0, err
	}
	started := 0
	for m := range batch.Messages() {
		d := l.newDelivery(m)
		if ctx.Err() != nil {
			// Pulled while stopping: never started, hand it straight back.
			l.settle(ctx, d, errShutdown)
			continue
		}
		started++
		start(d)
	}
	err = batch.Error()
	if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return started, nil
	}
	return started, err
}

// fatalPullError reports errors that no retry can fix.
func fatalPullError(err error) bool {
	return errors.Is(err, nats.ErrConnectionClosed) ||
		errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, jetstream.ErrConsumerNotFound)
}

func (l *consumeLoop) newDelivery(m jetstream.Msg) *delivery {
	d := &delivery{m: m, attempt: 1, stopKeepAlive: func() {}}
	meta, metaErr := m.Metadata()
	if metaErr == nil {
		d.attempt = meta.NumDelivered
	}
	if rm, before, due, ok := l.opts.Retries.asRetry(m); ok {
		// A retry counts the deliveries of every copy, from the first consumer on.
		d.m, m, d.before, d.attempt, d.due = rm, rm, before, before+1, due
	}
	lc := l.log.With().Str(LogKeySubject, m.Subject())
	if metaErr == nil {
		lc = lc.Uint64(LogKeyStreamSeq, meta.Sequence.Stream)
	}
	if id := m.Headers().Get(HeaderMsgID); id != "" {
		lc = lc.Str(LogKeyMsgID, id)
	}
	companyID, runID := MsgIDs(m.Subject())
	if companyID != "" {
		lc = lc.Str(LogKeyTenant, companyID)
	}
	if runID != "" {
		lc = lc.Str(LogKeyRunID, runID)
	}
	d.log = lc.Uint64(LogKeyAttempt, d.attempt).Logger()
	return d
}

func (l *consumeLoop) handle(ctx, workCtx context.Context, d *delivery) {
	if size := len(d.m.Data()); size > l.opts.MaxMsgSize {
		l.settle(ctx, d, InvalidRequest("", "payload is %d bytes, more than the %d-byte limit", size, l.opts.MaxMsgSize))
		return
	}
	if wait := time.Until(d.due); !d.due.IsZero() && wait > 0 {
		// Taken before its time (the retry consumer delivers a copy at once): it waits again,
		// as the attempt it was, without running the handler.
		d.attempt = d.before
		l.settle(ctx, d, &RetryableError{Code: CodeInternal, After: wait, Err: notDue{wait}})
		return
	}
	d.stopKeepAlive = keepAlive(d.m, l.opts.KeepAliveInterval, func(err error) {
		d.log.Warn().Err(err).Msg("extending the ack deadline failed; the message may be redelivered while it is handled")
	})
	d.started = time.Now()
	// Registered after stopKeepAlive and started are set: the mutex orders those writes before
	// abandonInFlight's settle reads them.
	l.mu.Lock()
	l.inflight[d] = struct{}{}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.inflight, d)
		l.mu.Unlock()
	}()
	err := l.call(workCtx, d)
	l.settle(ctx, d, err)
}

// call runs the handler, turning a panic into a retryable error: a bad message must never
// crash a worker.
func (l *consumeLoop) call(ctx context.Context, d *delivery) (err error) {
	defer func() {
		if r := recover(); r != nil {
			d.log.Error().Str(LogKeyPanic, fmt.Sprint(r)).Str(LogKeyStack, string(debug.Stack())).Msg("handler panicked; the message will be retried")
			err = fmt.Errorf("handler panicked: %v", r)
		}
	}()
	return l.handler(ctx, d.m)
}

// abandonInFlight hands back the messages of handlers that outlived the drain timeout.
func (l *consumeLoop) abandonInFlight(ctx context.Context) int {
	l.mu.Lock()
	ds := make([]*delivery, 0, len(l.inflight))
	for d := range l.inflight {
		ds = append(ds, d)
	}
	l.mu.Unlock()
	for _, d := range ds {
		d.log.Warn().Msg("handler still running after the drain timeout; handing its message back")
		l.settle(ctx, d, errShutdown)
	}
	return len(ds)
}

type action int

const (
	actionAck action = iota
	actionTerm
	actionNak
)

type decision struct {
	action   action
	delay    time.Duration // actionNak only; 0 means immediate redelivery
	deferred bool          // actionNak only: the handler asked to wait, nothing failed
	terminal *TerminalError
}

// classify decides a message's fate from the handler's result.
//
// A deferral (a RetryableError with After set: "not now, ask again later", such as a busy agent)
// may use every delivery the consumer allows; any other failure gets maxAttempts deliveries.
// The two differ on consumers whose MaxDeliver is raised to leave room for waiting.
func classify(err error, attempt uint64, maxAttempts, maxDeliver int, backoff func(uint64) time.Duration, stopping bool) decision {
	if err == nil {
		return decision{action: actionAck}
	}
	if te, ok := AsTerminal(err); ok {
		return decision{action: actionTerm, terminal: te}
	}
	var re *RetryableError
	retryable := errors.As(err, &re)
	limit := min(maxAttempts, maxDeliver)
	if retryable && re.After > 0 {
		limit = maxDeliver
	}
	if attempt >= uint64(limit) {
		code := CodeInternal
		if retryable {
			code = re.Code
		}
		return decision{action: actionTerm, terminal: &TerminalError{
			Code: code,
			Err:  fmt.Errorf("giving up after %d attempts: %w", attempt, err),
		}}
	}
	switch {
	case retryable && re.After > 0:
		return decision{action: actionNak, delay: re.After, deferred: true}
	case stopping:
		return decision{action: actionNak}
	}
	return decision{action: actionNak, delay: backoff(attempt)}
}

// settle applies the classifier's decision. It is the only code that acks, naks or terms, and
// it acts at most once per delivery.
func (l *consumeLoop) settle(ctx context.Context, d *delivery, err error) {
	d.settled.Do(func() {
		d.stopKeepAlive()
		dec := classify(err, d.attempt, l.opts.MaxAttempts, l.maxDeliver, l.opts.Backoff, ctx.Err() != nil)
		if l.opts.Observer != nil {
			defer l.observe(d, dec, ctx.Err() != nil)
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.opts.SettleTimeout)
		defer cancel()
		switch dec.action {
		case actionAck:
			if err := d.m.DoubleAck(sctx); err != nil {
				d.log.Warn().Err(err).Msg("ack not confirmed; the message may be redelivered and handled again")
				return
			}
			d.log.Debug().Msg("message handled")
		case actionNak:
			if l.opts.Retries != nil && !dec.deferred && dec.delay > 0 {
				if l.moveToRetries(sctx, d, err, dec.delay) {
					return
				}
			}
			var nakErr error
			if dec.delay > 0 {
				nakErr = d.m.NakWithDelay(dec.delay)
			} else {
				nakErr = d.m.Nak()
			}
			var early notDue
			switch {
			case errors.As(err, &early):
				d.log.Debug().Dur(LogKeyDelay, dec.delay).Msg("retry not due yet; waiting")
			case errors.Is(err, errShutdown):
				d.log.Info().Msg("shutting down; message handed back for redelivery")
			default:
				d.log.Warn().Err(err).Dur(LogKeyDelay, dec.delay).Msg("handler failed; message will be retried")
			}
			if nakErr != nil {
				d.log.Warn().Err(nakErr).Msg("nak failed; the message will be redelivered after its ack deadline")
			}
		case actionTerm:
			l.terminate(sctx, d, dec.terminal)
		}
	})
}

// moveToRetries moves d's message to the retry queue, due after delay, and acknowledges it here;
// it reports false, having done nothing, if the move failed (the caller naks instead).
func (l *consumeLoop) moveToRetries(ctx context.Context, d *delivery, err error, delay time.Duration) bool {
	if mvErr := l.opts.Retries.move(ctx, d, delay, time.Now()); mvErr != nil {
		d.log.Warn().Err(mvErr).Msg("moving the message to the retry queue failed; retrying it on its consumer")
		return false
	}
	d.log.Warn().Err(err).Dur(LogKeyDelay, delay).Msg("handler failed; message moved to the retry queue")
	if ackErr := d.m.DoubleAck(ctx); ackErr != nil {
		// The copy waits in the retry queue; the original comes back after its ack deadline and
		// is handled once more (handlers are idempotent).
		d.log.Warn().Err(ackErr).Msg("ack of a message moved to the retry queue not confirmed; it may be handled twice")
	}
	return true
}

// observe reports a settled delivery to the Observer.
func (l *consumeLoop) observe(d *delivery, dec decision, stopping bool) {
	s := Settlement{
		Consumer: l.name, Subject: d.m.Subject(), Attempt: d.attempt,
		Fate: fateOf(dec, stopping && dec.action == actionNak && dec.delay == 0),
	}
	if !d.started.IsZero() {
		s.HandlerDuration = time.Since(d.started)
	}
	if dec.terminal != nil {
		s.Code = dec.terminal.Code
	}
	l.opts.Observer.MessageSettled(s)
}

func (l *consumeLoop) terminate(ctx context.Context, d *delivery, te *TerminalError) {
	ev := d.log.Warn()
	if te.Code == CodeInternal {
		ev = d.log.Error()
	}
	ev = ev.Err(te).Str(LogKeyCode, string(te.Code))
	if te.Field != "" {
		ev = ev.Str(LogKeyField, te.Field)
	}
	ev.Msg("message failed for good")
	if l.opts.OnTerminal != nil {
		if err := l.opts.OnTerminal(ctx, d.m, te); err != nil {
			if d.attempt < uint64(l.maxDeliver) {
				delay := l.opts.Backoff(d.attempt)
				d.log.Error().Err(err).Dur(LogKeyDelay, delay).Msg("reporting the failure failed; retrying the message so the report is not lost")
				if nakErr := d.m.NakWithDelay(delay); nakErr != nil {
					d.log.Warn().Err(nakErr).Msg("nak failed; the message will be redelivered after its ack deadline")
				}
				return
			}
			d.log.Error().Err(err).Msg("reporting the failure failed on the last delivery; the caller will not hear about it")
		}
	}
	reason := string(te.Code)
	if te.Field != "" {
		reason += " field=" + te.Field
	}
	if err := d.m.TermWithReason(reason); err != nil {
		d.log.Warn().Err(err).Msg("term failed; the message may be redelivered")
	}
}

// keepAlive sends m.InProgress() every interval until the returned stop is called, so a long
// handler keeps its message's ack deadline from expiring. stop waits for the sender to exit and
// may be called more than once.
func keepAlive(m jetstream.Msg, every time.Duration, onErr func(error)) func() {
	if every <= 0 {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if err := m.InProgress(); err != nil {
					onErr(err)
				}
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			wg.Wait()
		})
	}
}
