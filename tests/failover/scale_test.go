package failover

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// TestHundredRunsSurviveAWatcherKill starts 100 runs at once (10 companies, 100 agents), and
// while they stream SIGKILLs the run-watcher replica that owns the most runs, then starts a
// replacement (a new replica id), so three run again. Afterwards every run's history, replayed
// from the stream, must be complete: log seq 1..N without gaps, stub lines 1..40 each exactly
// once, one created, one result (succeeded), no log after the result.
func TestHundredRunsSurviveAWatcherKill(t *testing.T) {
	// The node has room for about 19 agent pods; this test fills it for minutes, so no other
	// suite may have pods waiting meanwhile (see pipelinetest.LockCluster).
	waitStart := time.Now()
	unlock, err := pt.LockCluster(true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unlock)
	t.Logf("waited %s for the cluster capacity lock", time.Since(waitStart).Round(time.Second))

	const (
		runs      = 100
		companies = 10
		lines     = 40
		// bound is the whole test's budget after the lock: 100 pods go through a 2-core node
		// about 19 at a time.
		bound = 15 * time.Minute
	)
	deadline := time.Now().Add(bound)
	cs := clustertest.Clientset(t)
	cfg := pt.StubConfig(map[string]string{"STUB_LINES": fmt.Sprint(lines), "STUB_INTERVAL": "100ms", "STUB_BURST": "2"},
		// Queued pods count against the Job's active deadline.
		func(c map[string]any) { c["podActivityDeadlineSec"] = int(bound.Seconds()) })
	companyIDs := make([]string, companies)
	for i := range companyIDs {
		companyIDs[i] = pt.NewID("co")
		pt.CleanupTenant(t, cs, companyIDs[i])
	}

	start := time.Now()
	rs := make([]*pt.Run, runs)
	for i := range rs {
		rs[i] = env.Acquire(t, companyIDs[i%companies], pt.NewID("agent"), cfg)
	}
	t.Logf("published %d acquires in %s", runs, time.Since(start).Round(time.Millisecond))

	// Wait until the first wave is through and the next ones stream, then kill the replica
	// owning the most runs.
	census := func() (streaming, finished map[string]bool) {
		streaming, finished = map[string]bool{}, map[string]bool{}
		for _, r := range rs {
			evs := r.Events()
			switch {
			case pt.Has[events.RunResultEvent](evs):
				finished[r.RunID] = true
			case pt.Has[events.RunLogEvent](evs):
				streaming[r.RunID] = true
			}
		}
		return streaming, finished
	}
	pt.Eventually(t, time.Until(deadline), "20 results and 5 runs streaming", func() bool {
		streaming, finished := census()
		return len(finished) >= 20 && len(streaming) >= 5
	})
	ctx, cancel := context.WithTimeout(t.Context(), time.Until(deadline))
	defer cancel()
	owners, err := pt.Owners(ctx, env.JS)
	if err != nil {
		t.Fatal(err)
	}
	victimID := ""
	for id, n := range owners {
		if victimID == "" || n > owners[victimID] {
			victimID = id
		}
	}
	victim := env.Worker(victimID)
	if victim == nil {
		t.Fatalf("owners %v: %q is not a live run-watcher", owners, victimID)
	}
	owned := map[string]bool{}
	for _, r := range rs {
		if o, err := pt.Owner(ctx, env.JS, events.Ref(r.CompanyID, r.RunID)); err == nil && o == victimID {
			owned[r.RunID] = true
		}
	}
	streamingAtKill, finishedAtKill := census()
	killed := time.Now()
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	dead := time.Now()
	ownedStreaming := 0
	for id := range owned {
		if streamingAtKill[id] {
			ownedStreaming++
		}
	}
	t.Logf("SIGKILLed %s at +%s: it owned %d runs, %d of them streaming (owners %v); %d runs streaming, %d finished",
		victimID, killed.Sub(start).Round(time.Millisecond), len(owned), ownedStreaming, owners, len(streamingAtKill), len(finishedAtKill))
	replacement, err := env.StartWorker(pt.RunWatcher)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("started %s as its replacement", replacement.ID)

	// Every run ends with a result.
	for _, r := range rs {
		r.WaitFor(time.Until(deadline), "result", pt.Has[events.RunResultEvent])
	}
	t.Logf("all %d results after %s", runs, time.Since(start).Round(time.Second))

	// Every run's history, replayed from the stream, is complete.
	histories := make([][]events.Received, runs)
	var failed []string
	for i, r := range rs {
		evs, err := pt.History(ctx, env, r.CompanyID, r.RunID)
		if err != nil {
			t.Fatal(err)
		}
		histories[i] = evs
		if problems := pt.CheckHistory(evs, pt.Want{Lines: lines}); len(problems) > 0 {
			failed = append(failed, r.RunID)
			owner := ""
			if owned[r.RunID] {
				owner = " (owned by the killed replica)"
			}
			t.Errorf("run %s%s:\n  %s", r.RunID, owner, strings.Join(problems, "\n  "))
		}
	}
	if len(failed) > 0 {
		t.Logf("history of %s:\n%s", failed[0], pt.Describe(histories[slices.Index(runIDs(rs), failed[0])]))
	}

	reportTimings(t, rs, histories, start)
	reportTakeovers(t, rs, histories, owned, streamingAtKill, killed, dead)
	reportPodStarts(ctx, t, cs, companyIDs)
}

