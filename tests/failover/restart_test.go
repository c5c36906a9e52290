package failover

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// streamingConfig is a stub run that prints lines one at a time, every interval.
func streamingConfig(lines int, interval time.Duration) map[string]string {
	return map[string]string{"STUB_LINES": fmt.Sprint(lines), "STUB_INTERVAL": interval.String()}
}

// TestNATSRestartMidRun stops the JetStream server while a run streams, keeps it down, then
// starts it again on the same port and store. The workers reconnect by themselves; the run
// completes, and its history has every line exactly once under a gap-free seq, and one
// result. A second run acquired after the restart proves every worker consumes again.
//
// A short outage is absorbed by the clients' reconnect buffers (a JetStream publish waits 5 s
// for its ack); a long one outlasts the publish timeout and the ownership TTL, so publishes
// fail, the run-watcher's outbox fills, every ownership key expires and the run is claimed
// again after the restart.
func TestNATSRestartMidRun(t *testing.T) {
	for _, tc := range []struct {
		name   string
		outage time.Duration
	}{
		{"shorter than the publish timeout", 3 * time.Second},
		{"longer than the publish timeout and the ownership TTL", 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := clustertest.Clientset(t)
			company := pt.NewID("co")
			pt.CleanupTenant(t, cs, company)
			const lines = 400
			r := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(streamingConfig(lines, 50*time.Millisecond)))
			r.WaitFor(runTimeout, "40 stub lines", stubLinesSoFar(40))

			stopped := time.Now()
			env.NATS.Stop()
			// The outage itself is what is under test: nothing to poll for while the server is down.
			time.Sleep(tc.outage)
			if err := env.NATS.Start(); err != nil {
				t.Fatal(err)
			}
			restarted := time.Now()
			t.Logf("JetStream down for %s", restarted.Sub(stopped).Round(time.Millisecond))

			pt.WaitKind[events.RunResultEvent](r, runTimeout)
			evs := checkHistory(t, r, pt.Want{Lines: lines})
			if e, ok := firstAfter(evs, restarted, isLog); ok {
				t.Logf("first log event stored after the restart: seq %d, %s after it",
					e.Event.(events.RunLogEvent).Seq, e.Published.Sub(restarted).Round(time.Millisecond))
			}
			for _, kind := range pt.Kinds() {
				if n := len(env.Workers(kind)); n != replicas {
					t.Errorf("%d %s processes alive after the NATS restart, want %d: a worker exited instead of reconnecting", n, kind, replicas)
				}
			}
			restoreReplicas(t)

			after := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(map[string]string{"STUB_LINES": "3"}))
			pt.WaitKind[events.RunResultEvent](after, runTimeout)
			checkHistory(t, after, pt.Want{Lines: 3})
		})
	}
}

// TestAllWorkersRestartMidRun SIGKILLs every worker replica (all nine) while a run streams,
// then starts nine new ones (new replica ids, so the run's ownership key must expire first).
// The new run-watchers resume the run after its last published chunk.
func TestAllWorkersRestartMidRun(t *testing.T) {
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	const lines = 300
	r := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(streamingConfig(lines, 50*time.Millisecond)))
	r.WaitFor(runTimeout, "40 stub lines", stubLinesSoFar(40))

	killed := time.Now()
	all := env.Workers("")
	var wg sync.WaitGroup
	for _, w := range all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = w.Kill()
		}()
	}
	wg.Wait()
	dead := time.Now()
	t.Logf("SIGKILLed %d workers in %s", len(all), dead.Sub(killed).Round(time.Millisecond))
	restoreReplicas(t)

	pt.WaitKind[events.RunResultEvent](r, runTimeout)
	evs := checkHistory(t, r, pt.Want{Lines: lines})
	if e, ok := firstAfter(evs, dead, isLog); ok {
		t.Logf("takeover: next log event (seq %d) %s after the kill", e.Event.(events.RunLogEvent).Seq, e.Published.Sub(killed).Round(time.Millisecond))
	} else {
		t.Logf("no log event after the kill: the log had ended")
	}
}

// TestOwnerKillTakeover SIGKILLs the replica that owns a streaming run three times in a row
// (starting a replacement after each kill) and measures with pt.MeasureTakeover how long the
// run's log stands still each time. The run must still end complete.
func TestOwnerKillTakeover(t *testing.T) {
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	const lines, kills = 800, 3
	r := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(streamingConfig(lines, 50*time.Millisecond)))
	r.WaitFor(runTimeout, "20 stub lines", stubLinesSoFar(20))

	var gaps []time.Duration
	for i := range kills {
		tk, err := env.KillOwner(t.Context(), r.CompanyID, r.RunID)
		if err != nil {
			t.Fatalf("kill %d: %v", i+1, err)
		}
		gaps = append(gaps, tk.Gap)
		t.Logf("kill %d: %s owned the run; next log event (seq %d) stored %s after the kill (result first: %v)",
			i+1, tk.Owner, tk.Seq, tk.Gap.Round(time.Millisecond), tk.Result)
		restoreReplicas(t)
		if tk.Result {
			break
		}
		seen := len(pt.StubLines(pt.All[events.RunLogEvent](r)))
		r.WaitFor(runTimeout, "more stub lines", stubLinesSoFar(seen+20))
	}
	t.Logf("takeover gaps with --ownership-ttl %s: %s", ownershipTTL, summarize(gaps))
	pt.WaitKind[events.RunResultEvent](r, runTimeout)
	checkHistory(t, r, pt.Want{Lines: lines})
}
