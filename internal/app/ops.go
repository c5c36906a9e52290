package app

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/internal/ops"
)

// Ops is a worker's operational side: its metrics, and the server of /healthz, /readyz and
// /metrics when --ops-addr is set.
type Ops struct {
	// Metrics is the observer to hand to the worker (events.Observer, runwatch.Observer).
	Metrics *ops.Metrics
	// registry is where the worker's metrics are registered (the self-check's too).
	registry  *prometheus.Registry
	selfCheck *ops.SelfCheck
	server    *ops.Server
	cancel    context.CancelFunc
	done      chan error
}

// StartOps builds the worker's metrics registry and, when --ops-addr is set, starts serving.
// The server keeps answering after ctx ends (readiness failing) until Close, so probes and a
// last scrape still work while the worker drains. Call Close after the worker returned.
func (c *Common) StartOps(ctx context.Context, log zerolog.Logger) (*Ops, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	m, err := ops.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	o := &Ops{Metrics: m, registry: reg}
	if c.OpsAddr == "" {
		return o, nil
	}
	srv, err := ops.Listen(ops.Options{Addr: c.OpsAddr, Gatherer: reg, Logger: log, Profiling: c.Pprof})
	if err != nil {
		return nil, err
	}
	serveCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	o.server, o.cancel, o.done = srv, cancel, make(chan error, 1)
	go func() {
		select {
		case <-ctx.Done():
			srv.Stopping()
		case <-serveCtx.Done():
		}
	}()
	go func() { o.done <- srv.Run(serveCtx) }()
	log.Info().Str("addr", srv.Addr().String()).Msg("serving /healthz, /readyz and /metrics")
	return o, nil
}

// Ready makes /readyz answer from the worker's connections: ready while NATS is connected
// and the API server answers, the worker holds its permissions (once CheckPermissions started
// its self-check), and the worker's own checks (extra) pass. A later call replaces the checks
// of an earlier one.
func (o *Ops) Ready(nc *nats.Conn, kube *Kube, extra ...ops.Check) {
	if o.server == nil {
		return
	}
	checks := []ops.Check{ops.NATSCheck(nc), ops.KubernetesCheck(kube.Clientset.Discovery().RESTClient())}
	if o.selfCheck != nil {
		checks = append(checks, o.selfCheck.Check())
	}
	o.server.SetReady(append(checks, extra...)...)
}

// Close stops the server and waits for it.
func (o *Ops) Close(log zerolog.Logger) {
	if o.server == nil {
		return
	}
	o.cancel()
	if err := <-o.done; err != nil {
		log.Warn().Err(err).Msg("ops server stopped with an error")
	}
}