func runIDs(rs []*pt.Run) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.RunID
	}
	return out
}

// reportTimings logs, over all runs, how long each step took from the start of the test.
func reportTimings(t *testing.T, rs []*pt.Run, histories [][]events.Received, start time.Time) {
	steps := []struct {
		name string
		keep func(events.Event) bool
	}{
		{"created", func(e events.Event) bool { _, ok := e.(events.RunCreatedEvent); return ok }},
		{"first Running status", func(e events.Event) bool {
			s, ok := e.(events.RunStatusEvent)
			return ok && s.Phase == events.PhaseRunning
		}},
		{"first log", isLog},
		{"result", isResult},
	}
	for _, st := range steps {
		var ds []time.Duration
		for i := range rs {
			if e, ok := firstAfter(histories[i], time.Time{}, st.keep); ok {
				ds = append(ds, e.Published.Sub(start))
			}
		}
		t.Logf("acquire → %-20s %s", st.name, summarize(ds))
	}
	var streams []time.Duration
	for i := range rs {
		first, ok1 := firstAfter(histories[i], time.Time{}, isLog)
		res, ok2 := firstAfter(histories[i], time.Time{}, isResult)
		if ok1 && ok2 {
			streams = append(streams, res.Published.Sub(first.Published))
		}
	}
	t.Logf("first log → result per run      %s", summarize(streams))
}

// reportTakeovers logs, for the runs the killed replica owned that were streaming, how long
// after the kill their next log event was stored, and for those it owned while they waited
// for a pod, when their first event after the kill came.
func reportTakeovers(t *testing.T, rs []*pt.Run, histories [][]events.Received, owned, streaming map[string]bool, killed, dead time.Time) {
	var logGaps, waitingGaps []time.Duration
	for i, r := range rs {
		if !owned[r.RunID] {
			continue
		}
		if res, ok := firstAfter(histories[i], time.Time{}, isResult); ok && res.Published.Before(killed) {
			continue
		}
		if streaming[r.RunID] {
			if e, ok := firstAfter(histories[i], dead, func(e events.Event) bool { return isLog(e) || isResult(e) }); ok {
				logGaps = append(logGaps, e.Published.Sub(killed))
			}
		} else if e, ok := firstAfter(histories[i], dead, func(events.Event) bool { return true }); ok {
			waitingGaps = append(waitingGaps, e.Published.Sub(killed))
		}
	}
	t.Logf("takeover of streaming runs (kill → their next log event or result): %s", summarize(logGaps))
	t.Logf("kill → first event of the killed replica's runs that had no pod running yet: %s", summarize(waitingGaps))
}

// reportPodStarts logs how long the pods took from creation to their container's start.
func reportPodStarts(ctx context.Context, t *testing.T, cs kubernetes.Interface, companyIDs []string) {
	var ds []time.Duration
	for _, c := range companyIDs {
		pods, err := cs.CoreV1().Pods(pt.NamespaceOf(t, c)).List(ctx, metav1.ListOptions{LabelSelector: policy.ManagedBySelector})
		if err != nil {
			t.Logf("listing pods: %v", err)
			return
		}
		for _, p := range pods.Items {
			for _, st := range p.Status.ContainerStatuses {
				if term := st.State.Terminated; term != nil {
					ds = append(ds, term.StartedAt.Sub(p.CreationTimestamp.Time))
				}
			}
		}
	}
	t.Logf("pod created → container started (%d pods): %s", len(ds), summarize(ds))
}

// summarize renders min, median, p90 and max.
func summarize(ds []time.Duration) string {
	if len(ds) == 0 {
		return "n/a"
	}
	slices.Sort(ds)
	q := func(f float64) time.Duration { return ds[int(f*float64(len(ds)-1))].Round(10 * time.Millisecond) }
	return fmt.Sprintf("min %s  median %s  p90 %s  max %s  (n=%d)", q(0), q(0.5), q(0.9), q(1), len(ds))
}
