package app

import (
	"context"
	"errors"
	"sync"
)

// Worker is the shape of every kubeclip worker (tenant.Worker, dispatch.Dispatcher,
// runwatch.Watcher, execsvc.Service): Run starts it (opens its buckets and consumers, fills
// its caches), closes Ready once it serves, serves until its context ends, then drains within
// its drain bound (--shutdown-timeout) and returns nil, or the error that stopped it.
type Worker interface {
	Run(ctx context.Context) error
	Ready() <-chan struct{}
}

// Serve runs workers as one process. It starts them in order, each once the one before is
// ready, so a worker may rely on an earlier one's cache; calls ready (when not nil) once all
// are; and serves until ctx ends or a worker stops. Then it stops them in reverse order, each
// after the ones started after it have drained, and returns the first error.
func Serve(ctx context.Context, ready func(), workers ...Worker) error {
	type running struct {
		cancel context.CancelFunc
		done   chan error
	}
	var started []running
	stopped := make(chan struct{}) // closed when the first worker returns
	var once sync.Once
	stop := func() error {
		var errs []error
		for i := len(started) - 1; i >= 0; i-- {
			started[i].cancel()
			errs = append(errs, <-started[i].done)
		}
		return errors.Join(errs...)
	}
	for _, w := range workers {
		// Each worker stops when Serve says so, not when ctx ends: the order matters.
		wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		r := running{cancel: cancel, done: make(chan error, 1)}
		started = append(started, r)
		go func() {
			r.done <- w.Run(wctx)
			once.Do(func() { close(stopped) })
		}()
		select {
		case <-w.Ready():
		case <-stopped:
			return stop()
		case <-ctx.Done():
			return stop()
		}
	}
	if ready != nil {
		ready()
	}
	select {
	case <-ctx.Done():
	case <-stopped:
	}
	return stop()
}

// Serve runs the process's workers (see Serve). /readyz answers "starting" until every worker
// serves, then reports the connections (NATS, the API server).
func (p *Process) Serve(ctx context.Context, workers ...Worker) error {
	return Serve(ctx, func() { p.Ops.Ready(p.NATS, p.Kube) }, workers...)
}
