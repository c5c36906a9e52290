package events_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// storeErrors counts the failed writes a StoreFailures reports and keeps what it logs.
type storeErrors struct {
	mu     sync.Mutex
	counts map[string]int
	log    strings.Builder
}

func (s *storeErrors) failures(bucket string) *events.StoreFailures {
	return events.NewStoreFailures(zerolog.New(s), bucket, s.count)
}

func (s *storeErrors) count(bucket string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.counts == nil {
		s.counts = map[string]int{}
	}
	s.counts[bucket]++
}

func (s *storeErrors) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.Write(p)
}

// seen returns how many failed writes to bucket were counted and the lines that said one failed.
func (s *storeErrors) seen(bucket string) (counted int, logged []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, line := range strings.Split(s.log.String(), "\n") {
		if strings.Contains(line, "failed; going on without it") {
			logged = append(logged, line)
		}
	}
	return s.counts[bucket], logged
}

// smallBudgetBucket is KUBECLIP_BUDGETS as BudgetBucketConfig makes it (DiscardNew, history 1),
// sized for a test to fill, and its stream.
func smallBudgetBucket(t *testing.T, js jetstream.JetStream) (jetstream.KeyValue, jetstream.Stream) {
	t.Helper()
	cfg := events.BudgetBucketConfig(1, 0, 0)
	cfg.MaxBytes = 32 << 10
	kv, err := js.CreateOrUpdateKeyValue(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(t.Context(), events.BucketStream(events.BudgetBucket))
	if err != nil {
		t.Fatal(err)
	}
	return kv, st
}

// TestBudgetsFailOpenWhenTheBucketIsFull: company A's runs fill KUBECLIP_BUDGETS (each charge
// of a new run is a new counter); past that, a charge the bucket refuses (10077) is admitted
// for every company within its budget, counted, logged once, and a company over
// its budget is still refused by a BudgetExceededError naming it. Before, every charge of every
// company failed with the store's error, which the exec recorder retried for the session's life
// and the run-watcher returned before each run's result. Once A's runs end (EndRun), B's
// counter reaches the bucket with every byte it was charged meanwhile.
func TestBudgetsFailOpenWhenTheBucketIsFull(t *testing.T) {
	_, _, js := natstest.Start(t)
	kv, st := smallBudgetBucket(t, js)
	clock := &stepClock{at: time.Now()}
	var failures storeErrors
	b, err := events.NewBudgets(events.BudgetOptions{
		KV: kv, Stream: st, Source: events.BudgetSourceLog, RunBytes: 1000, CompanyBytes: 1 << 30, Now: clock.next,
		StoreFailures: failures.failures(events.BudgetBucket),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	var aRuns []events.RunRef
	for i := 0; ; i++ {
		if i > 10_000 {
			t.Fatal("the bucket never filled")
		}
		ref := events.Ref("company-a", fmt.Sprintf("run-%d", i))
		if err := b.Charge(ctx, ref, 10); err != nil {
			t.Fatalf("company A's charge %d: %v", i, err)
		}
		aRuns = append(aRuns, ref)
		if n, _ := failures.seen(events.BudgetBucket); n > 0 {
			break
		}
	}
	_, logged := failures.seen(events.BudgetBucket)
	t.Logf("%d runs of company A filled the bucket; logged: %s", len(aRuns), logged)
	if len(logged) != 1 || !strings.Contains(logged[0], "err_code=10077") {
		t.Fatalf("logged %q, want one line with the store's maximum bytes exceeded", logged)
	}

	bRun := events.Ref("company-b", "run-b")
	for i := range 10 {
		if err := b.Charge(ctx, bRun, 90); err != nil {
			t.Fatalf("company B's charge %d within its budget: %v, want it admitted", i, err)
		}
	}
	var be *events.BudgetExceededError
	if err := b.Charge(ctx, bRun, 200); !errors.As(err, &be) || be.Kind != events.BudgetRun || be.Company != "company-b" {
		t.Fatalf("company B's charge past its run budget: %v, want a BudgetExceededError of company-b's run budget", err)
	}
	t.Logf("the refusal reads: %v", be)
	// One failed write a counter: B's charges wait in the process for budgetStoreRetry
	// instead of each trying the full bucket.
	if counted, logged := failures.seen(events.BudgetBucket); counted != 3 || len(logged) != 1 {
		t.Errorf("%d failed writes counted and %d logged; want 3 (A's last run counter, B's run and company counters) and one line", counted, len(logged))
	}

	// A's runs end: their counters go, and B's bytes reach the bucket with its next charge.
	for _, ref := range aRuns {
		if err := b.EndRun(ctx, ref); err != nil {
			t.Fatal(err)
		}
	}
	clock.advance(time.Minute)
	if err := b.Charge(ctx, bRun, 10); err != nil {
		t.Fatal(err)
	}
	entry, err := kv.Get(ctx, "log.run."+bRun.Key())
	if err != nil {
		t.Fatalf("company B's run counter after the bucket freed up: %v", err)
	}
	if got := string(entry.Value()); got != "910" {
		t.Errorf("company B's run counter = %s, want 910 (every byte charged while the bucket was full)", got)
	}
}

// TestBudgetsEndRun: a run's end drops its counters of every source (the exec-worker's and the
// run-watcher's) from the bucket, freeing their bytes, and leaves other runs' and the company's;
// a second end of the same run is no error.
func TestBudgetsEndRun(t *testing.T) {
	_, _, js := natstest.Start(t)
	kv, st := smallBudgetBucket(t, js)
	ctx := t.Context()
	budgets := map[string]*events.Budgets{}
	for _, source := range []string{events.BudgetSourceExec, events.BudgetSourceLog} {
		b, err := events.NewBudgets(events.BudgetOptions{KV: kv, Stream: st, Source: source})
		if err != nil {
			t.Fatal(err)
		}
		budgets[source] = b
	}
	ended, other := events.Ref("acme", "r1"), events.Ref("acme", "r2")
	for _, b := range budgets {
		for _, ref := range []events.RunRef{ended, other} {
			if err := b.Charge(ctx, ref, 10); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 2 {
		if err := budgets[events.BudgetSourceLog].EndRun(ctx, ended); err != nil {
			t.Fatalf("ending the run: %v", err)
		}
	}
	keys := map[string]bool{}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k := range lister.Keys() {
		keys[k] = true
	}
	for _, source := range []string{events.BudgetSourceExec, events.BudgetSourceLog} {
		if keys[source+".run."+ended.Key()] {
			t.Errorf("the ended run's %s counter is still in the bucket", source)
		}
		if !keys[source+".run."+other.Key()] {
			t.Errorf("the other run's %s counter is gone", source)
		}
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Two run counters and one company counter a source: nothing else, no delete markers.
	if info.State.Msgs != 4 {
		t.Errorf("the bucket holds %d messages, want 4 (the other run's and the company's counters)", info.State.Msgs)
	}
}

// TestWorkersMayEndARunsBudgets: under the shipped permissions the workers' user (the
// run-watcher's) may purge a run's counters of both sources, the exec-worker's included.
func TestWorkersMayEndARunsBudgets(t *testing.T) {
	srv := natstest.StartWithAuth(t, "../../"+natstest.ShippedAuthConf)
	nc, err := nats.Connect(srv.ClientURL(), natstest.User("kubeclip"), nats.CustomInboxPrefix(inbox.WorkersPrefix))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateOrUpdateKeyValue(ctx, events.BudgetBucketConfig(1, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, events.BucketStream(events.BudgetBucket))
	if err != nil {
		t.Fatal(err)
	}
	b, err := events.NewBudgets(events.BudgetOptions{KV: kv, Stream: st, Source: events.BudgetSourceLog})
	if err != nil {
		t.Fatal(err)
	}
	ref := events.Ref("acme", "r1")
	if err := b.Charge(ctx, ref, 10); err != nil {
		t.Fatal(err)
	}
	if err := b.EndRun(ctx, ref); err != nil {
		t.Fatalf("the workers' user ending a run's budgets: %v", err)
	}
	if _, err := kv.Get(ctx, "log.run."+ref.Key()); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("the run's counter after its end: %v, want it purged", err)
	}
}
