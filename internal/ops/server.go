// Package ops is a worker's operational surface: the HTTP endpoints the kubelet and Prometheus
// call (/healthz, /readyz, /metrics) and the metrics the workers record through the observer
// hooks of pkg/events and pkg/runwatch.
//
// It is internal because it is wiring for the kubeclip binaries, not an API: libraries expose
// small observer interfaces (events.Observer, runwatch.Observer) and this package implements
// them with Prometheus collectors.
package ops

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"
)

// Server defaults.
const (
	// DefaultCheckTimeout bounds all readiness checks of one /readyz request together; the
	// kubelet's probe timeout (timeoutSeconds) should be longer.
	DefaultCheckTimeout = 2 * time.Second
	// shutdownTimeout bounds how long Run waits for in-flight requests after its context ended.
	shutdownTimeout = 2 * time.Second
)

// Check is one readiness condition, such as "connected to NATS".
type Check struct {
	Name string
	Func func(ctx context.Context) error
}

// Options configures a Server.
type Options struct {
	// Addr is the listen address, such as ":8080"; required. It must be reachable from the
	// node (not 127.0.0.1) for the kubelet's probes.
	Addr string
	// Gatherer serves /metrics; required.
	Gatherer prometheus.Gatherer
	// Logger receives the server's errors.
	Logger zerolog.Logger
	// CheckTimeout bounds the readiness checks of one request (default DefaultCheckTimeout).
	CheckTimeout time.Duration
	// Profiling serves Go's runtime profiles under /debug/pprof/ (net/http/pprof). Off unless
	// an operator asks: a CPU profile or trace costs the worker while it runs, and the heap
	// profile names the code's own allocation sites.
	Profiling bool
}

// Server serves /healthz, /readyz and /metrics, and /debug/pprof/ when asked to. It is not ready until SetReady is called and
// stops being ready when Stopping is called.
type Server struct {
	opts Options
	ln   net.Listener
	srv  *http.Server

	mu       sync.Mutex
	checks   []Check
	started  bool
	stopping bool
}

// Listen binds opts.Addr at once, so a port clash fails the worker's start-up instead of
// leaving it without probes; Run serves.
func Listen(opts Options) (*Server, error) {
	if opts.Addr == "" {
		return nil, errors.New("ops: Options.Addr is required")
	}
	if opts.Gatherer == nil {
		return nil, errors.New("ops: Options.Gatherer is required")
	}
	if opts.CheckTimeout <= 0 {
		opts.CheckTimeout = DefaultCheckTimeout
	}
	ln, err := net.Listen("tcp", opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s for /healthz, /readyz and /metrics: %w", opts.Addr, err)
	}
	s := &Server{opts: opts, ln: ln}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Gatherer, promhttp.HandlerOpts{
		ErrorLog: promLogger{opts.Logger}, ErrorHandling: promhttp.ContinueOnError,
	}))
	if opts.Profiling {
		mux.HandleFunc("GET /debug/pprof/", pprof.Index)
		mux.HandleFunc("GET /debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("GET /debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	}
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	return s, nil
}

// Addr is the address the server listens on (useful with port 0).
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// SetReady marks the worker started: from now on /readyz answers from checks.
func (s *Server) SetReady(checks ...Check) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checks = append([]Check(nil), checks...)
	s.started = true
}

// Stopping makes /readyz fail from now on: the worker is draining.
func (s *Server) Stopping() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopping = true
}

// Run serves until ctx is done, then lets in-flight requests finish for a moment. Cancel ctx
// only after the worker drained, so probes and a last scrape still answer while it does.
func (s *Server) Run(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving /healthz, /readyz and /metrics: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := s.srv.Shutdown(sctx); err != nil {
		_ = s.srv.Close()
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving /healthz, /readyz and /metrics: %w", err)
	}
	return nil
}

// healthz answers as long as the process serves HTTP. It deliberately checks no dependency: a
// NATS or API server outage must make the worker unready, not get it restarted in a loop.
func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("ok\n"))
}

// readyz answers 200 when the worker is ready (Ready), 503 otherwise, with one line per check.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	ok, report, checked := s.Ready(r.Context())
	if !ok {
		if checked {
			s.opts.Logger.Warn().Str("checks", strings.TrimSpace(report)).Msg("not ready")
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_, _ = w.Write([]byte(report))
}

// Ready runs every check concurrently, bounded by the check timeout, and reports whether all
// passed, with one line per check; checked is false when none ran (starting, shutting down).
func (s *Server) Ready(ctx context.Context) (ok bool, report string, checked bool) {
	s.mu.Lock()
	checks, started, stopping := s.checks, s.started, s.stopping
	s.mu.Unlock()
	switch {
	case stopping:
		return false, "not ready: shutting down\n", false
	case !started:
		return false, "not ready: starting\n", false
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.CheckTimeout)
	defer cancel()
	errs := make([]error, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Go(func() { errs[i] = c.Func(ctx) })
	}
	wg.Wait()
	var b strings.Builder
	ok = true
	for i, c := range checks {
		if errs[i] != nil {
			ok = false
			fmt.Fprintf(&b, "fail %s: %v\n", c.Name, errs[i])
			continue
		}
		fmt.Fprintf(&b, "ok %s\n", c.Name)
	}
	return ok, b.String(), true
}

// ReadyGauge is kubeclip_ready: 1 while Ready, evaluated at scrape time, so an alert sees what
// the kubelet's readiness probe sees. Prometheus calls it at scrape time with no context, so
// its checks are bounded by CheckTimeout alone.
func (s *Server) ReadyGauge() prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "kubeclip_ready",
		Help: "1 while the worker is ready (its /readyz checks pass, evaluated at scrape time), 0 while it starts, drains or a check fails.",
	}, func() float64 {
		if ok, _, _ := s.Ready(context.Background()); ok {
			return 1
		}
		return 0
	})
}

// promLogger routes promhttp's errors to the worker's logger.
type promLogger struct{ log zerolog.Logger }

func (l promLogger) Println(v ...any) { l.log.Error().Msg(fmt.Sprint(v...)) }
