package sandboxd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// Defaults of the daemon's settings.
const (
	DefaultListen         = ":7070"
	DefaultSocket         = "/kubeclip/run/sandboxd.sock"
	DefaultJournalDir     = "/kubeclip/run/journal"
	DefaultMaxOutputBytes = 256 << 20
	// DefaultOutputBytesLimit is how far a start's maxOutputBytes may raise its journal's cap
	// above MaxOutputBytes: a sync out (`sandboxd tar`) of up to DefaultSyncMaxBytes of files
	// with their headers. The journal files' disk bound (DefaultJournalDisk) still holds.
	DefaultOutputBytesLimit = 1280 << 20
	// DefaultJournalTTL keeps an exited command's journal long enough for a client that lost
	// its exec-worker to attach through another one, and no longer: bridge polls alone leave
	// about 5,000 journals per ten minutes.
	DefaultJournalTTL = 10 * time.Minute
	// DefaultExitGrace is how long output pipes are drained after the command exits, as
	// exec.Cmd's WaitDelay: enough for the last writes, short enough that a background process
	// holding the pipe does not hold the exec.
	DefaultExitGrace = 250 * time.Millisecond
	// DefaultHeartbeat is the idle interval of output streams' heartbeat frames; clients
	// declare a stream dead after a few missed ones.
	DefaultHeartbeat = time.Second
	// DefaultDrainLinger is how long a draining server waits, after its last command exited,
	// for the exit frames of the commands that were running when draining began to be read: a
	// client reconnecting at that moment still learns how its command ended.
	DefaultDrainLinger = 5 * time.Second
)

// Request body limits.
const (
	// maxSpecBytes: a spec's args and env go to execve, which takes about 2 MiB in all; JSON
	// escaping can double that.
	maxSpecBytes   = 4 << 20
	maxStdinBytes  = 64 << 20 // per request; Paperclip sends at most 4 MiB per exec
	maxSignalBytes = 4 << 10  // a signal or a resize
	// shutdownTimeout bounds the wait for output streams still being read after the last
	// command exited.
	shutdownTimeout = 5 * time.Second
)

// Options configure a Server.
type Options struct {
	Logger zerolog.Logger
	// Reaper is the process's one reaper; it must be running while the server is.
	Reaper *Reaper
	// Seed is the lease seed: the TCP listener serves TLS with ServerKey(Seed) and requires
	// ClientToken(Seed). Required with TCPAddr. With Unbound, it is the pod's bind seed. New
	// derives the key and token and keeps no reference to Seed: the caller zeroes it.
	Seed []byte
	// Unbound starts a warm pod's daemon: Seed is the bind seed, and the daemon answers only
	// POST /v1/bind (on TCP, with ClientToken(Seed)) until a bind installs a lease's seed and
	// environment (bind.go). Requires TCPAddr.
	Unbound bool
	// TCPAddr is the TLS listen address (":7070"); empty: no TCP listener.
	TCPAddr string
	// SocketPath is the unix socket (no TLS, no token); empty: none.
	SocketPath string
	JournalDir string
	// MaxOutputBytes caps each exec's journal: payload plus 14 bytes per chunk. A start's
	// maxOutputBytes sets its own cap, up to OutputBytesLimit (default
	// max(DefaultOutputBytesLimit, MaxOutputBytes)).
	MaxOutputBytes   int64
	OutputBytesLimit int64
	// JournalDisk bounds the journal files together (default DefaultJournalDisk).
	JournalDisk int64
	// JournalMemory bounds the memory of small journals, kept off disk; default
	// DefaultJournalMemory.
	JournalMemory int64
	// JournalTTL is how long an exited command's journal is kept without a DELETE.
	JournalTTL time.Duration
	// Env is the environment commands start from (the daemon's own); execspec.SeedEnv is dropped.
	Env []string
	// ExitGrace, Heartbeat and DrainLinger default to DefaultExitGrace, DefaultHeartbeat and
	// DefaultDrainLinger.
	ExitGrace   time.Duration
	Heartbeat   time.Duration
	DrainLinger time.Duration
	// Now defaults to time.Now.
	Now func() time.Time
}

