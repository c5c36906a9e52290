package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/cas"
)

// BudgetKind names what a tenant's output was counted against.
type BudgetKind string

// The budgets of what a company writes into the run stream.
const (
	BudgetExec    BudgetKind = "exec"
	BudgetRun     BudgetKind = "run"
	BudgetCompany BudgetKind = "company"
)

func (k BudgetKind) valid() bool { return k == BudgetExec || k == BudgetRun || k == BudgetCompany }

// The sources whose bytes are budgeted: each has its own counters in BudgetBucket.
const (
	// BudgetSourceExec is recorded execs' output (the exec-worker).
	BudgetSourceExec = "exec"
	// BudgetSourceLog is container logs (the run-watcher).
	BudgetSourceLog = "log"
)

// BudgetBucket holds the byte counters of the run and company budgets: key
// <source>.run.<RunRef.Key> and <source>.company.<company>.<window>, value the decimal count.
const BudgetBucket = "KUBECLIP_BUDGETS"

// Budget defaults; BudgetOptions documents each.
const (
	DefaultRunBudget    = 256 << 20
	DefaultBudgetWindow = 24 * time.Hour
	// budgetCASAttempts bounds the compare-and-set retries of one charge: replicas charging
	// the same company at once take turns.
	budgetCASAttempts = 20
	// budgetCacheKeys bounds the counters a Budgets remembers; past it the memory is dropped
	// and rebuilt from the bucket as charges come (a forgotten counter costs one read).
	budgetCacheKeys = 4096
	// budgetCompanyFlush is how long a company's charges gather in a process before they are
	// written: a company's counter is shared by every replica, and one write per charge would
	// have them take turns on every event. A company can so exceed its budget by what its runs
	// write in this long on each replica, and a crash forgets at most that much.
	budgetCompanyFlush = 100 * time.Millisecond
	// budgetStoreRetry is how long a counter whose write the store refused keeps its charges
	// in the process before it tries the bucket again.
	budgetStoreRetry = 5 * time.Second
)

// BudgetMaxValueSize bounds a message of BudgetBucket, its headers included: the largest
// counter (a Spend of two 19-digit counts, 61 bytes) beside the largest compare-and-set header
// (71 bytes), with room to spare.
const BudgetMaxValueSize = 256

// BudgetBucketConfig is KUBECLIP_BUDGETS, its share of a store of storeBytes (0: the default).
// Its TTL is the run stream's age (what a company's bytes occupy the store for), so a run's
// counter lives as long as its events.
func BudgetBucketConfig(replicas int, ttl time.Duration, storeBytes int64) jetstream.KeyValueConfig {
	if replicas <= 0 {
		replicas = 1
	}
	if ttl <= 0 {
		ttl = DefaultRunMaxAge
	}
	return jetstream.KeyValueConfig{
		Bucket:      BudgetBucket,
		Description: "kubeclip byte budgets of what each run and company writes to the run stream",
		History:     1,
		TTL:         ttl,
		// The server counts a message's headers against it (hdr+msg ≤ MaxMsgSize), and a
		// compare-and-set carries "Nats-Expected-Last-Subject-Sequence: <revision>" (51 bytes
		// and up to 20 digits). At 64, an 8-digit counter failed once the bucket's revisions
		// reached 6 digits, and the broker's spend (events.Spend, up to 61 bytes) never fit.
		MaxValueSize: BudgetMaxValueSize,
		// A counter is about 150 bytes with its headers, history 1: the default store's share
		// (65 MiB) holds some 400,000 counters within the TTL.
		MaxBytes: StoreLimit(storeBytes, StoreBudgets),
		Storage:  jetstream.FileStorage,
		Replicas: replicas,
	}
}

