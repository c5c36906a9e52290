package failover

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// publishDispatch publishes the run's dispatch request raw, without a message id, so JetStream
// keeps every copy and a dispatcher handles each: what a redelivery looks like to the handler.
func publishDispatch(t *testing.T, r *pt.Run, cfg json.RawMessage) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	subj, err := events.DispatchSubject(r.CompanyID, r.RunID)
	if err != nil {
		t.Fatal(err)
	}
	// With the plan the tenant-worker decides under the workers' (default) operator policy.
	req := r.Request(cfg)
	plan, err := lease.New(req, time.Now(), policy.DefaultOperator())
	if err != nil {
		t.Fatal(err)
	}
	decided, err := plan.Encode()
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(events.DispatchRequest{AcquireRequest: req, Namespace: pt.NamespaceOf(t, r.CompanyID), Plan: decided})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.JS.Publish(ctx, subj, data); err != nil {
		t.Fatalf("publishing a dispatch copy: %v", err)
	}
}

// awaitLeaseRecord waits until the tenant-worker has recorded the run's lease.
func awaitLeaseRecord(t *testing.T, r *pt.Run) {
	t.Helper()
	kv, err := env.JS.KeyValue(t.Context(), lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	records := lease.Records{KV: kv}
	pt.Eventually(t, time.Minute, "the lease record of run "+r.RunID, func() bool {
		_, _, err := records.Get(t.Context(), events.Ref(r.CompanyID, r.RunID))
		if err != nil && !errors.Is(err, lease.ErrNotFound) {
			t.Fatal(err)
		}
		return err == nil
	})
}

func dispatchesHandled(t *testing.T, r *pt.Run) (map[string]int, int) {
	t.Helper()
	handled, err := env.DispatchesHandled(r.CompanyID, r.RunID)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, n := range handled {
		total += n
	}
	return handled, total
}

func jobsOf(t *testing.T, cs kubernetes.Interface, r *pt.Run) int {
	t.Helper()
	jobs, err := cs.BatchV1().Jobs(pt.NamespaceOf(t, r.CompanyID)).List(t.Context(), metav1.ListOptions{LabelSelector: policy.LabelRunID + "=" + r.RunID})
	if err != nil {
		t.Fatal(err)
	}
	return len(jobs.Items)
}

// TestRedeliveredAcquireMakesOneJob delivers one run's acquire to the tenant-workers three
// times (raw, no message id) and its dispatch to the dispatchers in rounds of three copies
// until every dispatcher replica has handled at least one, all while the run starts and
// streams. The lease record (create-or-get) and the deterministic ids must make it one Job,
// one created event and one complete run.
func TestRedeliveredAcquireMakesOneJob(t *testing.T) {
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	// The tenant exists before the copies race, as it does for any real dispatch.
	warm := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(map[string]string{"STUB_LINES": "1"}))
	pt.WaitKind[events.RunResultEvent](warm, runTimeout)

	const lines = 20
	cfg := pt.StubConfig(map[string]string{"STUB_LINES": fmt.Sprint(lines), "STUB_INTERVAL": "400ms"})
	r := env.NewRun(t, company, pt.NewID("agent"))
	r.Collect()
	for range replicas {
		r.PublishAcquire(cfg, false)
	}
	// A dispatch copy is a redelivery, and a redelivery only exists once the tenant-worker
	// has recorded the lease and dispatched it: a copy ahead of the record is a dispatch no
	// tenant-worker sent, which the dispatcher fails for good.
	awaitLeaseRecord(t, r)
	var handled map[string]int
	for round := 1; ; round++ {
		_, before := dispatchesHandled(t, r)
		for range replicas {
			publishDispatch(t, r, cfg)
		}
		pt.Eventually(t, time.Minute, "the dispatch copies to be handled", func() bool {
			_, total := dispatchesHandled(t, r)
			return total >= before+replicas
		})
		handled, _ = dispatchesHandled(t, r)
		if len(handled) == replicas {
			t.Logf("after %d rounds every dispatcher handled copies of the dispatch: %v", round, handled)
			break
		}
		if round == 10 {
			t.Logf("after %d rounds only %d dispatchers handled copies: %v", round, len(handled), handled)
			break
		}
	}
	if len(handled) < 2 {
		t.Errorf("the dispatch copies reached only %v; the test needs at least two dispatchers racing", handled)
	}

	pt.WaitKind[events.RunResultEvent](r, runTimeout)
	if n := jobsOf(t, cs, r); n != 1 {
		t.Errorf("%d Jobs for one run, want 1", n)
	}
	checkHistory(t, r, pt.Want{Lines: lines})
}

