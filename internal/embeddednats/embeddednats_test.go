package embeddednats_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/internal/embeddednats"
	"github.com/kubeclip/kubeclip/pkg/events"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestEmbeddedServerKeepsStreamsAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	logger := zerolog.New(zerolog.NewTestWriter(t))
	var s events.Subjects

	for round := range 2 {
		srv, err := embeddednats.Start(embeddednats.Options{StoreDir: dir, Port: -1, Logger: &logger})
		if err != nil {
			t.Fatalf("round %d: Start: %v", round, err)
		}
		nc, err := nats.Connect(srv.ClientURL())
		if err != nil {
			embeddednats.Shutdown(srv)
			t.Fatal(err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		if err := events.EnsureStreams(t.Context(), js, events.Options{}); err != nil {
			t.Fatalf("round %d: EnsureStreams: %v", round, err)
		}
		if round == 0 {
			p, err := events.NewPublisher(events.PublisherOptions{JS: js})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := p.Publish(t.Context(), events.RunStatusEvent{RunID: "r1", CompanyID: "c1", Phase: events.PhaseRunning}); err != nil {
				t.Fatal(err)
			}
		}
		st, err := js.Stream(t.Context(), s.RunStream())
		if err != nil {
			t.Fatal(err)
		}
		if n := st.CachedInfo().State.Msgs; n != 1 {
			t.Errorf("round %d: run stream holds %d messages, want 1 (file storage survives a restart)", round, n)
		}
		nc.Close()
		embeddednats.Shutdown(srv)
	}
}

func TestStartNeedsAStoreDir(t *testing.T) {
	if _, err := embeddednats.Start(embeddednats.Options{Port: -1}); err == nil {
		t.Fatal("Start without a store dir should fail")
	}
}
