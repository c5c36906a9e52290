// Package embeddednats runs a nats-server with JetStream inside this process, for the kubeclip
// demo and the test harnesses. It lives under internal/ so that no worker binary links
// nats-server: production deployments use a real NATS cluster.
package embeddednats

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"
)

// Defaults of Options.
const (
	// DefaultHost keeps a development server off the network.
	DefaultHost = "127.0.0.1"
	// DefaultServerName names the server in JetStream metadata.
	DefaultServerName = "kubeclip-embedded"
	// DefaultReadyTimeout bounds the wait for the server to accept connections on a loaded
	// machine.
	DefaultReadyTimeout = 10 * time.Second
)

// DefaultMaxConsumers is the consumers a stream may hold unless it sets its own bound, as the
// shipped server configs set it (default_max_consumers in deploy/kustomize/base/nats.conf, the
// production overlay's and hack/compose/nats.conf). nats-server's own default, 1,000, applies
// even to a stream with MaxConsumers -1; every lease the Paperclip plugin follows holds an
// ordered consumer on the run stream, so an installation stopped acquiring at about 1,000
// concurrent leases. The bound stays: a client that leaks consumers cannot grow them without end.
const DefaultMaxConsumers = 50_000

// Options configures the in-process nats-server.
type Options struct {
	// StoreDir holds JetStream's file storage; required, so streams survive a restart.
	StoreDir string
	// Host to listen on (default 127.0.0.1: a dev server is not for the network).
	Host string
	// Port to listen on: 0 means NATS's default 4222, -1 a random free port (read it back with
	// Server.ClientURL).
	Port int
	// ServerName names the server in JetStream metadata (default "kubeclip-embedded").
	ServerName string
	// ReadyTimeout bounds the wait for the server to accept connections (default 10 s).
	ReadyTimeout time.Duration
	// Logger receives the server's log at notice level and above; nil silences it.
	Logger *zerolog.Logger
}

// Start starts a nats-server with JetStream in this process and waits until it accepts
// connections. Stop it with Shutdown.
func Start(opts Options) (*server.Server, error) {
	if opts.StoreDir == "" {
		return nil, errors.New("embeddednats: Options.StoreDir is required")
	}
	if opts.Host == "" {
		opts.Host = DefaultHost
	}
	if opts.ServerName == "" {
		opts.ServerName = DefaultServerName
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = DefaultReadyTimeout
	}
	s, err := server.NewServer(&server.Options{
		ServerName:      opts.ServerName,
		Host:            opts.Host,
		Port:            opts.Port,
		JetStream:       true,
		StoreDir:        opts.StoreDir,
		JetStreamLimits: server.JSLimitOpts{DefaultMaxConsumers: DefaultMaxConsumers},
		// The caller's main owns signal handling (signal.NotifyContext).
		NoSigs: true,
		NoLog:  opts.Logger == nil,
	})
	if err != nil {
		return nil, fmt.Errorf("configuring embedded nats-server: %w", err)
	}
	if opts.Logger != nil {
		s.SetLoggerV2(serverLogger{opts.Logger}, false, false, false)
	}
	go s.Start()
	if !s.ReadyForConnections(opts.ReadyTimeout) {
		Shutdown(s)
		return nil, fmt.Errorf("embedded nats-server on %s:%d not ready after %s", opts.Host, opts.Port, opts.ReadyTimeout)
	}
	if !s.JetStreamEnabled() {
		Shutdown(s)
		return nil, fmt.Errorf("embedded nats-server: JetStream failed to start (store dir %s)", opts.StoreDir)
	}
	return s, nil
}

// Shutdown stops s and waits until it has released its ports and store.
func Shutdown(s *server.Server) {
	if s == nil {
		return
	}
	s.Shutdown()
	s.WaitForShutdown()
}

// serverLogger adapts zerolog to nats-server's logger. Fatalf logs at error level and does not
// exit: only main exits.
type serverLogger struct{ l *zerolog.Logger }

var _ server.Logger = serverLogger{}

func (s serverLogger) Noticef(format string, v ...any) { s.l.Info().Msg(fmt.Sprintf(format, v...)) }
func (s serverLogger) Warnf(format string, v ...any)   { s.l.Warn().Msg(fmt.Sprintf(format, v...)) }
func (s serverLogger) Fatalf(format string, v ...any)  { s.l.Error().Msg(fmt.Sprintf(format, v...)) }
func (s serverLogger) Errorf(format string, v ...any)  { s.l.Error().Msg(fmt.Sprintf(format, v...)) }
func (s serverLogger) Debugf(format string, v ...any)  { s.l.Debug().Msg(fmt.Sprintf(format, v...)) }
func (s serverLogger) Tracef(format string, v ...any)  { s.l.Trace().Msg(fmt.Sprintf(format, v...)) }
