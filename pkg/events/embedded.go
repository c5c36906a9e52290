package events

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"
)

// Embedded server defaults.
const (
	DefaultEmbeddedHost         = "127.0.0.1"
	DefaultEmbeddedServerName   = "kubeclip-embedded"
	DefaultEmbeddedReadyTimeout = 10 * time.Second
)

// EmbeddedOptions configures the in-process nats-server for development and demos.
type EmbeddedOptions struct {
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

// StartEmbedded starts a nats-server with JetStream in this process and waits until it accepts
// connections. Stop it with ShutdownEmbedded. Production deployments use a real NATS cluster.
func StartEmbedded(opts EmbeddedOptions) (*server.Server, error) {
	if opts.StoreDir == "" {
		return nil, errors.New("events: EmbeddedOptions.StoreDir is required")
	}
	if opts.Host == "" {
		opts.Host = DefaultEmbeddedHost
	}
	if opts.ServerName == "" {
		opts.ServerName = DefaultEmbeddedServerName
	}
	if opts.ReadyTimeout <= 0 {
		opts.ReadyTimeout = DefaultEmbeddedReadyTimeout
	}
	s, err := server.NewServer(&server.Options{
		ServerName: opts.ServerName,
		Host:       opts.Host,
		Port:       opts.Port,
		JetStream:  true,
		StoreDir:   opts.StoreDir,
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
		ShutdownEmbedded(s)
		return nil, fmt.Errorf("embedded nats-server on %s:%d not ready after %s", opts.Host, opts.Port, opts.ReadyTimeout)
	}
	if !s.JetStreamEnabled() {
		ShutdownEmbedded(s)
		return nil, fmt.Errorf("embedded nats-server: JetStream failed to start (store dir %s)", opts.StoreDir)
	}
	return s, nil
}

// ShutdownEmbedded stops s and waits until it has released its ports and store.
func ShutdownEmbedded(s *server.Server) {
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
