package runwatch

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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

// LifecycleObserver is told when a run became ready and when this replica took a run over
// (the run-watcher's metrics implement it); an Observer that does not implement it is not told.
type LifecycleObserver interface {
	// RunReady reports the time from the lease record's creation (the acquire) to the run's
	// first Running status this replica published.
	RunReady(sinceAcquire time.Duration)
	// RunTakenOver counts a run this replica began to follow after an earlier owner (another
	// replica, or this one before a restart) had published its status.
	RunTakenOver()
}

// lifecycle is o's LifecycleObserver, nil when it has none.
func (o Options) lifecycle() LifecycleObserver {
	lo, _ := o.Observer.(LifecycleObserver)
	return lo
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

// BudgetObserver is told when a log budget stops a run's log (the run-watcher's metrics
// implement it); an Observer that does not implement it is not told.
type BudgetObserver interface {
	BudgetExceeded(source string, kind events.BudgetKind)
}

// LogGapObserver is told each gap a follower found in a container's log (k8s.LogGap: lines the
// kubelet rotated away before they were read); the run-watcher's metrics implement it.
type LogGapObserver interface {
	LogGap()
}

// StoreObserver is told every write to a shared bucket that failed and was let through (fail
// open: events.StoreFailures); the run-watcher's metrics implement it.
type StoreObserver interface {
	StoreWriteFailed(bucket string)
}

// logBudgetSource names the container logs' counters in KUBECLIP_BUDGETS and the metric.
const logBudgetSource = events.BudgetSourceLog

// openLogBudgets opens KUBECLIP_BUDGETS and returns the container logs' budgets. The
// run-watcher also ends every run's counters, of both sources, when it publishes the run's
// result (endRun), so it holds the bucket's stream too.
func openLogBudgets(ctx context.Context, js jetstream.JetStream, o Options) (*events.Budgets, error) {
	kv, err := events.EnsureBucket(ctx, js, events.BudgetBucketConfig(o.StreamReplicas, 0, o.StoreBytes))
	if err != nil {
		return nil, fmt.Errorf("opening KV bucket %s: %w", events.BudgetBucket, err)
	}
	st, err := events.OpenStream(ctx, js, events.BucketStream(events.BudgetBucket))
	if err != nil {
		return nil, err
	}
	opts := events.BudgetOptions{
		KV: kv, Stream: st, Source: logBudgetSource, Now: o.Now,
		RunBytes: o.LogBudget.RunBytes, CompanyBytes: o.LogBudget.CompanyBytes, Window: o.LogBudget.Window,
	}
	if bo, ok := o.Observer.(BudgetObserver); ok {
		opts.OnExceeded = func(kind events.BudgetKind) { bo.BudgetExceeded(logBudgetSource, kind) }
	}
	var count func(string)
	if so, ok := o.Observer.(StoreObserver); ok {
		count = so.StoreWriteFailed
	}
	opts.StoreFailures = events.NewStoreFailures(o.Logger, events.BudgetBucket, count)
	return events.NewBudgets(opts)
}
