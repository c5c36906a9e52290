package events_test

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/cas"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestBudgetsAcrossReplicas: two replicas' Budgets charging one company at once, from several
// goroutines each, count every byte, refuse what does not fit, and never give up on each other's
// writes. A replica gathers a company's charges for 100 ms (the clock moves 10 ms a reading), so
// together they may admit what each gathered before seeing the other's: at most
// 2 × 100 ms / 10 ms charges past the budget.
func TestBudgetsAcrossReplicas(t *testing.T) {
	_, _, js := natstest.Start(t)
	kv, err := js.CreateOrUpdateKeyValue(t.Context(), events.BudgetBucketConfig(1, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	const charge, fits, slack = 10, 150, 2 * 10
	clock := &stepClock{at: time.Now(), step: 10 * time.Millisecond}
	var replicas []*events.Budgets
	for range 2 {
		b, err := events.NewBudgets(events.BudgetOptions{KV: kv, Source: "log", RunBytes: 1 << 20, CompanyBytes: charge * fits, Now: clock.next})
		if err != nil {
			t.Fatal(err)
		}
		replicas = append(replicas, b)
	}
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 8 {
		b := replicas[i%2]
		ref := events.Ref("acme", fmt.Sprintf("run-%d", i))
		wg.Go(func() {
			for range 40 {
				err := b.Charge(t.Context(), ref, charge)
				// A charge that lost every compare-and-set to the other replica is retried, as
				// its caller's message is; the clock that every charge moves makes each one a
				// write here, so the replicas contend far more than their gathered writes would.
				for retries := 0; errors.Is(err, cas.ErrContended) && retries < 10; retries++ {
					err = b.Charge(t.Context(), ref, charge)
				}
				var be *events.BudgetExceededError
				switch {
				case err == nil:
					ok.Add(1)
				case errors.As(err, &be) && be.Kind == events.BudgetCompany:
					refused.Add(1)
				default:
					t.Errorf("charge: %v", err)
				}
			}
		})
	}
	wg.Wait()
	if ok.Load() < fits || ok.Load() > fits+slack || ok.Load()+refused.Load() != 8*40 {
		t.Errorf("%d charges fit and %d were refused, want %d to %d of %d to fit", ok.Load(), refused.Load(), fits, fits+slack, 8*40)
	}
	// Another company is untouched by acme's budget.
	if err := replicas[0].Charge(t.Context(), events.Ref("other", "r1"), charge); err != nil {
		t.Errorf("another company's charge: %v", err)
	}
}

// TestBudgetsGatherACompanysCharges: within the gathering period a company's charges are counted
// in the process, refused past the budget there, and written once; a run's counter is written
// at every charge.
func TestBudgetsGatherACompanysCharges(t *testing.T) {
	_, _, js := natstest.Start(t)
	kv, err := js.CreateOrUpdateKeyValue(t.Context(), events.BudgetBucketConfig(1, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	clock := &stepClock{at: time.Now()} // the clock stands still
	b, err := events.NewBudgets(events.BudgetOptions{KV: kv, Source: "exec", CompanyBytes: 100, Now: clock.next})
	if err != nil {
		t.Fatal(err)
	}
	ref := events.Ref("acme", "r1")
	for i := range 10 { // the first charge is written, the next nine gather
		if err := b.Charge(t.Context(), ref, 10); err != nil {
			t.Fatalf("charge %d: %v", i, err)
		}
	}
	if err := b.Charge(t.Context(), ref, 1); !errors.As(err, new(*events.BudgetExceededError)) {
		t.Fatalf("charge past the budget: %v, want a BudgetExceededError", err)
	}
	value := func(key string) string {
		entry, err := kv.Get(t.Context(), key)
		if err != nil {
			t.Fatalf("%s: %v", key, err)
		}
		return string(entry.Value())
	}
	company := "exec.company.acme." + fmt.Sprint(clock.at.UnixNano()/int64(events.DefaultBudgetWindow))
	if got := value(company); got != "10" {
		t.Errorf("the company's counter within the period: %s, want 10 (written once)", got)
	}
	if got := value("exec.run." + ref.Key()); got != "101" {
		t.Errorf("the run's counter: %s, want 101 (every charge, the refused one's too)", got)
	}
}

// stepClock is a clock that moves step at every reading, and by advance.
type stepClock struct {
	mu   sync.Mutex
	at   time.Time
	step time.Duration
}

func (c *stepClock) next() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at = c.at.Add(c.step)
	return c.at
}

func (c *stepClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at = c.at.Add(d)
}
