package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/dispatch"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/runwatch"
	"github.com/kubeclip/kubeclip/pkg/tenant"
)

// The workers' concurrency: the binaries' defaults (cmd/tenant-worker, cmd/dispatcher).
const (
	tenantConcurrency     = 8
	dispatcherConcurrency = dispatch.DefaultConcurrency
)

// pipeline is kubeclip in one process: an embedded JetStream server and the three workers, wired
// as the binaries wire them. Each worker has its own NATS connection and its own Kubernetes
// clients, so its own client-side rate limiter, as three processes would. The clients and the
// JetStream handles are what app.Common builds, wrapped to time every operation into stats.
// Workers can be stopped and added one by one: (f) adds dispatcher replicas, (g) replaces the
// run-watcher by processes.
type pipeline struct {
	common app.Common
	stats  *opStats
	// sandboxKey is the dispatchers' sandbox master key: exec-capable leases ((i), (j)) need it.
	sandboxKey []byte
	// sandboxdImage is the dispatchers' sandboxd image (--sandboxd-image).
	sandboxdImage string
	// nats is the embedded server; it listens on TCP, so worker processes can join it.
	nats   *pipelinetest.NATS
	dir    string
	logOut io.WriteCloser

	mu      sync.Mutex
	conns   []*nats.Conn // connections not owned by a worker (the bench's)
	workers []*runningWorker
}

// runningWorker is one worker running in its own goroutine.
type runningWorker struct {
	name   string
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan error // Run's error, once
}

// worker is what the three workers have in common.
type worker interface {
	Run(ctx context.Context) error
}

// startPipeline starts the embedded server and the workers. workerLog names the workers' log
// file; empty puts it in the server's temporary directory.
func startPipeline(ctx context.Context, kubeconfig, workerLog string, stats *opStats, sandboxKey []byte, sandboxdImage string) (p *pipeline, err error) {
	common, err := workerDefaults()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kubeclip-bench-")
	if err != nil {
		return nil, fmt.Errorf("creating the JetStream store: %w", err)
	}
	p = &pipeline{common: common, stats: stats, dir: dir, sandboxKey: sandboxKey, sandboxdImage: sandboxdImage}
	defer func() {
		if err != nil {
			err = errors.Join(err, p.stop())
			p = nil
		}
	}()
	if workerLog == "" {
		workerLog = filepath.Join(dir, "workers.log")
	}
	if p.logOut, err = os.Create(workerLog); err != nil {
		return p, fmt.Errorf("creating the workers' log: %w", err)
	}
	if p.nats, err = pipelinetest.StartNATS(filepath.Join(dir, "nats")); err != nil {
		return p, err
	}
	p.common.NATSURL = p.nats.URL()
	p.common.Kubeconfig = kubeconfig
	return p, p.startWorkers(ctx)
}

// benchOperator is the installation policy of the bench's workers: the bench's namespace
// prefix is the one its tenants may use.
func benchOperator() policy.Operator {
	// The bench's images are loaded into the node, not a registry: they must not be pulled.
	return policy.Operator{NamespacePrefixes: []string{namespacePrefix}, PreloadedImages: policy.DefaultPreloadedImages}
}

// workerDefaults returns the common settings exactly as a binary started without flags or
// environment has them (QPS, burst, prefix, log level, shutdown timeout).
func workerDefaults() (app.Common, error) {
	var c app.Common
	fs := config.New("bench-worker", func(string) (string, bool) { return "", false })
	c.Bind(fs)
	if err := fs.Parse(nil); err != nil {
		return c, fmt.Errorf("reading the workers' default settings: %w", err)
	}
	return c, nil
}

func (p *pipeline) startWorkers(ctx context.Context) error {
	builders := []struct {
		name  string
		build func(context.Context, string) (worker, *nats.Conn, error)
	}{
		{componentTenant, p.tenantWorker}, {componentDispatcher, p.dispatcher}, {componentRunWatcher, p.runWatcher},
	}
	for _, b := range builders {
		if err := p.start(ctx, b.name, b.build); err != nil {
			return err
		}
	}
	return nil
}

