package ops

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
)

// ConsumerRef names a durable consumer on a stream.
type ConsumerRef struct {
	Stream, Consumer string
}

// StreamInfoer is the part of jetstream.JetStream the JetStream collector needs.
type StreamInfoer interface {
	Stream(ctx context.Context, name string) (jetstream.Stream, error)
}

var _ StreamInfoer = (jetstream.JetStream)(nil)

// DefaultJetStreamScrapeTimeout bounds the JetStream questions of one scrape: well inside
// Prometheus' default scrape timeout (10 s), so a slow or absent server costs a scrape its
// stream and consumer series, never the whole scrape.
const DefaultJetStreamScrapeTimeout = 3 * time.Second

// JetStreamCollector asks JetStream at scrape time how full kubeclip's streams are and how far
// behind the worker's consumers are. Labels are stream and consumer names, which kubeclip fixes
// (a handful), never subjects or ids. Until Watch it collects nothing.
type JetStreamCollector struct {
	mu        sync.Mutex
	js        StreamInfoer
	streams   []string
	consumers []ConsumerRef
	timeout   time.Duration

	streamBytes, streamMsgs, streamMaxBytes, streamMaxMsgs *prometheus.Desc
	pending, ackPending, redelivered, ackFloor             *prometheus.Desc
	up                                                     *prometheus.Desc
}

var _ prometheus.Collector = (*JetStreamCollector)(nil)

// NewJetStreamCollector returns a collector with nothing to watch yet.
func NewJetStreamCollector() *JetStreamCollector {
	stream := []string{"stream"}
	consumer := []string{"stream", "consumer"}
	return &JetStreamCollector{
		timeout:        DefaultJetStreamScrapeTimeout,
		streamBytes:    prometheus.NewDesc("kubeclip_stream_bytes", "Bytes a kubeclip stream holds, as JetStream reports it at scrape time.", stream, nil),
		streamMsgs:     prometheus.NewDesc("kubeclip_stream_messages", "Messages a kubeclip stream holds.", stream, nil),
		streamMaxBytes: prometheus.NewDesc("kubeclip_stream_max_bytes", "The stream's byte limit (MaxBytes); absent when it has none.", stream, nil),
		streamMaxMsgs:  prometheus.NewDesc("kubeclip_stream_max_messages", "The stream's message limit (MaxMsgs); absent when it has none.", stream, nil),
		pending:        prometheus.NewDesc("kubeclip_consumer_pending", "Messages of a worker's durable consumer not delivered yet (num_pending): its backlog.", consumer, nil),
		ackPending:     prometheus.NewDesc("kubeclip_consumer_ack_pending", "Messages of a worker's durable consumer delivered and not acked yet (num_ack_pending), retries waiting for their delay included.", consumer, nil),
		redelivered:    prometheus.NewDesc("kubeclip_consumer_redelivered", "Messages of a worker's durable consumer delivered more than once and not acked yet (num_redelivered).", consumer, nil),
		ackFloor:       prometheus.NewDesc("kubeclip_consumer_ack_floor_sequence", "Stream sequence up to which a worker's durable consumer acked everything: it stops moving when nothing is acked.", consumer, nil),
		up:             prometheus.NewDesc("kubeclip_jetstream_scrape_ok", "1 when JetStream answered every stream and consumer question of this scrape in time, else 0.", nil, nil),
	}
}

// Watch makes the collector report streams (every worker: the store filling is everyone's
// concern) and consumers (the durable consumers this worker consumes), each question of a
// scrape bounded by timeout together (<= 0: DefaultJetStreamScrapeTimeout).
func (c *JetStreamCollector) Watch(js StreamInfoer, streams []string, consumers []ConsumerRef, timeout time.Duration) {
	if timeout <= 0 {
		timeout = DefaultJetStreamScrapeTimeout
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.js, c.streams, c.consumers, c.timeout = js, streams, consumers, timeout
}

// Describe implements prometheus.Collector.
func (c *JetStreamCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.streamBytes, c.streamMsgs, c.streamMaxBytes, c.streamMaxMsgs, c.pending, c.ackPending, c.redelivered, c.ackFloor, c.up} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. A stream or consumer not created yet (the worker
// that owns it has not started) is left out without counting as a failure.
func (c *JetStreamCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	js, streams, consumers, timeout := c.js, c.streams, c.consumers, c.timeout
	c.mu.Unlock()
	if js == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ok := 1.0
	opened := map[string]jetstream.Stream{}
	open := func(name string) (jetstream.Stream, bool) {
		if st, done := opened[name]; done {
			return st, st != nil
		}
		st, err := js.Stream(ctx, name)
		if err != nil {
			st = nil
			if !errors.Is(err, jetstream.ErrStreamNotFound) {
				ok = 0
			}
		}
		opened[name] = st
		return st, st != nil
	}
	for _, name := range streams {
		st, found := open(name)
		if !found {
			continue
		}
		info := st.CachedInfo() // Stream fetched it just now
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, name)
		}
		gauge(c.streamBytes, float64(info.State.Bytes))
		gauge(c.streamMsgs, float64(info.State.Msgs))
		if info.Config.MaxBytes > 0 {
			gauge(c.streamMaxBytes, float64(info.Config.MaxBytes))
		}
		if info.Config.MaxMsgs > 0 {
			gauge(c.streamMaxMsgs, float64(info.Config.MaxMsgs))
		}
	}
	for _, ref := range consumers {
		st, found := open(ref.Stream)
		if !found {
			continue
		}
		cons, err := st.Consumer(ctx, ref.Consumer)
		if err != nil {
			if !errors.Is(err, jetstream.ErrConsumerNotFound) {
				ok = 0
			}
			continue
		}
		info := cons.CachedInfo()
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, ref.Stream, ref.Consumer)
		}
		gauge(c.pending, float64(info.NumPending))
		gauge(c.ackPending, float64(info.NumAckPending))
		gauge(c.redelivered, float64(info.NumRedelivered))
		gauge(c.ackFloor, float64(info.AckFloor.Stream))
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, ok)
}
