// Package natstest gives tests a real in-process nats-server with JetStream, stored in
// t.TempDir() and shut down by t.Cleanup.
package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsservertest "github.com/nats-io/nats-server/v2/test"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/embeddednats"
)

// readyTimeout bounds server start-up and connection close on a loaded CI machine.
const readyTimeout = 10 * time.Second

// Start runs a JetStream server on a random port and returns it with a connection and its
// JetStream context. Cleanup drains the connection, then shuts the server down and waits for
// it, so goleak sees nothing left behind.
func Start(t testing.TB) (*server.Server, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	return StartWithStore(t, 0)
}

// StartWithStore is Start with a JetStream file store of maxStore bytes (0: the server's
// default), as a shipped server's max_file_store: the server refuses a stream or bucket whose
// byte limit does not fit what the others reserved.
func StartWithStore(t testing.TB, maxStore int64) (*server.Server, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	opts := natsservertest.DefaultTestOptions // a copy: the package variable is shared
	opts.Port = -1
	opts.JetStream = true
	opts.StoreDir = t.TempDir()
	if maxStore > 0 {
		opts.JetStreamMaxStore = maxStore
	}
	// As the shipped servers are configured: nats-server's default refuses a stream's 1,001st
	// consumer.
	opts.JetStreamLimits.DefaultMaxConsumers = embeddednats.DefaultMaxConsumers
	s, err := server.NewServer(&opts)
	if err != nil {
		t.Fatalf("natstest: configuring nats-server: %v", err)
	}
	go s.Start()
	if !s.ReadyForConnections(readyTimeout) {
		s.Shutdown()
		s.WaitForShutdown()
		t.Fatalf("natstest: nats-server not ready after %s", readyTimeout)
	}
	// Registered first so it runs last, after every connection's cleanup.
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	nc, js := Connect(t, s)
	return s, nc, js
}

// Connect opens another connection to s, for tests that need a second client (a second
// worker replica). Cleanup drains it and waits until it is closed.
func Connect(t testing.TB, s *server.Server) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	closed := make(chan struct{})
	nc, err := nats.Connect(s.ClientURL(),
		nats.Name(t.Name()),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }),
	)
	if err != nil {
		t.Fatalf("natstest: connecting to %s: %v", s.ClientURL(), err)
	}
	t.Cleanup(func() {
		if err := nc.Drain(); err != nil {
			nc.Close()
		}
		select {
		case <-closed:
		case <-time.After(readyTimeout):
			t.Errorf("natstest: connection not closed %s after drain", readyTimeout)
			nc.Close()
		}
	})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: creating JetStream context: %v", err)
	}
	return nc, js
}