// start builds the worker name with build and runs it until stopWorkers.
func (p *pipeline) start(ctx context.Context, name string, build func(context.Context, string) (worker, *nats.Conn, error)) error {
	w, nc, err := build(ctx, name)
	if err != nil {
		if nc != nil {
			nc.Close()
		}
		return err
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	rw := &runningWorker{name: name, nc: nc, cancel: cancel, done: make(chan error, 1)}
	go func() { rw.done <- w.Run(wctx) }()
	p.mu.Lock()
	p.workers = append(p.workers, rw)
	p.mu.Unlock()
	return nil
}

// Component names: the workers' log field, user agent and breakdown rows.
const (
	componentTenant     = "tenant-worker"
	componentDispatcher = "dispatcher"
	componentRunWatcher = "run-watcher"
)

// addDispatchers starts n more dispatchers (dispatcher-2, dispatcher-3, ...), each with its own
// NATS connection and Kubernetes clients, sharing the durable consumers like replicas in
// separate processes, and returns a function that stops them.
func (p *pipeline) addDispatchers(ctx context.Context, n int) (func() error, error) {
	names := make([]string, 0, n)
	for i := range n {
		name := fmt.Sprintf("%s-%d", componentDispatcher, i+2)
		if err := p.start(ctx, name, p.dispatcher); err != nil {
			return nil, errors.Join(err, p.stopWorkers(names...))
		}
		names = append(names, name)
	}
	return func() error { return p.stopWorkers(names...) }, nil
}

// restartDispatcher starts the in-process dispatcher again after stopWorkers stopped it.
func (p *pipeline) restartDispatcher(ctx context.Context) error {
	return p.start(ctx, componentDispatcher, p.dispatcher)
}

// restartRunWatcher starts the in-process run-watcher again after stopWorkers stopped it.
func (p *pipeline) restartRunWatcher(ctx context.Context) error {
	return p.start(ctx, componentRunWatcher, p.runWatcher)
}

func (p *pipeline) tenantWorker(ctx context.Context, name string) (worker, *nats.Conn, error) {
	kube, nc, js, log, err := p.connect(ctx, name)
	if err != nil {
		return nil, nc, err
	}
	subjects, err := p.common.Subjects()
	if err != nil {
		return nil, nc, err
	}
	w, err := tenant.New(tenant.Options{
		Clientset: kube.Clientset, Applier: kube.Applier, JetStream: js, Subjects: subjects, Logger: log,
		Concurrency: tenantConcurrency, DrainTimeout: p.common.ShutdownTimeout, Operator: benchOperator(),
	})
	return w, nc, err
}

func (p *pipeline) dispatcher(ctx context.Context, name string) (worker, *nats.Conn, error) {
	kube, nc, js, log, err := p.connect(ctx, name)
	if err != nil {
		return nil, nc, err
	}
	subjects, err := p.common.Subjects()
	if err != nil {
		return nil, nc, err
	}
	w, err := dispatch.New(dispatch.Options{
		Clientset: kube.Clientset, Dynamic: kube.Dynamic, Metadata: kube.Metadata, Applier: kube.Applier,
		JetStream: js, Subjects: subjects, Logger: log,
		Concurrency: dispatcherConcurrency, DrainTimeout: p.common.ShutdownTimeout, SandboxKey: p.sandboxKey, SandboxdImage: p.sandboxdImage,
		Operator: benchOperator(),
	})
	return w, nc, err
}

func (p *pipeline) runWatcher(ctx context.Context, name string) (worker, *nats.Conn, error) {
	kube, nc, js, log, err := p.connect(ctx, name)
	if err != nil {
		return nil, nc, err
	}
	subjects, err := p.common.Subjects()
	if err != nil {
		return nil, nc, err
	}
	w, err := runwatch.New(runwatch.Options{Clientset: kube.Clientset, Dynamic: kube.Dynamic, JetStream: js, Subjects: subjects, Logger: log})
	return w, nc, err
}

// connect builds one component's Kubernetes clients, NATS connection and logger. The
// connection is the component's: it is drained when the component stops.
func (p *pipeline) connect(ctx context.Context, component string) (*app.Kube, *nats.Conn, jetstream.JetStream, zerolog.Logger, error) {
	log := app.NewLogger(p.logOut, p.common.LogLevel, component)
	kube, err := p.kubernetes(component)
	if err != nil {
		return nil, nil, nil, log, fmt.Errorf("building %s's Kubernetes clients: %w", component, err)
	}
	nc, js, err := p.common.JetStream(ctx, component, app.Streams{}, log)
	if err != nil {
		return nil, nil, nil, log, fmt.Errorf("connecting %s to JetStream: %w", component, err)
	}
	subjects, err := p.common.Subjects()
	if err != nil {
		return nil, nc, nil, log, err
	}
	return kube, nc, timedJS{JetStream: js, stats: p.stats, component: component, subjects: subjects}, log, nil
}

// kubernetes builds component's clients as app.Common.Kubernetes does: the binaries' QPS and
// burst, one token bucket for the clientset and one for the dynamic client (client-go's
// defaults); with every request and every rate limiter wait timed.
func (p *pipeline) kubernetes(component string) (*app.Kube, error) {
	qps, burst := float32(p.common.KubeQPS), p.common.KubeBurst
	cfg, err := k8s.RESTConfig(p.common.Kubeconfig, qps, burst)
	if err != nil {
		return nil, err
	}
	cfg = k8s.ForComponent(cfg, component)
	cfg.Wrap(p.stats.wrapTransport(component))
	csCfg, dynCfg := rest.CopyConfig(cfg), rest.CopyConfig(cfg)
	csCfg.RateLimiter = p.stats.rateLimiter(component, qps, burst)
	dynCfg.RateLimiter = p.stats.rateLimiter(component, qps, burst)
	cs, err := kubernetes.NewForConfig(csCfg)
	if err != nil {
		return nil, fmt.Errorf("building the clientset: %w", err)
	}
	dyn, err := dynamic.NewForConfig(dynCfg)
	if err != nil {
		return nil, fmt.Errorf("building the dynamic client: %w", err)
	}
	md, err := metadata.NewForConfig(dynCfg)
	if err != nil {
		return nil, fmt.Errorf("building the metadata client: %w", err)
	}
	applier, err := k8s.NewApplier(k8s.ApplierOptions{Dynamic: dyn, Mapper: k8s.NewRESTMapper(cs.Discovery())})
	if err != nil {
		return nil, err
	}
	return &app.Kube{Config: cfg, Clientset: cs, Dynamic: dyn, Metadata: md, Applier: applier}, nil
}

// jetStream connects the bench itself (not a worker) to the embedded server; the streams exist
// once it returns. The connection is drained by stop.
func (p *pipeline) jetStream(ctx context.Context, component string, log zerolog.Logger) (jetstream.JetStream, error) {
	nc, js, err := p.common.JetStream(ctx, component, app.Streams{}, log)
	if err != nil {
		return nil, fmt.Errorf("connecting %s to JetStream: %w", component, err)
	}
	p.mu.Lock()
	p.conns = append(p.conns, nc)
	p.mu.Unlock()
	return js, nil
}

// stopWorkers stops the named workers, all at once, waits until they returned and drains
// their connections.
func (p *pipeline) stopWorkers(names ...string) error {
	return p.stopMatching(func(name string) bool { return slices.Contains(names, name) })
}

func (p *pipeline) stopMatching(stop func(name string) bool) error {
	p.mu.Lock()
	var stopping, keep []*runningWorker
	for _, w := range p.workers {
		if stop(w.name) {
			stopping = append(stopping, w)
		} else {
			keep = append(keep, w)
		}
	}
	p.workers = keep
	p.mu.Unlock()
	for _, w := range stopping {
		w.cancel()
	}
	var errs []error
	quiet := zerolog.Nop()
	for _, w := range stopping {
		if err := <-w.done; err != nil && !errors.Is(err, context.Canceled) {
			errs = append(errs, fmt.Errorf("stopping %s: %w", w.name, err))
		}
		if w.nc != nil {
			app.Drain(w.nc, quiet)
		}
	}
	return errors.Join(errs...)
}

// stop stops the workers (they drain), then the other connections, the server and the store.
func (p *pipeline) stop() error {
	errs := []error{p.stopMatching(func(string) bool { return true })}
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	quiet := zerolog.Nop()
	for _, nc := range conns {
		app.Drain(nc, quiet)
	}
	if p.nats != nil {
		p.nats.Stop()
	}
	if p.logOut != nil {
		if err := p.logOut.Close(); err != nil {
			errs = append(errs, fmt.Errorf("closing the workers' log: %w", err))
		}
	}
	if err := os.RemoveAll(p.dir); err != nil {
		errs = append(errs, fmt.Errorf("removing %s: %w", p.dir, err))
	}
	return errors.Join(errs...)
}
