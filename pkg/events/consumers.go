package events

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Durable consumer names.
const (
	TenantWorkerConsumer     = "tenant-worker"
	DispatcherConsumer       = "dispatcher"
	DispatcherEndConsumer    = "dispatcher-release"
	DispatcherResultConsumer = "dispatcher-result"
	// BrokerReleaseConsumer is the credential broker's: every replica shares it.
	BrokerReleaseConsumer = "broker-release"
)

// Settings shared by every worker consumer. TestConsumerConfigs pins each one.
const (
	// ConsumerAckWait is how long the server waits for an ack before redelivering. It only
	// matters when a worker dies or hangs: Consume sends InProgress every AckWait/3 while a
	// handler runs, so long Kubernetes calls never hit it, and 30 s (the server default) keeps
	// a crashed worker's messages from waiting long for another replica.
	ConsumerAckWait = 30 * time.Second

	// ConsumerMaxDeliver bounds deliveries of one message. With Consume's backoff (1 s doubling,
	// capped at 30 s) eight deliveries retry for about 1.5 minutes, long enough to ride out an
	// API server restart or a leader election, short enough that Paperclip hears `failed`
	// (code internal, or the RetryableError's code) while the run still matters.
	ConsumerMaxDeliver = 8

	// ConsumerMaxAckPending caps messages delivered but not yet acked across all replicas of a
	// worker. It is not what bounds the load on the API server: at most replicas × Concurrency
	// messages are being handled. What else is pending is messages held in Consume's
	// per-company queues (ConsumeOptions.QueueKey), which see only this window, and messages
	// waiting for their retry (NakWithDelay keeps them pending); the cap must not let one
	// company's flood fill the window and hold back every other company's requests, so it is
	// set far above any realistic backlog (the flood was 10,000 acquires). Waiting for a
	// busy agent does not count: those dispatches are parked outside the consumer
	// (pkg/dispatch).
	ConsumerMaxAckPending = 10000
)

// TenantWorkerConsumerConfig is the tenant-worker's durable consumer on the lease stream: every
// company's acquire requests.
func TenantWorkerConsumerConfig(s Subjects) jetstream.ConsumerConfig {
	cfg := workerConsumer(TenantWorkerConsumer, "kubeclip tenant-worker: acquire requests")
	cfg.FilterSubject = s.LeaseFilter(LeaseAcquire)
	return cfg
}

// DispatcherConsumerConfig is the dispatcher's durable consumer on the work queue. A work-queue
// stream allows one consumer per subject, so every dispatcher replica shares this one.
func DispatcherConsumerConfig() jetstream.ConsumerConfig {
	cfg := workerConsumer(DispatcherConsumer, "kubeclip dispatcher: dispatch requests")
	cfg.FilterSubject = DispatchAll()
	return cfg
}

// DispatcherEndConsumerConfig is the dispatcher's durable consumer on the lease stream for
// release, destroy and resume requests.
func DispatcherEndConsumerConfig(s Subjects) jetstream.ConsumerConfig {
	cfg := workerConsumer(DispatcherEndConsumer, "kubeclip dispatcher: release, destroy and resume requests")
	cfg.FilterSubjects = []string{s.LeaseFilter(LeaseRelease), s.LeaseFilter(LeaseDestroy), s.LeaseFilter(LeaseResume)}
	return cfg
}

// DispatcherResultConsumerConfig is the dispatcher's durable consumer on the run stream for
// result events, which free the run's agent guard and clean up after runs that never started.
func DispatcherResultConsumerConfig(s Subjects) jetstream.ConsumerConfig {
	cfg := workerConsumer(DispatcherResultConsumer, "kubeclip dispatcher: run results")
	cfg.FilterSubject = s.RunKindFilter(KindResult)
	// Only results from now on: the dispatcher creates this consumer before it dispatches
	// anything, so every run it holds a guard for ends after the consumer exists, and replaying
	// 14 days of results on first start would be wasted work (guards expire by TTL anyway).
	cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	return cfg
}

// BrokerReleaseConsumerConfig is the credential broker's durable consumer on the run stream for
// the events that bind a run's grants to its pod, status (its IP once known) and resumed (a
// reusable lease's pod after a resume, which may be a new one), and those that
// end them: released (the lease's release), result (the run's end), suspended (a reusable
// lease's pod deleted) and failed (an acquire that failed leaves no lease). Every broker replica shares it, so each event binds or releases
// once; one consumer for both keeps a run's bind before its release, as the stream ordered them. Only events from now on, as the dispatcher's result consumer: the
// broker creates it before it mints anything, and a grant whose end was never seen expires
// with the grants bucket's TTL (a lease's longest life).
func BrokerReleaseConsumerConfig(s Subjects) jetstream.ConsumerConfig {
	cfg := workerConsumer(BrokerReleaseConsumer, "kubeclip credential broker: run pods' addresses and the ends of leases and runs, which bind and release their grants")
	cfg.FilterSubjects = []string{s.RunKindFilter(KindStatus), s.RunKindFilter(KindResumed), s.RunKindFilter(KindReleased), s.RunKindFilter(KindResult), s.RunKindFilter(KindSuspended), s.RunKindFilter(KindFailed)}
	cfg.DeliverPolicy = jetstream.DeliverNewPolicy
	return cfg
}

func workerConsumer(name, description string) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:     name,
		Description: description,
		// Deliver everything the stream holds. A request published before the worker first
		// started must not be lost; a replay of old requests (a recreated consumer) is safe
		// because handlers are idempotent against the lease records, which outlive the lease
		// stream (Options.LeaseRecordTTL ≥ LeaseMaxAge).
		DeliverPolicy: jetstream.DeliverAllPolicy,
		// Explicit acks: only Consume's classifier acks, after the work is done.
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   ConsumerAckWait,
		// No BackOff: nats-server measures a NakWithDelay against the BackOff step of the
		// delivery count (delay + BackOff[n-1] - AckWait), so a BackOff would stretch Consume's
		// own 1, 2, 4 s retry schedule, and a busy agent's 1 s deferral, into minutes. A worker
		// that dies is covered by AckWait alone; MaxDeliver bounds a message that crashes workers.
		MaxDeliver:    ConsumerMaxDeliver,
		MaxAckPending: ConsumerMaxAckPending,
		ReplayPolicy:  jetstream.ReplayInstantPolicy,
	}
}
