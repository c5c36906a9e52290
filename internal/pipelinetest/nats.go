package pipelinetest

import (
	"fmt"
	"net"
	"sync"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/kubeclip/kubeclip/internal/embeddednats"
)

// NATS is the suite's embedded JetStream server. Its port and store are fixed at the first
// start, so Stop and Start (or Restart) bring the same server back: the workers, which keep
// reconnecting, find it where it was, with every stream and bucket it held.
type NATS struct {
	StoreDir string
	Port     int

	mu  sync.Mutex
	srv *server.Server
}

// StartNATS starts a server on a free port with its JetStream store in storeDir.
func StartNATS(storeDir string) (*NATS, error) {
	n := &NATS{StoreDir: storeDir, Port: -1}
	if err := n.Start(); err != nil {
		return nil, err
	}
	return n, nil
}

// URL is the server's client URL; it does not change across restarts.
func (n *NATS) URL() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return fmt.Sprintf("nats://%s:%d", embeddednats.DefaultHost, n.Port)
}

// Running reports whether the server is up.
func (n *NATS) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srv != nil
}

// Start starts the server on its port and store; it is a no-op while it runs.
func (n *NATS) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		return nil
	}
	srv, err := embeddednats.Start(embeddednats.Options{StoreDir: n.StoreDir, Port: n.Port})
	if err != nil {
		return fmt.Errorf("starting nats-server on port %d: %w", n.Port, err)
	}
	if n.Port <= 0 {
		addr, ok := srv.Addr().(*net.TCPAddr)
		if !ok {
			embeddednats.Shutdown(srv)
			return fmt.Errorf("nats-server listens on %v, not TCP", srv.Addr())
		}
		n.Port = addr.Port
	}
	n.srv = srv
	return nil
}

// Stop shuts the server down and waits until it released its port and store.
func (n *NATS) Stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	embeddednats.Shutdown(n.srv)
	n.srv = nil
}

// Restart stops the server and starts it again on the same port and store.
func (n *NATS) Restart() error {
	n.Stop()
	return n.Start()
}