// BudgetOptions configures Budgets.
type BudgetOptions struct {
	// KV is BudgetBucket; required.
	KV jetstream.KeyValue
	// Source names the writer whose bytes are counted ("exec" for recorded execs, "log" for
	// container logs): each has its own counters.
	Source string
	// RunBytes is the most one run may write (default 256 MiB).
	RunBytes int64
	// CompanyBytes is the most one company may write per Window (default: Options.CompanyBudget
	// of the default store, about 33 MiB a day): the run stream's share divided among the
	// companies the store is sized for, both sources and every window of the retention, so
	// that many companies at their budgets evict nobody's events before the retention ends.
	CompanyBytes int64
	Window       time.Duration
	Now          func() time.Time
	// OnExceeded is told every charge a budget refuses (the budget metric); nil means none.
	OnExceeded func(kind BudgetKind)
	// StoreFailures is told every charge the bucket could not count (the bucket full, NATS
	// unreachable), which is admitted all the same (Charge), and every write it took; nil means
	// nobody.
	StoreFailures *StoreFailures
	// Stream is BudgetBucket's stream (BucketStream(BudgetBucket)), needed by EndRun only.
	Stream StreamPurger
}

// Budgets charges bytes to a run's and its company's counters in BudgetBucket. The counters are
// shared by every replica and survive restarts. A charge is on the hot path (every log and
// recorded exec event), so each counter's last value and revision are remembered: a charge is
// one compare-and-set per counter, and a counter is read again only when another writer moved
// it. Charges of one counter in this process take turns, so they do not conflict with each other.
type Budgets struct {
	opts BudgetOptions

	mu       sync.Mutex
	counters map[string]*budgetCounter
}

// budgetCounter is what this process last knew of one counter.
type budgetCounter struct {
	mu      sync.Mutex
	known   bool // used and rev are the bucket's as of the last read or write
	used    int64
	rev     uint64    // 0: no counter in the bucket yet
	pending int64     // charged here, not yet written (company counters, and any the store refused)
	written time.Time // when pending was last written
	// retryAt: a write the store refused is not tried again before then (the charges between
	// wait in pending), so a full bucket costs one refused write a counter per
	// budgetStoreRetry, not one per event.
	retryAt time.Time
}

// NewBudgets validates opts.
func NewBudgets(opts BudgetOptions) (*Budgets, error) {
	if opts.KV == nil {
		return nil, errors.New("events: BudgetOptions.KV is required")
	}
	if !isKVKey(opts.Source) {
		return nil, fmt.Errorf("events: BudgetOptions.Source %q is not a key token", opts.Source)
	}
	if opts.RunBytes <= 0 {
		opts.RunBytes = DefaultRunBudget
	}
	if opts.Window <= 0 {
		opts.Window = DefaultBudgetWindow
	}
	if opts.CompanyBytes <= 0 {
		opts.CompanyBytes = Options{}.CompanyBudget(opts.Window)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Budgets{opts: opts, counters: map[string]*budgetCounter{}}, nil
}

// BudgetExceededError is a charge a budget refused. It names the budget: whose (Company), of
// what (Source), which (Kind) and how large (Limit bytes, per Window for a company's).
type BudgetExceededError struct {
	Kind    BudgetKind
	Limit   int64
	Source  string
	Company string
	Window  time.Duration // a company budget's window; 0 for the others
}

func (e *BudgetExceededError) Error() string { return e.Budget() + " is used up" }

// Budget names the budget for a person: "company acme's recorded-output budget per company of
// 1073741824 bytes per day".
func (e *BudgetExceededError) Budget() string {
	what := "output"
	switch e.Source {
	case BudgetSourceExec:
		what = "recorded-output"
	case BudgetSourceLog:
		what = "container-log"
	}
	per := ""
	switch {
	case e.Window == 24*time.Hour:
		per = " per day"
	case e.Window > 0:
		per = " per " + e.Window.String()
	}
	return fmt.Sprintf("company %s's %s budget per %s of %d bytes%s", e.Company, what, e.Kind, e.Limit, per)
}

// Charge counts n bytes against ref's run and company. A *BudgetExceededError says which
// budget n does not fit, the run's when both refuse. When the company's refuses, the run keeps
// the n bytes it was charged: its recording or log stops anyway. A run's counter is written at
// once (one writer follows a run); a company's gathers for budgetCompanyFlush.
//
// The two are charged at once, each its own counter, so a charge that writes both costs its
// caller one NATS round trip, not two in a row (a recorded exec waits for it before its event
// is published: issue 26). When the run's refuses, the company's takes its n bytes back unless
// they were written meanwhile: then the company is counted n bytes it did not store, once per
// run that reaches its budget.
//
// A charge the bucket cannot count (it is full, or NATS does not answer) fails open: it is
// admitted on what this process counted (its bytes wait in the process and are written with a
// later charge, budgetStoreRetry on), and StoreFailures is told. Refusing it instead would stop
// every company's output, and its results behind it, whenever one company filled the shared
// bucket; a company within its budget loses nothing, and one over it is still refused as soon
// as this process's own count says so. Only ctx's end and cas.ErrContended (other replicas
// moving the counter: the caller retries) are returned as errors.
func (b *Budgets) Charge(ctx context.Context, ref RunRef, n int64) error {
	company := b.companyKey(ref)
	var companyErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		companyErr = b.add(ctx, company, n, b.opts.CompanyBytes, ref, BudgetCompany, budgetCompanyFlush)
	})
	runErr := b.add(ctx, b.runKey(ref), n, b.opts.RunBytes, ref, BudgetRun, 0)
	wg.Wait()
	if runErr != nil {
		if companyErr == nil {
			b.takeBack(company, n)
		}
		return runErr
	}
	return companyErr
}

