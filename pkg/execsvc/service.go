package execsvc

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// sweepInterval is how often the clients of pods that went away are closed.
const sweepInterval = 30 * time.Second

// Service serves exec requests from the queue group until its context ends.
type Service struct {
	opts     Options
	log      zerolog.Logger
	subjects execproto.Subjects
	clients  *leaseClients
	events   eventPublisher
	// sessionSlots bound the start and attach requests being served (and so the streams),
	// signalSlots the signal requests; both are taken before any work starts for a request.
	// buffers and lines are the byte budgets the sessions' buffers are taken from as they grow.
	sessionSlots, signalSlots *fairPool
	buffers, lines            *fairPool
	// leases and recorded are opened by Run, before the first request.
	leases   leaseReader
	recorded recordedExecs
	budgets  *events.Budgets

	ready chan struct{} // closed once the subscriptions are in place

	mu     sync.Mutex
	active map[streamKey]*session
	wg     sync.WaitGroup
}

// streamKey names an exec's stream to one client: the exec id is the client's, unique within
// the lease's pod; the inbox is where the stream goes.
type streamKey struct {
	ref    events.RunRef
	execID string
	inbox  string
}

// New validates opts and returns a Service; Run starts it.
func New(opts Options) (*Service, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	pub, err := events.NewPublisher(events.PublisherOptions{JS: opts.JetStream, Subjects: opts.Subjects, Now: opts.Now})
	if err != nil {
		return nil, err
	}
	io, lines := splitBuffers(opts.BufferBytes)
	return &Service{
		opts:         opts,
		log:          opts.Logger.With().Str(logKeyReplica, opts.Replica).Str(logKeyRoute, opts.Route.Name()).Logger(),
		subjects:     execproto.NewSubjects(opts.Subjects),
		clients:      newLeaseClients(opts.Route, opts.MasterKey),
		events:       pub,
		sessionSlots: newFairPool("streams", int64(opts.MaxSessions), sessionReserveOf(opts.MaxSessions), int64(opts.MaxSessionsPerCompany)),
		signalSlots:  newFairPool("signals", int64(opts.MaxSessions), sessionReserveOf(opts.MaxSessions), signalsPerCompany),
		buffers:      newFairPool("buffer bytes", io, bufferReserveOf(io), 0),
		lines:        newFairPool("line buffer bytes", lines, bufferReserveOf(lines), 0),
		active:       map[streamKey]*session{},
		ready:        make(chan struct{}),
	}, nil
}

// Run subscribes to the request subjects in the queue group and serves requests until ctx
// ends. Then it stops taking requests, lets the streams in progress finish for the drain bound,
// cuts the rest (their clients attach through another replica) and returns.
func (s *Service) Run(ctx context.Context) error {
	kv, err := events.OpenBucket(ctx, s.opts.JetStream, lease.Bucket)
	if err != nil {
		return err
	}
	s.leases = lease.Records{KV: kv}
	rkv, err := events.EnsureBucket(ctx, s.opts.JetStream, RecordedBucketConfig(s.opts.StreamReplicas, s.opts.StoreBytes))
	if err != nil {
		return fmt.Errorf("opening KV bucket %s: %w", RecordedBucket, err)
	}
	rst, err := events.OpenStream(ctx, s.opts.JetStream, events.BucketStream(RecordedBucket))
	if err != nil {
		return err
	}
	s.recorded = recordedExecs{kv: rkv, st: rst, failures: storeFailures(s.log, RecordedBucket, s.opts.Observer)}
	if s.budgets, err = openBudgets(ctx, s.opts.JetStream, s.opts.StreamReplicas, s.opts.StoreBytes, s.opts.Record, s.opts.Observer, s.log); err != nil {
		return err
	}
	// Streams outlive ctx by the drain bound: they get their own context.
	serveCtx, stopServing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServing()
	var subs []*nats.Subscription
	defer func() {
		for _, sub := range subs {
			_ = sub.Unsubscribe()
		}
	}()
	for _, op := range execproto.Ops() {
		sub, err := s.opts.NATS.QueueSubscribe(s.subjects.RequestFilter(op), execproto.QueueGroup, func(m *nats.Msg) {
			s.receive(serveCtx, m)
		})
		if err != nil {
			return fmt.Errorf("subscribing to %s: %w", s.subjects.RequestFilter(op), err)
		}
		subs = append(subs, sub)
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := s.opts.NATS.FlushWithContext(fctx); err != nil {
		return fmt.Errorf("subscribing to the exec subjects: %w", err)
	}
	s.log.Info().Str(events.LogKeySubject, s.subjects.RequestFilter("*")).Msg("serving exec requests")
	close(s.ready)

	sweep := time.NewTicker(sweepInterval)
	defer sweep.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-sweep.C:
			s.clients.sweep(s.opts.Pods, s.opts.Now())
		}
	}

	s.drain(subs)
	subs = nil
	finished := make(chan struct{})
	go func() { s.wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(s.opts.DrainTimeout):
		s.log.Info().Int("streams", s.sessions()).Msg("cutting the exec streams still running; their clients attach elsewhere")
		stopServing()
		<-finished
	}
	s.clients.closeAll()
	return nil
}

// Ready is closed once the service receives requests: its queue subscriptions reached the
// server.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// drain stops taking requests: requests already delivered to this replica are still handled,
// later ones go to the other replicas of the queue group.
func (s *Service) drain(subs []*nats.Subscription) {
	for _, sub := range subs {
		closed := sub.StatusChanged(nats.SubscriptionClosed)
		if err := sub.Drain(); err != nil {
			_ = sub.Unsubscribe()
			continue
		}
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			_ = sub.Unsubscribe()
		}
	}
}

// sessions is the number of exec streams being served.
func (s *Service) sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.active)
}

// serve runs a session, replacing this replica's session of the same stream if there is one.
func (s *Service) serve(ctx context.Context, spec sessionSpec, log zerolog.Logger) {
	sess, sctx := newSession(ctx, s.sessionDeps(), spec, log)
	key := streamKey{ref: spec.ref, execID: spec.execID, inbox: spec.reply}
	s.mu.Lock()
	if old := s.active[key]; old != nil {
		old.cancel()
	}
	s.active[key] = sess
	s.mu.Unlock()
	s.opts.Observer.ExecSessions(1)
	defer s.opts.Observer.ExecSessions(-1)
	sess.run(sctx)
	s.mu.Lock()
	if s.active[key] == sess {
		delete(s.active, key)
	}
	s.mu.Unlock()
}

func (s *Service) sessionDeps() sessionDeps {
	return sessionDeps{
		nc: s.opts.NATS, pods: s.opts.Pods, events: s.events, observer: s.opts.Observer, now: s.opts.Now,
		heartbeat: s.opts.Heartbeat, linger: s.opts.Linger, patience: s.opts.AckPatience, reconnect: s.opts.Reconnect,
		recording: recordingDeps{events: s.events, subjects: s.opts.Subjects, budgets: s.budgets, progress: s.recorded, limits: s.opts.Record, onExecBudget: execBudgetHook(s.opts.Observer)},
		replies:   s.opts.Replies,
		buffers:   s.buffers, lines: s.lines,
	}
}
