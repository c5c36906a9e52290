package events

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Retries wait outside the consumer that first met them. A message whose handler failed
// retryably stays pending on its consumer while it waits for its backoff (NakWithDelay), and
// nats-server redelivers due messages ahead of new ones: one company's thousands of failing
// requests then fill MaxAckPending and take every handler slot, and another company's first
// attempt waits minutes (issue 15 item 19). With a RetryQueue, Consume copies such a message to
// the worker's own subject of KUBECLIP_RETRY, with its attempt count and when it is due, and
// acknowledges it: the worker's consumer holds only first attempts, and a second Consume on
// RetryConsumerConfig works through the retries with handler slots of its own. The dispatcher's
// busy-agent parking (pkg/dispatch) is the same idea for waiting work, which waits for an agent,
// not for a time.
const (
	// RetryStream holds every worker's retries, one subject per worker and original subject:
	// kubeclip.retry.<queue>.<original subject>.
	RetryStream = "KUBECLIP_RETRY"
	// retrySubjectPrefix starts every retry subject. Only kubeclip's workers may publish there
	// (nats-auth.conf), and Consume honours the retry headers only on these subjects, so a client
	// cannot forge an attempt count or a subject.
	retrySubjectPrefix = "kubeclip.retry."
	// HeaderRetryAttempt is how many deliveries the retried message has had in all.
	HeaderRetryAttempt = "Kubeclip-Retry-Attempt"
	// HeaderRetryAt is when the retry is due (RFC 3339 nano).
	HeaderRetryAt = "Kubeclip-Retry-At"
	// HeaderRetryOrigin names the first message (stream and sequence), for the copies' message
	// ids: a redelivered message moved twice leaves one copy per attempt.
	HeaderRetryOrigin = "Kubeclip-Retry-Origin"
	// retryMaxAge drops a retry no worker got to in a day, like the work queue's own age limit.
	retryMaxAge = 24 * time.Hour
)

// RetryStreamConfig is the KUBECLIP_RETRY stream: work-queue retention (a retry is deleted when
// its handler settles it), file storage (a retry is a request Paperclip waits for), the work
// queue's message size, and its share of the store (StoreLimit): full, it refuses new
// retries (a request that cannot wait there is handed back to its consumer), never dropping one.
func RetryStreamConfig(replicas int, storeBytes int64) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        RetryStream,
		Description: "kubeclip requests waiting to be retried, outside the consumer that first met them",
		Subjects:    []string{retrySubjectPrefix + ">"},
		Retention:   jetstream.WorkQueuePolicy,
		Discard:     jetstream.DiscardNew,
		MaxAge:      retryMaxAge,
		MaxMsgs:     -1,
		MaxBytes:    StoreLimit(storeBytes, StoreRetry),
		MaxMsgSize:  DefaultMaxMsgSize,
		Duplicates:  DefaultDuplicates,
		Storage:     jetstream.FileStorage,
		Replicas:    max(replicas, 1),
	}
}

// RetryConsumerConfig is the durable consumer of queue's retries ("<queue>-retry"). A retry's
// attempts are counted in HeaderRetryAttempt, from the first consumer's first delivery, against
// this consumer's MaxDeliver (ConsumerMaxDeliver, the first consumer's too); one copy is
// delivered about twice (once before it is due, once to run), well within it.
func RetryConsumerConfig(queue string) jetstream.ConsumerConfig {
	cfg := workerConsumer(queue+"-retry", "kubeclip "+queue+": retries")
	cfg.FilterSubject = retrySubjectPrefix + queue + ".>"
	return cfg
}

// RetryPublisher is the part of jetstream.JetStream a RetryQueue needs.
type RetryPublisher interface {
	PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}

var _ RetryPublisher = (jetstream.JetStream)(nil)

// RetryQueue is a worker's queue of retries in KUBECLIP_RETRY (ConsumeOptions.Retries).
type RetryQueue struct {
	// Publisher puts retries into KUBECLIP_RETRY.
	Publisher RetryPublisher
	// Name is the queue's subject token, the worker's consumer name (TenantWorkerConsumer).
	Name string
}

func (q *RetryQueue) subjectPrefix() string { return retrySubjectPrefix + q.Name + "." }

// move copies d's message into the queue, due after delay; the caller then acknowledges it.
func (q *RetryQueue) move(ctx context.Context, d *delivery, delay time.Duration, now time.Time) error {
	msg := nats.NewMsg(q.subjectPrefix() + d.m.Subject())
	msg.Data = d.m.Data()
	for k, v := range d.m.Headers() {
		if !strings.HasPrefix(k, "Nats-") && !strings.HasPrefix(k, "Kubeclip-Retry-") {
			msg.Header[k] = v
		}
	}
	origin := d.m.Headers().Get(HeaderRetryOrigin)
	if origin == "" {
		md, err := d.m.Metadata()
		if err != nil {
			return fmt.Errorf("reading the message's metadata: %w", err)
		}
		origin = md.Stream + "." + strconv.FormatUint(md.Sequence.Stream, 10)
	}
	attempt := strconv.FormatUint(d.attempt, 10)
	msg.Header.Set(HeaderRetryOrigin, origin)
	msg.Header.Set(HeaderRetryAttempt, attempt)
	msg.Header.Set(HeaderRetryAt, now.Add(delay).UTC().Format(time.RFC3339Nano))
	msg.Header.Set(jetstream.MsgIDHeader, "retry."+q.Name+"."+origin+"."+attempt)
	if _, err := q.Publisher.PublishMsg(ctx, msg, jetstream.WithExpectStream(RetryStream)); err != nil {
		return fmt.Errorf("moving the message to the retry queue: %w", err)
	}
	return nil
}

// retried is a message of the retry queue as its handler sees it: on its original subject.
type retried struct {
	jetstream.Msg
	subject string
}

func (m retried) Subject() string { return m.subject }

// asRetry reads m as one of q's retries: the message its handler sees, how many deliveries it
// had before this one, and when it is due. ok is false for any other message, also one that
// carries retry headers on another subject.
func (q *RetryQueue) asRetry(m jetstream.Msg) (msg jetstream.Msg, before uint64, due time.Time, ok bool) {
	if q == nil {
		return m, 0, time.Time{}, false
	}
	subject, found := strings.CutPrefix(m.Subject(), q.subjectPrefix())
	if !found || subject == "" {
		return m, 0, time.Time{}, false
	}
	before, err := strconv.ParseUint(m.Headers().Get(HeaderRetryAttempt), 10, 64)
	if err != nil {
		return m, 0, time.Time{}, false
	}
	due, _ = time.Parse(time.RFC3339Nano, m.Headers().Get(HeaderRetryAt))
	return retried{Msg: m, subject: subject}, before, due, true
}

// notDue is a retry taken before its time: it waits again, without counting as an attempt.
type notDue struct{ wait time.Duration }

func (e notDue) Error() string { return "retry not due for " + e.wait.String() }
