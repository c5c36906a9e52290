package dispatch

import (
	"time"

	"github.com/rs/zerolog"
)

// logKeyTookMs is the field of the "run created" record that says where the acquire's time went:
// one entry per step of handleDispatch, in milliseconds. `make bench-scale` reads it for its
// breakdown of acquire → created (tests/scale).
const logKeyTookMs = "took_ms"

// Steps of a dispatch, as logKeyTookMs names them.
const (
	stepQueued  = "queued"  // in the work queue (queuedAt: a parked dispatch's from its acquire) → the handler's start
	stepCheck   = "check"   // decoding, the tenant record and the lease record (KV reads)
	stepGuard   = "guard"   // taking the agent's guard (KV compare-and-set)
	stepClaim   = "claim"   // claiming a warm pod (an eligible acquire with warm pools on: one PUT per pod tried)
	stepRecord  = "record"  // the lease record to dispatching (KV read and update)
	stepCreate  = "create"  // rendering, then the workload and its Secret (two API POSTs; a warm pod's: its Secret and the bind call)
	stepCreated = "created" // the lease record to created (KV read and update)
	stepPublish = "publish" // the created event (JetStream publish and ack)
	stepAdopt   = "adopt"   // the Secret's owner reference, when it was not created with it (PATCH)
)

// stepTimer measures consecutive steps of one dispatch on the dispatcher's clock.
type stepTimer struct {
	now   func() time.Time
	last  time.Time
	names []string
	took  []time.Duration
}

func newStepTimer(now func() time.Time, queuedAt time.Time) *stepTimer {
	t := &stepTimer{now: now, last: now()}
	if !queuedAt.IsZero() && queuedAt.Before(t.last) {
		t.names, t.took = append(t.names, stepQueued), append(t.took, t.last.Sub(queuedAt))
	}
	return t
}

// done ends the step called name, which began when the previous one ended.
func (t *stepTimer) done(name string) {
	at := t.now()
	t.names, t.took = append(t.names, name), append(t.took, at.Sub(t.last))
	t.last = at
}

// dict is the steps as a log field value, in milliseconds.
func (t *stepTimer) dict() *zerolog.Event {
	d := zerolog.Dict()
	for i, name := range t.names {
		d = d.Float64(name, float64(t.took[i].Microseconds())/1000)
	}
	return d
}
