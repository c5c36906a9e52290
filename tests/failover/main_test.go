// Package failover runs three replicas of every kubeclip worker, as processes, against an
// embedded JetStream server and the local cluster, and breaks them while runs are in flight:
// SIGKILLed run-watchers, every worker killed at once, JetStream stopped and restarted,
// redelivered and concurrent dispatches. Each test checks what Paperclip would see in the run
// stream afterwards: every log line exactly once under a gap-free seq, one created, one result.
//
// The tests run one after another: each one loads a 2-core machine on its own.
package failover

import (
	"context"
	"os"
	"testing"
	"time"

	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

const (
	// replicas of each worker.
	replicas = 3
	// ownershipTTL is the run-watchers' --ownership-ttl: short, so a run whose owner died is
	// taken over within seconds.
	ownershipTTL = 3 * time.Second
	// agentBusyTimeout is the dispatchers' --agent-busy-timeout: longer than any run here, so
	// an acquire for a busy agent waits for it rather than failing.
	agentBusyTimeout = 90 * time.Second
	// runTimeout bounds one run (pod start, a few seconds of log, the result), takeovers
	// included, on a loaded 2-core machine.
	runTimeout = 3 * time.Minute
)

// env is the pipeline every test shares.
var env *pt.Env

func TestMain(m *testing.M) {
	os.Exit(pt.Main(m, pt.Options{
		Name:             "failover",
		Replicas:         replicas,
		AgentBusyTimeout: agentBusyTimeout,
		OwnershipTTL:     ownershipTTL,
		Args: map[string][]string{
			// A hundred runs on a node with room for about 19 agent pods: the rest wait for
			// capacity, which must not fail them.
			pt.RunWatcher: {"--unschedulable-grace", "30m"},
			// Reusable leases (resume_test.go) are suspended by the first sweep after their
			// release.
			pt.Dispatcher: {"--lease-idle-window", leaseIdleWindow.String()},
		},
	}, &env))
}

// restoreReplicas starts workers until every kind has its replicas again, so the next test
// begins with the same pipeline whatever this one killed.
func restoreReplicas(t *testing.T) {
	t.Helper()
	for _, kind := range pt.Kinds() {
		for len(env.Workers(kind)) < replicas {
			w, err := env.StartWorker(kind)
			if err != nil {
				t.Fatalf("restarting a %s: %v", kind, err)
			}
			t.Logf("started %s", w.ID)
		}
	}
}

// checkHistory replays the run from the stream and checks it against want.
func checkHistory(t *testing.T, r *pt.Run, want pt.Want) []events.Received {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	evs, err := pt.History(ctx, env, r.CompanyID, r.RunID)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pt.CheckHistory(evs, want) {
		t.Errorf("run %s: %s", r.RunID, p)
	}
	if t.Failed() {
		t.Logf("run %s history:\n%s", r.RunID, pt.Describe(evs))
	}
	return evs
}

// stubLinesSoFar is a WaitFor predicate: at least n stub lines arrived.
func stubLinesSoFar(n int) func([]events.Received) bool {
	return func(evs []events.Received) bool {
		return len(pt.StubLines(pt.Only[events.RunLogEvent](evs))) >= n
	}
}

// firstAfter returns the first event of the run stored after t that matches keep.
func firstAfter(evs []events.Received, t time.Time, keep func(events.Event) bool) (events.Received, bool) {
	for _, e := range evs {
		if e.Published.After(t) && keep(e.Event) {
			return e, true
		}
	}
	return events.Received{}, false
}

func isLog(e events.Event) bool { _, ok := e.(events.RunLogEvent); return ok }

func isResult(e events.Event) bool { _, ok := e.(events.RunResultEvent); return ok }
