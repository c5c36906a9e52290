package ops_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/internal/ops"
)

// TestJetStreamCollectorReportsStreamsAndLag: what the collector says at scrape time is what
// the server holds: a stream's bytes and messages against its limits, a consumer's backlog and
// unacked deliveries, and its ack floor moving once a message is acked. A stream or consumer
// not created yet is left out without failing the scrape.
func TestJetStreamCollectorReportsStreamsAndLag(t *testing.T) {
	ctx := t.Context()
	_, _, js := natstest.Start(t)
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}, MaxBytes: 1 << 20, MaxMsgs: 100})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := js.Publish(ctx, "work.a", []byte("0123456789")); err != nil {
			t.Fatal(err)
		}
	}
	// Two delivered, one of them acked: 3 pending, 1 awaiting its ack, acked up to sequence 1.
	batch, err := cons.FetchNoWait(2)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	if len(msgs) != 2 {
		t.Fatalf("fetched %d messages, want 2", len(msgs))
	}
	if err := msgs[0].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}

	c := ops.NewJetStreamCollector()
	c.Watch(js, []string{"WORK", "ABSENT"}, []ops.ConsumerRef{{Stream: "WORK", Consumer: "worker"}, {Stream: "WORK", Consumer: "absent"}}, 0)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := `
# HELP kubeclip_consumer_ack_floor_sequence Stream sequence up to which a worker's durable consumer acked everything: it stops moving when nothing is acked.
# TYPE kubeclip_consumer_ack_floor_sequence gauge
kubeclip_consumer_ack_floor_sequence{consumer="worker",stream="WORK"} 1
# HELP kubeclip_consumer_ack_pending Messages of a worker's durable consumer delivered and not acked yet (num_ack_pending), retries waiting for their delay included.
# TYPE kubeclip_consumer_ack_pending gauge
kubeclip_consumer_ack_pending{consumer="worker",stream="WORK"} 1
# HELP kubeclip_consumer_pending Messages of a worker's durable consumer not delivered yet (num_pending): its backlog.
# TYPE kubeclip_consumer_pending gauge
kubeclip_consumer_pending{consumer="worker",stream="WORK"} 3
# HELP kubeclip_jetstream_scrape_ok 1 when JetStream answered every stream and consumer question of this scrape in time, else 0.
# TYPE kubeclip_jetstream_scrape_ok gauge
kubeclip_jetstream_scrape_ok 1
# HELP kubeclip_stream_max_bytes The stream's byte limit (MaxBytes); absent when it has none.
# TYPE kubeclip_stream_max_bytes gauge
kubeclip_stream_max_bytes{stream="WORK"} 1.048576e+06
# HELP kubeclip_stream_max_messages The stream's message limit (MaxMsgs); absent when it has none.
# TYPE kubeclip_stream_max_messages gauge
kubeclip_stream_max_messages{stream="WORK"} 100
# HELP kubeclip_stream_messages Messages a kubeclip stream holds.
# TYPE kubeclip_stream_messages gauge
kubeclip_stream_messages{stream="WORK"} 5
`
	names := []string{
		"kubeclip_consumer_ack_floor_sequence", "kubeclip_consumer_ack_pending", "kubeclip_consumer_pending",
		"kubeclip_jetstream_scrape_ok", "kubeclip_stream_max_bytes", "kubeclip_stream_max_messages", "kubeclip_stream_messages",
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), names...); err != nil {
		t.Error(err)
	}
	if got := value(t, reg, "kubeclip_stream_bytes"); got != float64(info.State.Bytes) || got == 0 {
		t.Errorf("kubeclip_stream_bytes = %v, want the stream's %d", got, info.State.Bytes)
	}
}

// TestJetStreamCollectorBoundsAScrape: against a JetStream that never answers (a server that
// is stuck, or a partition that drops requests), a scrape ends within the collector's timeout
// and says so (kubeclip_jetstream_scrape_ok 0) instead of hanging.
func TestJetStreamCollectorBoundsAScrape(t *testing.T) {
	c := ops.NewJetStreamCollector()
	c.Watch(stuckJetStream{}, []string{"RUNS"}, []ops.ConsumerRef{{Stream: "RUNS", Consumer: "dispatcher-result"}}, 200*time.Millisecond)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	start := time.Now()
	want := `
# HELP kubeclip_jetstream_scrape_ok 1 when JetStream answered every stream and consumer question of this scrape in time, else 0.
# TYPE kubeclip_jetstream_scrape_ok gauge
kubeclip_jetstream_scrape_ok 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("scrape took %s, want it bounded by the 200ms timeout", took)
	}
}

// stuckJetStream never answers: it waits for the question's context.
type stuckJetStream struct{}

func (stuckJetStream) Stream(ctx context.Context, _ string) (jetstream.Stream, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// value returns the value of the one series of gauge or counter name in reg.
func value(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.Metric) == 1 {
			if c := mf.Metric[0].GetCounter(); c != nil {
				return c.GetValue()
			}
			return mf.Metric[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("%s: no single series gathered", name)
	return 0
}
