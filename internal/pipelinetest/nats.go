package pipelinetest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/kubeclip/kubeclip/internal/embeddednats"
)

// natsStopTimeout bounds a server process's graceful shutdown (SIGTERM) before it is killed.
const natsStopTimeout = 30 * time.Second

// NATS is the suite's JetStream server: embedded in the test process (StartNATS), or the
// pinned nats-server binary as a process of its own (StartNATSProcess). Its port and store are
// fixed at the first start, so Stop and Start (or Restart) bring the same server back: the
// workers, which keep reconnecting, find it where it was, with every stream and bucket it held.
type NATS struct {
	StoreDir string
	Port     int

	// bin is the nats-server binary of a process server, "" for an embedded one; conf and
	// logPath are its configuration and the log it appends to.
	bin, conf, logPath string

	mu  sync.Mutex
	srv *server.Server
	// cmd and exited are the running process of a process server.
	cmd    *exec.Cmd
	exited chan struct{}
}

// StartNATS starts a server in this process on a free port with its JetStream store in
// storeDir.
func StartNATS(storeDir string) (*NATS, error) {
	n := &NATS{StoreDir: storeDir, Port: -1}
	if err := n.Start(); err != nil {
		return nil, err
	}
	return n, nil
}

// StartNATSProcess starts bin, a nats-server binary, as a process of its own on a free port with
// its JetStream store in storeDir and the embedded server's settings (natsProcessConf), its log
// appended to logPath. A suite runs it so that its server is built and scheduled as production
// runs one (no race detector, not sharing the test process's CPU and garbage collector);
// see Options.NATSProcess.
func StartNATSProcess(storeDir, bin, logPath string) (*NATS, error) {
	if bin == "" {
		return nil, errors.New("StartNATSProcess: the nats-server binary is required")
	}
	l, err := net.Listen("tcp", embeddednats.DefaultHost+":0")
	if err != nil {
		return nil, fmt.Errorf("finding a free port for nats-server: %w", err)
	}
	addr, ok := l.Addr().(*net.TCPAddr)
	_ = l.Close()
	if !ok {
		return nil, fmt.Errorf("finding a free port for nats-server: listening on %v, not TCP", l.Addr())
	}
	port := addr.Port
	n := &NATS{StoreDir: storeDir, Port: port, bin: bin, logPath: logPath, conf: storeDir + ".conf"}
	if err := os.MkdirAll(filepath.Dir(n.conf), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(n.conf, []byte(natsProcessConf(port, storeDir)), 0o600); err != nil {
		return nil, fmt.Errorf("writing nats-server's configuration: %w", err)
	}
	if err := n.Start(); err != nil {
		return nil, err
	}
	return n, nil
}

// natsProcessConf is what embeddednats.Start sets, as a configuration file: the same host,
// server name and default_max_consumers, JetStream in storeDir, every other limit (payload, file
// and memory store) the server's default, as the embedded server leaves them.
func natsProcessConf(port int, storeDir string) string {
	return fmt.Sprintf(`server_name: %s
listen: %s:%d
jetstream {
  store_dir: %q
  limits { default_max_consumers: %d }
}
`, embeddednats.DefaultServerName, embeddednats.DefaultHost, port, storeDir, embeddednats.DefaultMaxConsumers)
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
	return n.srv != nil || n.cmd != nil
}

// Start starts the server on its port and store; it is a no-op while it runs.
func (n *NATS) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.bin != "" {
		return n.startProcess()
	}
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

// startProcess starts the server's process and waits until it accepts connections with
// JetStream up, as embeddednats.Start does. n.mu is held.
func (n *NATS) startProcess() error {
	if n.cmd != nil {
		return nil
	}
	logFile, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("opening nats-server's log: %w", err)
	}
	// What an earlier start of the server logged is not this start's readiness.
	logged, err := logFile.Seek(0, io.SeekEnd)
	if err != nil {
		logFile.Close()
		return fmt.Errorf("reading nats-server's log: %w", err)
	}
	cmd := exec.Command(n.bin, "-c", n.conf)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("starting nats-server %s on port %d: %w", n.bin, n.Port, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(exited)
	}()
	n.cmd, n.exited = cmd, exited
	// The server logs that it is ready once JetStream has recovered its store and the client
	// port listens; a process has no ReadyForConnections to ask.
	deadline := time.Now().Add(embeddednats.DefaultReadyTimeout)
	for {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("%s:%d", embeddednats.DefaultHost, n.Port), time.Second)
		if err == nil {
			conn.Close()
			if log, _ := os.ReadFile(n.logPath); int64(len(log)) > logged && strings.Contains(string(log[logged:]), "Server is ready") {
				return nil
			}
		}
		select {
		case <-exited:
			n.cmd = nil
			return fmt.Errorf("nats-server on port %d exited at start (log %s)", n.Port, n.logPath)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			n.stopProcess()
			return fmt.Errorf("nats-server on port %d not ready after %s (log %s)", n.Port, embeddednats.DefaultReadyTimeout, n.logPath)
		}
	}
}

// Stop shuts the server down and waits until it released its port and store.
func (n *NATS) Stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.bin != "" {
		n.stopProcess()
		return
	}
	embeddednats.Shutdown(n.srv)
	n.srv = nil
}

// stopProcess stops the server's process as a shut-down server stops (SIGTERM: it flushes its
// store and exits), killing it if it has not exited within natsStopTimeout. n.mu is held.
func (n *NATS) stopProcess() {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.exited:
	case <-time.After(natsStopTimeout):
		_ = n.cmd.Process.Kill()
		<-n.exited
	}
	n.cmd = nil
}

// Restart stops the server and starts it again on the same port and store.
func (n *NATS) Restart() error {
	n.Stop()
	return n.Start()
}
