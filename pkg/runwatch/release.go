package runwatch

import (
	"context"
	"errors"
	"fmt"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/runwatch/verdict"
)

// leaseRelease reads what decides an exec-capable lease's end once its release began: the
// release or destroy its lease record names (or a reusable lease's release, after which a suspend
// deletes its pod: lease.State.Kept, or resuming), and the run's last recorded exec. It returns nil while the
// lease is live (no release began).
//
// The lease record says releasing before the dispatcher deletes anything, so a watcher that sees
// the pod deleted finds the release there; the exec-worker publishes a recorded exec's final
// event before it tells the client of the exit, and sandboxd lingers until that exit is read, so
// a watcher that sees the pod gone finds the final event of every exec that finished.
func leaseRelease(ctx context.Context, d *deps, ref events.RunRef) (*verdict.Release, error) {
	rec, _, err := d.leases.Get(ctx, ref)
	if errors.Is(err, lease.ErrNotFound) {
		return nil, nil // no record (expired with its bucket's TTL): no release to go by
	}
	if err != nil {
		return nil, fmt.Errorf("reading the run's lease: %w", err)
	}
	// A resuming lease was suspending or suspended when the host resumed it: the pod this
	// watcher sees go is the previous generation's, deleted by that suspend (a resume races the
	// sweep; tests/failover TestResumeDispatcherKilled), so its end is the release's too.
	if rec.Ending == "" && !rec.State.Kept() && rec.State != lease.StateResuming {
		return nil, nil
	}
	x, err := lastAgentExec(ctx, d.stream, d.opts.Subjects, ref)
	if err != nil {
		return nil, err
	}
	return &verdict.Release{Destroy: rec.Ending == events.LeaseDestroy, CancelActiveWork: rec.CancelActiveWork, AgentExec: x}, nil
}

// releaseOfRecord is leaseRelease for a lease record already read (reconcile's).
func releaseOfRecord(ctx context.Context, d *deps, rec lease.Record) (verdict.Release, error) {
	x, err := lastAgentExec(ctx, d.stream, d.opts.Subjects, rec.Ref())
	if err != nil {
		return verdict.Release{}, err
	}
	return verdict.Release{Destroy: rec.Ending == events.LeaseDestroy, CancelActiveWork: rec.CancelActiveWork, AgentExec: x}, nil
}

// resultAgent is the agent account a run's result carries: a Job's is parsed from its container
// log (the journal); an exec-capable lease's comes only from its agent's recorded exec
// (End.Agent), since its container log is sandboxd's own and is never followed, so a parse of
// it would report an agent that never ran.
func resultAgent(end verdict.End, backend policy.Backend, j *journal) *events.AgentResult {
	if backend.ExecCapable() {
		return end.Agent
	}
	return j.agentResult(end.AgentExitCode())
}

// lastAgentExec reads the run's last recorded exec from its last `exec` event: a final event
// (exit set) is an exec that ended, with the agent's account; an output chunk is one whose final
// event never came. One message get, whatever the exec printed: the Paperclip plugin records one
// agent command per run, so the last event is the agent's.
//
// nil: no exec was recorded, or the subject's last message is not kubeclip's (JetStream's answer
// to a client that named the subject as its reply: events.IsRunEvent), which hides the exec.
func lastAgentExec(ctx context.Context, stream runStream, subjects events.Subjects, ref events.RunRef) (*verdict.AgentExec, error) {
	last, err := events.LastRunEvent[events.RunExecEvent](ctx, stream, subjects, ref)
	if err != nil {
		return nil, fmt.Errorf("reading the run's last exec event: %w", err)
	}
	if !last.Ours {
		return nil, nil
	}
	x := last.Event
	return &verdict.AgentExec{ExecID: x.ExecID, Exit: x.Exit, Agent: x.Agent}, nil
}
