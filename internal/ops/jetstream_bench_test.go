package ops_test

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/internal/ops"
)

// BenchmarkJetStreamCollectorScrape measures what the collector adds to one scrape: 5 streams
// and 3 consumers (the dispatcher's), against an in-process server.
func BenchmarkJetStreamCollectorScrape(b *testing.B) {
	ctx := b.Context()
	_, _, js := natstest.Start(b)
	var streams []string
	var consumers []ops.ConsumerRef
	for i := range 5 {
		name := fmt.Sprint("S", i)
		st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{fmt.Sprintf("s%d.>", i)}, MaxBytes: 1 << 30})
		if err != nil {
			b.Fatal(err)
		}
		streams = append(streams, name)
		if i < 3 {
			if _, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
				b.Fatal(err)
			}
			consumers = append(consumers, ops.ConsumerRef{Stream: name, Consumer: "c"})
		}
	}
	c := ops.NewJetStreamCollector()
	c.Watch(js, streams, consumers, 0)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	for b.Loop() {
		if _, err := reg.Gather(); err != nil {
			b.Fatal(err)
		}
	}
}
