package runwatch

import (
	"sync"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// Observer is told what the watcher publishes and how many runs it follows (metrics); a nil
// Options.Observer means none.
type Observer interface {
	events.PublishObserver
	// RunsInFlight is called with +1 when the watcher starts following a run and -1 once the
	// run has its result or the watcher stops following it. Every replica follows (and counts)
	// every run it sees; aggregate replicas with max, not sum.
	RunsInFlight(delta int)
}

// countInFlight counts a run in flight; the returned func ends it and may be called again.
func countInFlight(obs Observer) (ended func()) {
	if obs == nil {
		return func() {}
	}
	obs.RunsInFlight(1)
	var once sync.Once
	return func() { once.Do(func() { obs.RunsInFlight(-1) }) }
}
