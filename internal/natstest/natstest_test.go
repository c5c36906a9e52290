package natstest_test

import (
	"testing"

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