// takeBack withdraws n bytes charged to key and not yet written; bytes written already stay.
func (b *Budgets) takeBack(key string, n int64) {
	c := b.counter(key)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending -= min(n, c.pending)
}

// ChargeCompany counts n against companyID's counter of the current window alone (the lease
// records' quota counts records, which belong to no run's counter yet). A *BudgetExceededError
// says n does not fit.
func (b *Budgets) ChargeCompany(ctx context.Context, companyID string, n int64) error {
	return b.chargeCompany(ctx, RunRef{CompanyID: companyID}, n)
}

// chargeCompany counts n against ref's company's counter of the current window.
func (b *Budgets) chargeCompany(ctx context.Context, ref RunRef, n int64) error {
	return b.add(ctx, b.companyKey(ref), n, b.opts.CompanyBytes, ref, BudgetCompany, budgetCompanyFlush)
}

// companyKey is ref's company's counter of the current window.
func (b *Budgets) companyKey(ref RunRef) string {
	window := b.opts.Now().UnixNano() / int64(b.opts.Window)
	return b.opts.Source + ".company." + keyPart(ref.CompanyID) + "." + strconv.FormatInt(window, 10)
}

func (b *Budgets) runKey(ref RunRef) string { return b.opts.Source + ".run." + ref.Key() }

// EndRun drops the run's counters, of every source, from the bucket and from this process:
// the run ended (its result is published), so nothing charges it again, and a counter left to
// the bucket's 14-day TTL filled the bucket for every company (issue 26). The counters are
// purged (PurgeKeys), which a full bucket allows. Idempotent: a run ended twice (a redelivery,
// another replica) purges nothing the second time.
func (b *Budgets) EndRun(ctx context.Context, ref RunRef) error {
	b.mu.Lock()
	delete(b.counters, b.runKey(ref))
	b.mu.Unlock()
	if b.opts.Stream == nil {
		return errors.New("events: BudgetOptions.Stream is required to end a run's budgets")
	}
	return PurgeKeys(ctx, b.opts.Stream, BudgetBucket, "*.run."+ref.Key())
}

// counter returns what this process knows of key.
func (b *Budgets) counter(key string) *budgetCounter {
	b.mu.Lock()
	defer b.mu.Unlock()
	c := b.counters[key]
	if c == nil {
		if len(b.counters) >= budgetCacheKeys {
			clear(b.counters)
		}
		c = &budgetCounter{}
		b.counters[key] = c
	}
	return c
}

func (b *Budgets) exceeded(ref RunRef, kind BudgetKind, limit int64) error {
	if b.opts.OnExceeded != nil {
		b.opts.OnExceeded(kind)
	}
	e := &BudgetExceededError{Kind: kind, Limit: limit, Source: b.opts.Source, Company: ref.CompanyID}
	if kind == BudgetCompany {
		e.Window = b.opts.Window
	}
	return e
}

