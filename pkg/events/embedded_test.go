package events_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
)

func TestEmbeddedServerKeepsStreamsAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	logger := testLogger(t)
	var s events.Subjects

	for round := range 2 {
		srv, err := events.StartEmbedded(events.EmbeddedOptions{StoreDir: dir, Port: -1, Logger: &logger})
		if err != nil {
			t.Fatalf("round %d: StartEmbedded: %v", round, err)
		}
		nc, err := nats.Connect(srv.ClientURL())
		if err != nil {
			events.ShutdownEmbedded(srv)
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
			p := newPublisher(t, js)
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
		events.ShutdownEmbedded(srv)
	}
}

func TestStartEmbeddedNeedsAStoreDir(t *testing.T) {
	if _, err := events.StartEmbedded(events.EmbeddedOptions{Port: -1}); err == nil {
		t.Fatal("StartEmbedded without a store dir should fail")
	}
}

func TestStreamsRejectOversizedMessages(t *testing.T) {
	srv, err := events.StartEmbedded(events.EmbeddedOptions{StoreDir: t.TempDir(), Port: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { events.ShutdownEmbedded(srv) })
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := events.EnsureStreams(t.Context(), js, events.Options{MaxMsgSize: 64 << 10}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(t.Context(), "paperclip.lease.c1.acquire", make([]byte, 64<<10+1)); err == nil {
		t.Error("the lease stream stored a message over its MaxMsgSize")
	}
	if _, err := js.Publish(t.Context(), "paperclip.lease.c1.acquire", make([]byte, 1024)); err != nil {
		t.Errorf("a small message was refused: %v", err)
	}
}