// TestTwoAcquiresSameAgentTwoDispatchers publishes acquires of two runs of the same agent at
// once. The dispatchers share the agent guard: exactly one run is created first, and the
// other is created only after the first one's result (the busy timeout, 90 s, is longer than
// the first run), then runs to completion too.
func TestTwoAcquiresSameAgentTwoDispatchers(t *testing.T) {
	cs := clustertest.Clientset(t)
	company, agent := pt.NewID("co"), pt.NewID("agent")
	pt.CleanupTenant(t, cs, company)
	const lines = 3
	cfg := pt.StubConfig(map[string]string{"STUB_LINES": fmt.Sprint(lines), "STUB_SLEEP": "5s"})
	a, b := env.NewRun(t, company, agent), env.NewRun(t, company, agent)
	a.Collect()
	b.Collect()
	a.PublishAcquire(cfg, true)
	b.PublishAcquire(cfg, true)

	// Whichever is created first runs first; the other must wait for its result.
	var first, second *pt.Run
	pt.Eventually(t, runTimeout, "one of the two runs to be created", func() bool {
		ac, bc := pt.Has[events.RunCreatedEvent](a.Events()), pt.Has[events.RunCreatedEvent](b.Events())
		switch {
		case ac && bc && b.ReceivedAt(t, isCreated).Before(a.ReceivedAt(t, isCreated)):
			first, second = b, a
		case ac:
			first, second = a, b
		case bc:
			first, second = b, a
		default:
			return false
		}
		return true
	})
	firstResult := pt.WaitKind[events.RunResultEvent](first, runTimeout)
	second.WaitFor(runTimeout, "created after the first run's result", pt.Has[events.RunCreatedEvent])
	firstCreatedAt := first.ReceivedAt(t, isCreated)
	firstResultAt := first.ReceivedAt(t, isResult)
	secondCreatedAt := second.ReceivedAt(t, isCreated)
	t.Logf("first %s created +0s, result +%s; second %s created +%s",
		first.RunID, firstResultAt.Sub(firstCreatedAt).Round(time.Millisecond),
		second.RunID, secondCreatedAt.Sub(firstCreatedAt).Round(time.Millisecond))
	if !secondCreatedAt.After(firstResultAt) {
		t.Errorf("second run created at %s, not after the first run's result at %s: two runs of one agent at once",
			secondCreatedAt.Format(time.RFC3339Nano), firstResultAt.Format(time.RFC3339Nano))
	}
	if firstResult.Outcome != events.OutcomeSucceeded {
		t.Errorf("first result = %+v", firstResult)
	}
	pt.WaitKind[events.RunResultEvent](second, runTimeout)
	for _, r := range []*pt.Run{first, second} {
		checkHistory(t, r, pt.Want{Lines: lines})
	}
	created, err := env.Records(pt.Dispatcher, func(rec pt.LogRecord) bool {
		return rec.Message == "run created" && (rec.RunID == a.RunID || rec.RunID == b.RunID)
	})
	if err != nil {
		t.Fatal(err)
	}
	byRun := map[string][]string{}
	for id, recs := range created {
		for _, rec := range recs {
			byRun[rec.RunID] = append(byRun[rec.RunID], id)
		}
	}
	t.Logf("created by: first %v, second %v", byRun[first.RunID], byRun[second.RunID])
}

func isCreated(e events.Event) bool { _, ok := e.(events.RunCreatedEvent); return ok }

// TestDispatchRedeliveredAfterResultStartsNothing: a dispatcher that dies after it created a
// run and published `created`, but before its ack reached JetStream, gets the dispatch back
// (to itself or another replica) after the 30 s ack wait, by which time a short run has ended.
// That redelivery must neither start the agent again nor take the agent's guard: the run is
// over, nobody would ever free the guard again, and the agent's next acquire would wait until
// the guard's TTL (the run's deadline plus 5 minutes) and fail with agent_busy.
//
// The Job's TTL is 0 here, so the finished Job is gone when the dispatch comes back, as it is
// for any run older than its jobTtlSecondsAfterFinished.
func TestDispatchRedeliveredAfterResultStartsNothing(t *testing.T) {
	cs := clustertest.Clientset(t)
	company, agent := pt.NewID("co"), pt.NewID("agent")
	pt.CleanupTenant(t, cs, company)
	cfg := pt.StubConfig(map[string]string{"STUB_LINES": "2"}, func(c map[string]any) { c["jobTtlSecondsAfterFinished"] = 0 })
	r := env.Acquire(t, company, agent, cfg)
	res := pt.WaitKind[events.RunResultEvent](r, runTimeout)
	if res.Outcome != events.OutcomeSucceeded {
		t.Errorf("result = %+v, want succeeded", res)
	}
	pt.Eventually(t, time.Minute, "the finished Job to be deleted by its TTL", func() bool { return jobsOf(t, cs, r) == 0 })

	// Watch the run's pods from now on: any pod that appears is the agent running again.
	ns := pt.NamespaceOf(t, r.CompanyID)
	pods, err := cs.CoreV1().Pods(ns).Watch(t.Context(), metav1.ListOptions{LabelSelector: policy.LabelRunID + "=" + r.RunID})
	if err != nil {
		t.Fatal(err)
	}
	defer pods.Stop()
	_, before := dispatchesHandled(t, r)
	publishDispatch(t, r, cfg)
	pt.Eventually(t, time.Minute, "a dispatcher to handle the redelivered dispatch", func() bool {
		_, total := dispatchesHandled(t, r)
		return total > before
	})
	newPods := map[string]bool{}
	drain := time.After(3 * time.Second) // a pod created by the handler shows up well within this
	for done := false; !done; {
		select {
		case ev := <-pods.ResultChan():
			if ev.Type == watch.Added {
				if m, err := metaName(ev.Object); err == nil {
					newPods[m] = true
				}
			}
		case <-drain:
			done = true
		}
	}
	if n := jobsOf(t, cs, r); n != 0 || len(newPods) != 0 {
		t.Errorf("BUG: a dispatch redelivered after the run's result re-created the run: %d Jobs, new pods %v; the agent ran a second time",
			n, keys(newPods))
	}

	// The agent is free: its next run is created at once, not after the guard's TTL.
	next := env.Acquire(t, company, agent, pt.StubConfig(map[string]string{"STUB_LINES": "1"}))
	if evs, ok := next.Await(45*time.Second, pt.Has[events.RunCreatedEvent]); !ok {
		t.Errorf("BUG: the agent's next run was not created within 45 s after a dispatch of its finished run %s was redelivered: "+
			"the redelivery took the agent guard again and nothing frees it before its TTL; events of the next run:\n%s",
			r.RunID, pt.Describe(evs))
	}
}

func metaName(obj any) (string, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return "", fmt.Errorf("%T has no metadata", obj)
	}
	return m.GetName(), nil
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	return slices.AppendSeq(out, maps.Keys(m))
}
