package app_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/internal/app"
)

// fakeWorker records its start and stop in a shared log; it is ready at once unless it fails.
type fakeWorker struct {
	name  string
	log   *eventLog
	fail  error // returned at once, before ready
	ready chan struct{}
}

type eventLog struct {
	mu  sync.Mutex
	got []string
}

func (l *eventLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, s)
}

func (l *eventLog) events() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.got...)
}

func newFake(name string, log *eventLog, fail error) *fakeWorker {
	return &fakeWorker{name: name, log: log, fail: fail, ready: make(chan struct{})}
}

func (w *fakeWorker) Ready() <-chan struct{} { return w.ready }

func (w *fakeWorker) Run(ctx context.Context) error {
	w.log.add("start " + w.name)
	if w.fail != nil {
		return w.fail
	}
	close(w.ready)
	<-ctx.Done()
	w.log.add("stop " + w.name)
	return nil
}

// TestServeStartsInOrderAndStopsInReverse: a worker starts once the one before is ready, ready
// comes once all are, and they stop last-started first.
func TestServeStartsInOrderAndStopsInReverse(t *testing.T) {
	log := &eventLog{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- app.Serve(ctx, func() { log.add("ready") }, newFake("pods", log, nil), newFake("service", log, nil))
	}()
	deadline := time.Now().Add(10 * time.Second)
	for len(log.events()) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("not ready: %v", log.events())
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve = %v, want nil after a clean stop", err)
	}
	want := []string{"start pods", "start service", "ready", "stop service", "stop pods"}
	if diff := cmp.Diff(want, log.events()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestServeStopsTheOthersWhenOneFails: a worker that fails stops the ones already running, and
// its error is Serve's.
func TestServeStopsTheOthersWhenOneFails(t *testing.T) {
	log := &eventLog{}
	boom := errors.New("consumer deleted")
	err := app.Serve(t.Context(), func() { log.add("ready") }, newFake("pods", log, nil), newFake("service", log, boom))
	if !errors.Is(err, boom) {
		t.Errorf("Serve = %v, want %v", err, boom)
	}
	want := []string{"start pods", "start service", "stop pods"}
	if diff := cmp.Diff(want, log.events()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
