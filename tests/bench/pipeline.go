package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/pkg/dispatch"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/runwatch"
	"github.com/kubeclip/kubeclip/pkg/tenant"
)

// The workers' concurrency: the binaries' defaults (cmd/tenant-worker, cmd/dispatcher).
const (
	tenantConcurrency     = 8
	dispatcherConcurrency = 16
)

// pipeline is kubeclip in one process: an embedded JetStream server and the three workers, wired
// as the binaries wire them. Each worker has its own NATS connection and its own Kubernetes
// clients, so its own client-side rate limiter, as three processes would. The clients and the
// JetStream handles are what app.Common builds, wrapped to time every operation into stats.
type pipeline struct {
	common app.Common
	stats  *opStats
	srv    *server.Server
	dir    string
	logOut io.WriteCloser

	mu    sync.Mutex
	conns []*nats.Conn

	stopWorkers context.CancelFunc
	errs        chan error
	running     int
}

// worker is what the three workers have in common.
type worker interface {
	Run(ctx context.Context) error
}

// startPipeline starts the embedded server and the workers. workerLog names the workers' log
// file; empty puts it in the server's temporary directory.
func startPipeline(ctx context.Context, kubeconfig, workerLog string, stats *opStats) (p *pipeline, err error) {
	common, err := workerDefaults()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kubeclip-bench-")
	if err != nil {
		return nil, fmt.Errorf("creating the JetStream store: %w", err)
	}
	p = &pipeline{common: common, stats: stats, dir: dir, errs: make(chan error, 3)}
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
	p.srv, err = events.StartEmbedded(events.EmbeddedOptions{StoreDir: filepath.Join(dir, "nats"), Port: -1})
	if err != nil {
		return p, err
	}
	p.common.NATSURL = p.srv.ClientURL()
	p.common.Kubeconfig = kubeconfig
	return p, p.startWorkers(ctx)
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
	builders := []func(context.Context) (worker, error){p.tenantWorker, p.dispatcher, p.runWatcher}
	workers := make([]worker, 0, len(builders))
	for _, build := range builders {
		w, err := build(ctx)
		if err != nil {
			return err
		}
		workers = append(workers, w)
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.stopWorkers = cancel
	for _, w := range workers {
		p.running++
		go func() { p.errs <- w.Run(wctx) }()
	}
	return nil
}

func (p *pipeline) tenantWorker(ctx context.Context) (worker, error) {
	kube, js, log, err := p.connect(ctx, "tenant-worker")
	if err != nil {
		return nil, err
	}
	subjects, err := p.common.Subjects()
	if err != nil {
		return nil, err
	}
	return tenant.New(tenant.Options{
		Clientset: kube.Clientset, Applier: kube.Applier, JetStream: js, Subjects: subjects, Logger: log,
		Concurrency: tenantConcurrency, DrainTimeout: p.common.ShutdownTimeout,
	})
}

func (p *pipeline) dispatcher(ctx context.Context) (worker, error) {
	kube, js, log, err := p.connect(ctx, "dispatcher")
	if err != nil {
		return nil, err
	}
	subjects, err := p.common.Subjects()
	if err != nil {
		return nil, err
	}
	return dispatch.New(dispatch.Options{
		Clientset: kube.Clientset, Dynamic: kube.Dynamic, Applier: kube.Applier,
		JetStream: js, Subjects: subjects, Logger: log,
		Concurrency: dispatcherConcurrency, DrainTimeout: p.common.ShutdownTimeout,
	})
}

func (p *pipeline) runWatcher(ctx context.Context) (worker, error) {
	kube, js, log, err := p.connect(ctx, "run-watcher")
	if err != nil {
		return nil, err
	}
	subjects, err := p.common.Subjects()
	if err != nil {
		return nil, err
	}
	return runwatch.New(runwatch.Options{Clientset: kube.Clientset, JetStream: js, Subjects: subjects, Logger: log})
}

// connect builds one component's Kubernetes clients, NATS connection and logger.
func (p *pipeline) connect(ctx context.Context, component string) (*app.Kube, jetstream.JetStream, zerolog.Logger, error) {
	log := app.NewLogger(p.logOut, p.common.LogLevel, component)
	kube, err := p.kubernetes(component)
	if err != nil {
		return nil, nil, log, fmt.Errorf("building %s's Kubernetes clients: %w", component, err)
	}
	js, err := p.jetStream(ctx, component, log)
	if err != nil {
		return nil, nil, log, err
	}
	subjects, err := p.common.Subjects()
	if err != nil {
		return nil, nil, log, err
	}
	return kube, timedJS{JetStream: js, stats: p.stats, component: component, subjects: subjects}, log, nil
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
	applier, err := k8s.NewApplier(k8s.ApplierOptions{Dynamic: dyn, Mapper: k8s.NewRESTMapper(cs.Discovery())})
	if err != nil {
		return nil, err
	}
	return &app.Kube{Config: cfg, Clientset: cs, Dynamic: dyn, Applier: applier}, nil
}

// jetStream connects component to the embedded server (the streams exist once it returns). The
// connection is drained by stop.
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

// stop stops the workers (they drain), then the connections, the server and the store.
func (p *pipeline) stop() error {
	var errs []error
	if p.stopWorkers != nil {
		p.stopWorkers()
		for range p.running {
			if err := <-p.errs; err != nil && !errors.Is(err, context.Canceled) {
				errs = append(errs, fmt.Errorf("stopping a worker: %w", err))
			}
		}
		p.running = 0
	}
	p.mu.Lock()
	conns := p.conns
	p.conns = nil
	p.mu.Unlock()
	quiet := zerolog.Nop()
	for _, nc := range conns {
		app.Drain(nc, quiet)
	}
	events.ShutdownEmbedded(p.srv)
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