// storeFailed admits a charge the bucket could not count (Charge: fail open), unless ctx ended
// (the caller stops; nothing to admit).
func (b *Budgets) storeFailed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return err
	}
	b.opts.StoreFailures.Failed(err)
	return nil
}

// read returns the counter and its revision (0: no counter yet).
func (b *Budgets) read(ctx context.Context, key string) (used int64, rev uint64, err error) {
	entry, err := b.opts.KV.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("reading budget %s: %w", key, err)
	}
	if err := json.Unmarshal(entry.Value(), &used); err != nil {
		return 0, 0, fmt.Errorf("decoding budget %s: %w", key, err)
	}
	return used, entry.Revision(), nil
}

// add adds n to the counter key, refusing past limit. The counter is written (compare-and-set)
// once gather has passed since its last write; until then the bytes wait in pending. A counter
// the bucket cannot read is counted from what this process holds (fail open, Charge).
func (b *Budgets) add(ctx context.Context, key string, n, limit int64, ref RunRef, kind BudgetKind, gather time.Duration) error {
	c := b.counter(key)
	c.mu.Lock()
	defer c.mu.Unlock()
	now := b.opts.Now()
	if !c.known && !now.Before(c.retryAt) {
		if err := b.refresh(ctx, key, c); err != nil {
			c.retryAt = now.Add(budgetStoreRetry)
			if err := b.storeFailed(ctx, err); err != nil {
				return err
			}
		}
	}
	if c.used+c.pending+n > limit {
		return b.exceeded(ref, kind, limit)
	}
	c.pending += n
	if now.Sub(c.written) < gather || !c.known || now.Before(c.retryAt) {
		return nil
	}
	return b.write(ctx, key, c, n, limit, ref, kind, now)
}

// write adds c's pending bytes, the last n of them this charge's, to the bucket's counter with
// compare-and-set, reading it again when another process moved it; this charge is refused when
// the counter has no room for it any more.
func (b *Budgets) write(ctx context.Context, key string, c *budgetCounter, n, limit int64, ref RunRef, kind BudgetKind, now time.Time) error {
	for range budgetCASAttempts {
		if c.used+c.pending > limit {
			c.pending -= n
			return b.exceeded(ref, kind, limit)
		}
		value := []byte(strconv.FormatInt(c.used+c.pending, 10))
		var rev uint64
		var err error
		if c.rev == 0 {
			rev, err = b.opts.KV.Create(ctx, key, value)
		} else {
			rev, err = b.opts.KV.Update(ctx, key, value, c.rev)
		}
		if cas.IsConflict(err) {
			// Another process charged it meanwhile: its bytes count too.
			if err := b.refresh(ctx, key, c); err != nil {
				return b.writeFailed(ctx, c, n, now, err)
			}
			continue
		}
		if err != nil {
			return b.writeFailed(ctx, c, n, now, fmt.Errorf("charging budget %s: %w", key, err))
		}
		c.used, c.rev, c.pending, c.written = c.used+c.pending, rev, 0, now
		b.opts.StoreFailures.Wrote()
		return nil
	}
	c.pending -= n
	return fmt.Errorf("charging budget %s: %w (%d attempts)", key, cas.ErrContended, budgetCASAttempts)
}

// writeFailed admits the charge of n whose write failed (storeFailed): its bytes stay in
// pending, written with a later charge once the bucket takes writes again, not before
// budgetStoreRetry. A charge whose ctx ended is withdrawn.
func (b *Budgets) writeFailed(ctx context.Context, c *budgetCounter, n int64, now time.Time, err error) error {
	if err := b.storeFailed(ctx, err); err != nil {
		c.pending -= n
		return err
	}
	c.retryAt = now.Add(budgetStoreRetry)
	return nil
}

// refresh reads key's counter into c.
func (b *Budgets) refresh(ctx context.Context, key string, c *budgetCounter) error {
	used, rev, err := b.read(ctx, key)
	if err != nil {
		c.known = false
		return err
	}
	c.used, c.rev, c.known = used, rev, true
	return nil
}
