package execsvc_test

import (
	"context"
	"sync"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// fakePods is a table of lease pods.
type fakePods struct {
	mu      sync.Mutex
	pods    map[events.RunRef]fakePod
	changed chan struct{}
}

type fakePod struct {
	pod   execsvc.Pod
	ready bool
}

func newFakePods() *fakePods {
	return &fakePods{pods: map[events.RunRef]fakePod{}, changed: make(chan struct{})}
}

func (f *fakePods) set(ref events.RunRef, p execsvc.Pod, ready bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pods[ref] = fakePod{pod: p, ready: ready}
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakePods) remove(ref events.RunRef) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pods, ref)
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakePods) Ready(ctx context.Context, ref events.RunRef, _ lease.Record) (execsvc.Pod, error) {
	for {
		f.mu.Lock()
		p, ok := f.pods[ref]
		changed := f.changed
		f.mu.Unlock()
		if ok && p.ready {
			return p.pod, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return execsvc.Pod{}, ctx.Err()
		}
	}
}

func (f *fakePods) Current(ref events.RunRef, _ lease.Record) (execsvc.Pod, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.pods[ref]
	return p.pod, ok
}
