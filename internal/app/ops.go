package app

import (
	"context"
	"slices"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/internal/ops"
	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/dispatch"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// Ops is a worker's operational side: its metrics, and the server of /healthz, /readyz and
// /metrics when --ops-addr is set.
type Ops struct {
	// Metrics is the observer to hand to the worker (events.Observer, runwatch.Observer).
	Metrics *ops.Metrics
	// Registry is the registry /metrics serves: everything the worker exports (the
	// self-check's metrics too).
	Registry *ops.Registry
	// JetStream reports the streams' usage and the worker's consumers' lag (watched by Start).
	JetStream *ops.JetStreamCollector
	// Leases reports the lease records by company and state; only the dispatcher watches them.
	Leases    *ops.LeaseCollector
	selfCheck *ops.SelfCheck
	server    *ops.Server
	cancel    context.CancelFunc
	done      chan error
}

// StartOps builds the worker's metrics registry and, when --ops-addr is set, starts serving.
// The server keeps answering after ctx ends (readiness failing) until Close, so probes and a
// last scrape still work while the worker drains. Call Close after the worker returned.
func (c *Common) StartOps(ctx context.Context, log zerolog.Logger) (*Ops, error) {
	reg := ops.NewRegistry()
	o := &Ops{Registry: reg, JetStream: ops.NewJetStreamCollector(), Leases: ops.NewLeaseCollector()}
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		o.JetStream, o.Leases,
	)
	m, err := ops.NewMetrics(reg)
	if err != nil {
		return nil, err
	}
	o.Metrics = m
	if c.OpsAddr == "" {
		return o, nil
	}
	srv, err := ops.Listen(ops.Options{Addr: c.OpsAddr, Gatherer: reg, Logger: log, Profiling: c.Pprof})
	if err != nil {
		return nil, err
	}
	if err := reg.Register(srv.ReadyGauge()); err != nil { //nolint:contextcheck // a scrape has no context to pass (ops.Server.ReadyGauge)
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
// and the API server answers (when kube is not nil), the worker holds its permissions (once CheckPermissions started
// its self-check), and the worker's own checks (extra) pass. A later call replaces the checks
// of an earlier one.
func (o *Ops) Ready(nc *nats.Conn, kube *Kube, extra ...ops.Check) {
	if o.server == nil {
		return
	}
	checks := []ops.Check{ops.NATSCheck(nc)}
	if kube != nil { // the credential broker has no Kubernetes client
		checks = append(checks, ops.KubernetesCheck(kube.Clientset.Discovery().RESTClient()))
	}
	if o.selfCheck != nil {
		checks = append(checks, o.selfCheck.Check())
	}
	o.server.SetReady(append(checks, extra...)...)
}

// ownedConsumers are the durable consumers each worker consumes, whose lag its /metrics
// reports (pkg/tenant, pkg/dispatch and pkg/broker/brokersvc create them). The run-watcher and
// the exec-worker consume none.
func ownedConsumers(component string, s events.Subjects) []ops.ConsumerRef {
	switch component {
	case "tenant-worker":
		return []ops.ConsumerRef{
			{Stream: s.LeaseStream(), Consumer: events.TenantWorkerConsumer},
			{Stream: events.RetryStream, Consumer: events.RetryConsumerConfig(events.TenantWorkerConsumer).Durable},
		}
	case "dispatcher":
		return []ops.ConsumerRef{
			{Stream: events.WorkStream, Consumer: events.DispatcherConsumer},
			{Stream: s.LeaseStream(), Consumer: events.DispatcherEndConsumer},
			{Stream: s.RunStream(), Consumer: events.DispatcherResultConsumer},
		}
	case "credential-broker":
		return []ops.ConsumerRef{{Stream: s.RunStream(), Consumer: events.BrokerReleaseConsumer}}
	}
	return nil
}

// watchJetStream has every worker report the usage of every stream and bucket (the store
// filling concerns all; a bucket is the stream "KV_<bucket>") and its own consumers' lag.
func (o *Ops) watchJetStream(component string, js jetstream.JetStream, s events.Subjects) {
	o.JetStream.Watch(js, watchedStores(component, s), ownedConsumers(component, s), 0)
}

// watchedStores are the stores a worker reports: those its NATS user may read
// (deploy/kustomize/base/nats-auth.conf; a refused info waits out the scrape's bound and reads
// as JetStream not answering). The exec-worker's user reads the start-up streams and its own
// buckets; the credential broker's its grants, the budgets bucket and the run stream; the other
// workers' user every store but the exec-worker's recorded execs and the broker's grants.
func watchedStores(component string, s events.Subjects) []string {
	execs, grants := events.BucketStream(execsvc.RecordedBucket), events.BucketStream(broker.Bucket)
	switch component {
	case "exec-worker":
		return []string{s.LeaseStream(), s.RunStream(), events.WorkStream, events.BucketStream(lease.Bucket),
			events.BucketStream(lease.TenantBucket), execs, events.BucketStream(events.BudgetBucket)}
	case "credential-broker":
		return []string{s.RunStream(), grants, events.BucketStream(events.BudgetBucket)}
	}
	return slices.DeleteFunc(s.StreamNames(), func(name string) bool { return name == execs || name == grants })
}

// WatchJetStream has the credential broker, which connects without Start, report its stores
// and its consumer's lag as the other workers do.
func (o *Ops) WatchJetStream(component string, js jetstream.JetStream, s events.Subjects) {
	o.watchJetStream(component, js, s)
}

// CountLeases has /metrics report the lease records (kubeclip_leases); the dispatcher calls it.
func (o *Ops) CountLeases(ctx context.Context, js jetstream.JetStream) error {
	kv, err := events.OpenBucket(ctx, js, lease.Bucket)
	if err != nil {
		return err
	}
	o.Leases.Watch(kv, ops.LeaseCollectorOptions{})
	return nil
}

// CountWarmPools has /metrics report the warm pools by company (kubeclip_warm_pool_acquires
// from their records); the dispatcher calls it when warm pools are on.
func (o *Ops) CountWarmPools(js jetstream.JetStream) {
	o.Metrics.WarmPools().Watch(func(ctx context.Context) ([]ops.WarmPoolAcquires, error) {
		kv, err := js.KeyValue(ctx, dispatch.WarmBucket)
		if err != nil {
			return nil, err
		}
		pools, err := dispatch.ReadWarmPools(ctx, kv)
		out := make([]ops.WarmPoolAcquires, len(pools))
		for i, p := range pools {
			out[i] = ops.WarmPoolAcquires(p)
		}
		return out, err
	}, ops.LeaseCollectorOptions{})
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
