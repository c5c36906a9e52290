package runwatch

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// withBudgets gives the harness log budgets on a KUBECLIP_BUDGETS made by BudgetBucketConfig,
// sized maxBytes for a test to fill (0: as configured), and returns the bucket and its stream.
func withBudgets(t *testing.T, h *harness, maxBytes int64, failed func(bucket string)) (jetstream.KeyValue, jetstream.Stream) {
	t.Helper()
	cfg := events.BudgetBucketConfig(1, 0, 0)
	if maxBytes > 0 {
		cfg.MaxBytes = maxBytes
	}
	kv, err := h.js.CreateOrUpdateKeyValue(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, err := h.js.Stream(t.Context(), events.BucketStream(events.BudgetBucket))
	if err != nil {
		t.Fatal(err)
	}
	b, err := events.NewBudgets(events.BudgetOptions{KV: kv, Stream: st, Source: logBudgetSource, Now: clock, StoreFailures: events.NewStoreFailures(h.d.log, events.BudgetBucket, failed)})
	if err != nil {
		t.Fatal(err)
	}
	h.d.budgets = b
	return kv, st
}

// endJobRun runs runID of company testCompany to its end through the tracker: owned and
// loaded, lines logged and still pending in its journal, then its pod is found failed and the
// step flushes the log and publishes the result (the order that held every result while the
// budget bucket refused writes).
func endJobRun(t *testing.T, h *harness, pods cache.Indexer, runID string, lines int) *tracker {
	t.Helper()
	ctx := t.Context()
	h.lease(t, runID)
	tr := newTracker(h.d, testNamespace, events.Ref(testCompany, runID), func() {})
	t.Cleanup(tr.stop)
	if ok, err := tr.own(ctx); !ok || err != nil {
		t.Fatalf("owning %s: %v, %v", runID, ok, err)
	}
	if err := tr.load(ctx); err != nil {
		t.Fatal(err)
	}
	tr.loaded = true
	p := pod(corev1.PodPending, waiting("ErrImageNeverPull"), func(p *corev1.Pod) { p.Name, p.Labels = "pc-"+runID, runLabels(runID) })
	if err := tr.journal.setPod(p.Name, agentContainer); err != nil {
		t.Fatal(err)
	}
	for i := range lines {
		if err := tr.journal.add(ctx, kline(t, ts1, fmt.Sprintf("%s line %d", runID, i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := pods.Add(p); err != nil {
		t.Fatal(err)
	}
	if err := tr.step(ctx); err != nil {
		t.Fatalf("the step that ends %s: %v", runID, err)
	}
	return tr
}

// TestRunEndsWhileTheBudgetBucketIsFull: company A's runs fill KUBECLIP_BUDGETS with their log
// counters (DiscardNew: further writes fail 10077); company B's run still gets its log and its
// result, and the miss is counted. Before, the journal's flush returned the store's error, the
// tracker retried the step, and no run of any company got its result.
func TestRunEndsWhileTheBudgetBucketIsFull(t *testing.T) {
	h := newHarness(t)
	_, pods := withInformerCaches(t, h)
	// Counted from the charges' goroutines: a charge writes the run's and the company's
	// counters at once (events.Budgets.Charge).
	var misses atomic.Int64
	withBudgets(t, h, 32<<10, func(string) { misses.Add(1) })
	ctx := t.Context()
	filled := 0
	for ; misses.Load() == 0; filled++ {
		if filled > 10_000 {
			t.Fatal("company A never filled the bucket")
		}
		j := newJournal(events.Ref("company-a", fmt.Sprintf("run-%d", filled)), h.d.journalOptions(h.d.log))
		if err := j.setPod("pc-a", agentContainer); err != nil {
			t.Fatal(err)
		}
		if err := j.add(ctx, kline(t, ts1, "a line of company A")); err != nil {
			t.Fatal(err)
		}
		if err := j.flush(ctx); err != nil {
			t.Logf("company A's run %d: %v", filled, err)
			break // the bucket is full (before: the flush failed with the store's error)
		}
	}
	t.Logf("%d runs of company A filled the budget bucket", filled)

	const runID = "run-b"
	tr := endJobRun(t, h, pods, runID, 3)
	if !tr.done {
		t.Error("company B's run is not done")
	}
	results := runEvents[events.RunResultEvent](t, h, runID, events.KindResult)
	if len(results) != 1 || results[0].Reason != "ErrImageNeverPull" {
		t.Errorf("company B's results: %+v, want one", results)
	}
	var logged []string
	for _, ev := range runEvents[events.RunLogEvent](t, h, runID, events.KindLog) {
		for _, l := range ev.Lines {
			logged = append(logged, l.Text)
		}
	}
	if want := "run-b line 0|run-b line 1|run-b line 2"; strings.Join(logged, "|") != want {
		t.Errorf("company B's log: %q, want %q", logged, want)
	}
	if misses.Load() < 2 {
		t.Errorf("%d charges counted as store misses, want company B's too", misses.Load())
	}
}

// TestEndedRunsLeaveNoCounters: runs that log and end leave no run counter in KUBECLIP_BUDGETS
// (their company's stays for its window); before, each stayed for the bucket's 14-day TTL, and
// 88,300 runs of one company filled it.
func TestEndedRunsLeaveNoCounters(t *testing.T) {
	h := newHarness(t)
	_, pods := withInformerCaches(t, h)
	kv, _ := withBudgets(t, h, 0, nil)
	const runs = 20
	for i := range runs {
		endJobRun(t, h, pods, fmt.Sprintf("run-%d", i), 2)
	}
	lister, err := kv.ListKeys(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	if len(keys) != 1 || !strings.HasPrefix(keys[0], logBudgetSource+".company."+testCompany+".") {
		t.Errorf("after %d runs ended the bucket holds %q, want only the company's counter", runs, keys)
	}
}
