package dispatch

import (
	"sync"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// createdRecorder records what RunObserver is told.
type createdRecorder struct {
	mu   sync.Mutex
	took []time.Duration
}

func (r *createdRecorder) RunCreated(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.took = append(r.took, d)
}

func (r *createdRecorder) seen() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.took...)
}

// TestRunCreatedIsTimedFromTheAcquire: once a lease's `created` is out, the RunObserver was
// told, once, how long it took from the lease record the tenant-worker wrote.
func TestRunCreatedIsTimedFromTheAcquire(t *testing.T) {
	obs := &createdRecorder{}
	e := startEnv(t, func(o *Options) {
		o.RunObserver = obs
		o.Now = time.Now // the tenant-worker stamps the record with the wall clock
	})
	start := time.Now()
	ref := e.acquire(t, "pod")
	e.next(t, ref, events.KindCreated, 0)
	bound := time.Since(start)
	rec := e.record(t, ref)
	got := obs.seen()
	if len(got) != 1 || got[0] <= 0 || got[0] > bound {
		t.Fatalf("RunCreated got %v, want one duration in (0, %s] (record created %s)", got, bound, rec.CreatedAt)
	}
}
