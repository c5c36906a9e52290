package natstest_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartServesJetStream(t *testing.T) {
	s, nc, js := natstest.Start(t)
	if !s.JetStreamEnabled() {
		t.Fatal("JetStream is not enabled")
	}
	if !nc.IsConnected() {
		t.Fatal("connection is not connected")
	}
	stream, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}})
	if err != nil {
		t.Fatalf("creating stream: %v", err)
	}
	if _, err := js.Publish(t.Context(), "t.x", []byte("hello")); err != nil {
		t.Fatalf("publishing: %v", err)
	}
	info, err := stream.Info(t.Context())
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	if info.State.Msgs != 1 {
		t.Errorf("stream holds %d messages, want 1", info.State.Msgs)
	}

	// A second client, as a second worker replica would be.
	nc2, _ := natstest.Connect(t, s)
	if !nc2.IsConnected() {
		t.Fatal("second connection is not connected")
	}
}

// TestManyConsumersOnAStream: every lease the plugin follows holds an ordered consumer on the run
// stream. nats-server refuses the 1,001st consumer of a stream, even one with MaxConsumers -1,
// unless its config raises default_max_consumers; the test server is configured as the shipped
// ones are (embeddednats.DefaultMaxConsumers).
func TestManyConsumersOnAStream(t *testing.T) {
	_, _, js := natstest.Start(t)
	stream, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "RUNS", Subjects: []string{"runs.>"}, MaxConsumers: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1100 {
		if _, err := stream.CreateConsumer(t.Context(), jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: time.Minute}); err != nil {
			t.Fatalf("consumer %d: %v", i+1, err)
		}
	}
}
