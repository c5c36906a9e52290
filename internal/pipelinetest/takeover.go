package pipelinetest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/runwatch"
)

// Owner returns the run-watcher replica that owns the run (its --replica-id), from the
// ownership bucket; "" when nobody owns it now.
func Owner(ctx context.Context, js jetstream.JetStream, ref events.RunRef) (string, error) {
	kv, err := js.KeyValue(ctx, runwatch.OwnershipBucket)
	if err != nil {
		return "", fmt.Errorf("opening %s: %w", runwatch.OwnershipBucket, err)
	}
	entry, err := kv.Get(ctx, ref.Key())
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("reading the owner of run %s: %w", ref.RunID, err)
	}
	return string(entry.Value()), nil
}

// Owners returns how many runs each run-watcher replica owns now.
func Owners(ctx context.Context, js jetstream.JetStream) (map[string]int, error) {
	kv, err := js.KeyValue(ctx, runwatch.OwnershipBucket)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", runwatch.OwnershipBucket, err)
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", runwatch.OwnershipBucket, err)
	}
	defer func() { _ = lister.Stop() }()
	out := map[string]int{}
	for key := range lister.Keys() {
		entry, err := kv.Get(ctx, key)
		if err != nil {
			continue // released meanwhile
		}
		out[string(entry.Value())]++
	}
	return out, nil
}

// Takeover is what MeasureTakeover saw.
type Takeover struct {
	// Owner is the replica that was killed.
	Owner string
	// Killed is when the kill started; Dead when the process was gone.
	Killed, Dead time.Time
	// Resumed is when the stream stored the run's first event of the new owner: its next log
	// event, or its result when the log had ended; Seq is that log event's seq (0 for a result).
	Resumed time.Time
	Seq     uint64
	// Gap is Resumed - Killed: how long the run's log stood still.
	Gap time.Duration
	// Result reports that the run's result, not a log event, came first.
	Result bool
}

// MeasureTakeover kills the owner of a live run and measures how long until the run's next
// log event (from the replica that took the run over) is stored. kill is given the owner's
// replica id and must return once that process is gone. The run must still be writing its
// log; if its result comes first, that is what Resumed reports. ctx bounds the wait.
func MeasureTakeover(ctx context.Context, js jetstream.JetStream, subjects events.Subjects, companyID, runID string, kill func(owner string) error) (Takeover, error) {
	var tk Takeover
	owner, err := Owner(ctx, js, events.Ref(companyID, runID))
	if err != nil {
		return tk, err
	}
	if owner == "" {
		return tk, fmt.Errorf("run %s has no owner to kill", runID)
	}
	tk.Owner = owner
	tk.Killed = time.Now()
	if err := kill(owner); err != nil {
		return tk, err
	}
	tk.Dead = time.Now()
	// Whatever the stream stores after the owner died was written by another replica.
	err = events.Follow(ctx, js, subjects, companyID, runID, events.FollowOptions{StartTime: tk.Dead}, func(r events.Received) error {
		if r.Published.Before(tk.Dead) {
			return nil
		}
		switch ev := r.Event.(type) {
		case events.RunLogEvent:
			tk.Seq = ev.Seq
		case events.RunResultEvent:
			tk.Result = true
		default:
			return nil
		}
		tk.Resumed = r.Published
		tk.Gap = tk.Resumed.Sub(tk.Killed)
		return events.ErrStopFollowing
	})
	if err != nil {
		return tk, fmt.Errorf("waiting for run %s to resume after killing %s: %w", runID, owner, err)
	}
	return tk, nil
}

// KillOwner measures a takeover (MeasureTakeover) by SIGKILLing the run's owner, one of this
// suite's run-watchers.
func (e *Env) KillOwner(ctx context.Context, companyID, runID string) (Takeover, error) {
	return MeasureTakeover(ctx, e.JS, e.Subjects, companyID, runID, func(owner string) error {
		w := e.Worker(owner)
		if w == nil {
			return fmt.Errorf("run %s is owned by %q, which is not a live run-watcher of this suite", runID, owner)
		}
		return w.Kill()
	})
}
