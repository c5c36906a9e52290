package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// The queues service: where each queue worker's oldest unacknowledged request stands, for
// `kubeclip status` (docs/monitoring.md, `kubeclip status`). The requests themselves are the companies' (an acquire's
// config carries its environment, the run stream the runs' output), so the status user reads
// none of them (issue 26, item 11): a worker that may reads the first message each consumer's
// filters take after its ack floor and answers its sequence and time only.

// QueuesSubject is the subject of the queues service.
func QueuesSubject(s events.Subjects) string { return s.Prefix() + ".api.queues" }

// QueueConsumer is a queue worker's durable consumer, where its requests wait.
type QueueConsumer struct {
	Worker, Stream, Consumer string
}

// QueueConsumers are the durable consumers of the queue workers (pkg/tenant, pkg/dispatch), by
// worker. The run-watcher and the exec-worker read no queue.
func QueueConsumers(s events.Subjects) []QueueConsumer {
	return []QueueConsumer{
		{"dispatcher", s.LeaseStream(), events.DispatcherEndConsumer},
		{"dispatcher", s.RunStream(), events.DispatcherResultConsumer},
		{"dispatcher", events.WorkStream, events.DispatcherConsumer},
		{"tenant-worker", s.LeaseStream(), events.TenantWorkerConsumer},
		{"tenant-worker", events.RetryStream, events.RetryConsumerConfig(events.TenantWorkerConsumer).Durable},
	}
}

// OldestRequest is where one consumer's oldest unacknowledged request stands: its stream
// sequence and when it was stored; both zero when the consumer holds none.
type OldestRequest struct {
	Stream   string     `json:"stream"`
	Consumer string     `json:"consumer"`
	Seq      uint64     `json:"seq,omitempty"`
	At       *time.Time `json:"at,omitempty"`
	// Absent: the consumer does not exist (its worker never started).
	Absent bool `json:"absent,omitempty"`
	// Error says what could not be read, naming it.
	Error string `json:"error,omitempty"`
}

// QueuesReply answers a queues request: one entry per QueueConsumers, in its order.
type QueuesReply struct {
	Oldest []OldestRequest `json:"oldest"`
}

// serviceQueues names the queues service in logs and metrics.
const serviceQueues = "queues"

// queuesRequestTimeout bounds each read the service makes for one request.
const queuesRequestTimeout = 3 * time.Second

// statusReplies is the inbox of the operator's status user (pkg/inbox.StatusPrefix), which the
// queues service answers besides the clients'.
var statusReplies = inbox.MustRule(inbox.StatusPrefix)

// ServeQueues answers queues requests in the queue group until ctx ends or the connection is
// drained: for each of QueueConsumers, its oldest unacknowledged request's sequence and time,
// read with js (which may read those streams). A request whose reply subject is neither a
// client's inbox (ServeOptions.Replies) nor the status user's is dropped. Its reads are bounded
// by ctx, so when ctx ends it unsubscribes: a request after that goes to another worker of the
// queue group (or meets no responders), never to reads that fail at once.
func ServeQueues(ctx context.Context, nc *nats.Conn, o ServeOptions, js jetstream.JetStream) (*nats.Subscription, error) {
	subject := QueuesSubject(o.Subjects)
	consumers := QueueConsumers(o.Subjects)
	sub, err := nc.QueueSubscribe(subject, QueueGroup, func(m *nats.Msg) {
		if !statusReplies.Allows(m.Reply) && !o.answerable(serviceQueues, m) {
			return
		}
		reply := QueuesReply{Oldest: make([]OldestRequest, len(consumers))}
		for i, c := range consumers {
			reply.Oldest[i] = oldestRequest(ctx, js, c)
		}
		data, err := json.Marshal(reply)
		if err != nil {
			return
		}
		_ = m.Respond(data)
	})
	sub, err = registered(nc, sub, subject, err)
	if err != nil {
		return nil, err
	}
	context.AfterFunc(ctx, func() { _ = sub.Unsubscribe() })
	return sub, nil
}

// oldestRequest reads c's info and, when it holds requests, the first message its filters take
// after its ack floor, which is the oldest it has not acknowledged: one get per filter subject
// (next_by_subj), whatever the backlog.
func oldestRequest(ctx context.Context, js jetstream.JetStream, c QueueConsumer) OldestRequest {
	ctx, cancel := context.WithTimeout(ctx, queuesRequestTimeout)
	defer cancel()
	out := OldestRequest{Stream: c.Stream, Consumer: c.Consumer}
	cons, err := js.Consumer(ctx, c.Stream, c.Consumer)
	switch {
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		out.Absent = true
		return out
	case err != nil:
		out.Error = fmt.Sprintf("reading consumer %s of stream %s: %v", c.Consumer, c.Stream, err)
		return out
	}
	// Not the info's pending counts: a request stored a moment ago may not be counted yet, and
	// the get after the ack floor finds it all the same.
	info := cons.CachedInfo()
	stream, err := js.Stream(ctx, c.Stream)
	if err != nil {
		out.Error = fmt.Sprintf("reading stream %s for consumer %s's oldest request: %v", c.Stream, c.Consumer, err)
		return out
	}
	filters := info.Config.FilterSubjects
	if info.Config.FilterSubject != "" {
		filters = append(filters, info.Config.FilterSubject)
	}
	if len(filters) == 0 {
		filters = []string{">"}
	}
	var oldest *jetstream.RawStreamMsg
	for _, f := range filters {
		m, err := stream.GetMsg(ctx, info.AckFloor.Stream+1, jetstream.WithGetMsgSubject(f))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			out.Error = fmt.Sprintf("reading consumer %s's oldest request on %s from stream %s: %v", c.Consumer, f, c.Stream, err)
			return out
		}
		if oldest == nil || m.Sequence < oldest.Sequence {
			oldest = m
		}
	}
	if oldest != nil {
		at := oldest.Time.UTC()
		out.Seq, out.At = oldest.Sequence, &at
	}
	return out
}