// Server is the sandboxd daemon.
type Server struct {
	opts      Options
	log       zerolog.Logger
	listeners []net.Listener
	handlers  []http.Handler
	budget    *byteBudget // memory of in-memory journals
	disk      *byteBudget // disk of journal files
	devNull   *os.File    // every command without stdin reads it
	buffers   sync.Pool   // *[frameHeaderSize + readSize]byte for the output pumps
	// id is the current identity: replaced once, by a bind, when the daemon started unbound.
	id atomic.Pointer[identity]

	mu       sync.Mutex
	execs    map[string]*execution
	running  int
	draining bool
	drained  chan struct{} // closed when draining and nothing runs
	awaited  []*execution  // running when draining began: their exit frames are awaited
	journals uint64        // journals created, for unique file names
}

// New checks opts, prepares the journal directory (removing journals a previous daemon left) and
// opens the listeners.
func New(opts Options) (*Server, error) {
	if opts.Reaper == nil {
		return nil, errors.New("sandboxd: Options.Reaper is required")
	}
	if opts.TCPAddr == "" && opts.SocketPath == "" {
		return nil, errors.New("sandboxd: neither a TCP address nor a socket to listen on")
	}
	if opts.TCPAddr != "" && len(opts.Seed) != execspec.SeedSize {
		return nil, fmt.Errorf("sandboxd: the TCP listener needs a %d-byte seed (%s)", execspec.SeedSize, execspec.SeedEnv)
	}
	if opts.Unbound && opts.TCPAddr == "" {
		return nil, errors.New("sandboxd: an unbound daemon needs the TCP listener, where it is bound")
	}
	if opts.JournalDir == "" || opts.MaxOutputBytes <= frameHeaderSize || opts.JournalTTL <= 0 {
		return nil, errors.New("sandboxd: JournalDir, MaxOutputBytes and JournalTTL are required")
	}
	if opts.ExitGrace <= 0 {
		opts.ExitGrace = DefaultExitGrace
	}
	if opts.Heartbeat <= 0 {
		opts.Heartbeat = DefaultHeartbeat
	}
	if opts.DrainLinger <= 0 {
		opts.DrainLinger = DefaultDrainLinger
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.JournalMemory <= 0 {
		opts.JournalMemory = DefaultJournalMemory
	}
	if opts.OutputBytesLimit <= 0 {
		opts.OutputBytesLimit = max(DefaultOutputBytesLimit, opts.MaxOutputBytes)
	}
	if opts.OutputBytesLimit < opts.MaxOutputBytes {
		return nil, errors.New("sandboxd: OutputBytesLimit is below MaxOutputBytes")
	}
	if opts.JournalDisk <= 0 {
		opts.JournalDisk = DefaultJournalDisk
	}
	var env []string // an unbound daemon runs nothing until its bind sets the environment
	if !opts.Unbound {
		env = opts.Env
	}
	id, err := newIdentity(opts.Seed, opts.TCPAddr != "", !opts.Unbound, env)
	if err != nil {
		return nil, err
	}
	opts.Seed = nil
	if err := prepareJournalDir(opts.JournalDir); err != nil {
		return nil, err
	}
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", os.DevNull, err)
	}
	s := &Server{
		opts: opts, log: opts.Logger, execs: map[string]*execution{},
		budget: newByteBudget(opts.JournalMemory), disk: newByteBudget(opts.JournalDisk), devNull: devNull,
		buffers: sync.Pool{New: func() any { return new([frameHeaderSize + readSize]byte) }},
	}
	s.id.Store(id)
	api := s.logRequests(s.routes())
	if opts.TCPAddr != "" {
		l, err := net.Listen("tcp", opts.TCPAddr)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("listening on %s: %w", opts.TCPAddr, err)
		}
		cfg := serverTLSConfig(func() *tls.Certificate { return s.id.Load().cert })
		s.listeners = append(s.listeners, tls.NewListener(l, cfg))
		s.handlers = append(s.handlers, s.gate(true, api))
	}
	if opts.SocketPath != "" {
		l, err := listenUnix(opts.SocketPath)
		if err != nil {
			s.close()
			return nil, err
		}
		s.listeners = append(s.listeners, l)
		s.handlers = append(s.handlers, s.gate(false, api))
	}
	return s, nil
}

// TCPAddr is the TLS listener's address (useful with port 0), or nil.
func (s *Server) TCPAddr() net.Addr {
	if s.opts.TCPAddr == "" {
		return nil
	}
	return s.listeners[0].Addr()
}

func prepareJournalDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating the journal directory: %w", err)
	}
	stale, err := filepath.Glob(filepath.Join(dir, "*"+journalExt))
	if err != nil {
		return fmt.Errorf("listing the journal directory: %w", err)
	}
	for _, p := range stale {
		if err := os.Remove(p); err != nil {
			return fmt.Errorf("removing a stale journal: %w", err)
		}
	}
	return nil
}

func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("creating the socket directory: %w", err)
	}
	// A socket left by a previous daemon (the container restarted on the same emptyDir).
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(path)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", path, err)
	}
	// Only this user: the pod's processes (and `sandboxd proxy` through the exec API) run as it.
	if err := os.Chmod(path, 0o600); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("restricting %s: %w", path, err)
	}
	return l, nil
}

// close releases what New opened, for a Server that will not Run.
func (s *Server) close() {
	for _, l := range s.listeners {
		_ = l.Close()
	}
	_ = s.devNull.Close()
}

// Run serves until ctx is done, then drains: new execs are refused (503) while output, stdin
// and signals are still served for running ones, and Run returns nil once none is running. The
// pod's grace period bounds the wait (the kubelet kills the pod after it).
func (s *Server) Run(ctx context.Context) error {
	// Requests must outlive ctx: it ends when draining starts, not when serving stops.
	base := context.WithoutCancel(ctx)
	servers := make([]*http.Server, len(s.listeners))
	errc := make(chan error, len(s.listeners))
	for i, l := range s.listeners {
		servers[i] = &http.Server{
			Handler:           s.handlers[i],
			ReadHeaderTimeout: 10 * time.Second,
			// Longer than the client's IdleConnTimeout, so the client closes idle connections
			// first and never sends a request on one the server is closing.
			IdleTimeout: 2 * time.Minute,
			BaseContext: func(net.Listener) context.Context { return base },
			ErrorLog:    log.New(httpErrorLog{s.log}, "", 0),
		}
		go func() {
			err := servers[i].Serve(l)
			if errors.Is(err, http.ErrServerClosed) {
				err = nil
			}
			errc <- err
		}()
	}
	ev := s.log.Info().Str(LogKeySocket, s.opts.SocketPath).Str(LogKeyJournalDir, s.opts.JournalDir).Bool(LogKeyUnbound, s.opts.Unbound)
	if a := s.TCPAddr(); a != nil {
		ev = ev.Stringer(LogKeyAddr, a)
	}
	ev.Msg("sandboxd serving")

	var serveErr error
	pending := len(servers)
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
		pending--
	}
	drained := s.drain()
	if serveErr == nil {
		<-drained
		s.awaitExitsRead()
	}
	sctx, cancel := context.WithTimeout(base, shutdownTimeout)
	defer cancel()
	for _, srv := range servers {
		if err := srv.Shutdown(sctx); err != nil {
			_ = srv.Close()
		}
	}
	for range pending {
		serveErr = errors.Join(serveErr, <-errc)
	}
	s.stopTimers()
	_ = s.devNull.Close()
	if serveErr != nil {
		return fmt.Errorf("serving: %w", serveErr)
	}
	s.log.Info().Msg("sandboxd stopped")
	return nil
}

// drain stops admitting execs; the channel closes when none is running.
func (s *Server) drain() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.draining {
		s.draining = true
		s.drained = make(chan struct{})
		s.log.Info().Int(LogKeyRunning, s.running).Msg("draining: refusing new execs, waiting for running ones")
		for _, e := range s.execs {
			if e.running() {
				s.awaited = append(s.awaited, e)
			}
		}
		if s.running == 0 {
			close(s.drained)
		}
	}
	return s.drained
}

// awaitExitsRead waits, at most DrainLinger, until the exit frame of every exec that was running
// when draining began has been sent to a client.
func (s *Server) awaitExitsRead() {
	t := time.NewTimer(s.opts.DrainLinger)
	defer t.Stop()
	for _, e := range s.awaited {
		select {
		case <-e.exitSent:
		case <-t.C:
			s.log.Info().Msg("stopping without every exit frame read")
			return
		}
	}
}

// httpErrorLog sends net/http's own messages (TLS handshake failures, …) to the logger.
type httpErrorLog struct{ log zerolog.Logger }

func (l httpErrorLog) Write(p []byte) (int, error) {
	l.log.Debug().Msg(strings.TrimSpace(string(p)))
	return len(p), nil
}
