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
)

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
		Bucket:       BudgetBucket,
		Description:  "kubeclip byte budgets of what each run and company writes to the run stream",
		History:      1,
		TTL:          ttl,
		MaxValueSize: 64,
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
	pending int64     // charged here, not yet written (company counters)
	written time.Time // when pending was last written
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

// BudgetExceededError is a charge a budget refused.
type BudgetExceededError struct {
	Kind  BudgetKind
	Limit int64
}

func (e *BudgetExceededError) Error() string {
	return fmt.Sprintf("the %s budget of %d bytes is used up", e.Kind, e.Limit)
}

// Charge counts n bytes against ref's run and company, the run first. A *BudgetExceededError
// says which budget n does not fit. When the company's refuses, the run keeps the n bytes it was
// charged: its recording or log stops anyway. A run's counter is written at once (one writer
// follows a run); a company's gathers for budgetCompanyFlush.
func (b *Budgets) Charge(ctx context.Context, ref RunRef, n int64) error {
	if err := b.add(ctx, b.opts.Source+".run."+ref.Key(), n, b.opts.RunBytes, BudgetRun, 0); err != nil {
		return err
	}
	return b.ChargeCompany(ctx, ref.CompanyID, n)
}

// ChargeCompany counts n against companyID's counter of the current window alone (the lease
// records' quota counts records, which belong to no run's counter yet). A *BudgetExceededError
// says n does not fit.
func (b *Budgets) ChargeCompany(ctx context.Context, companyID string, n int64) error {
	window := b.opts.Now().UnixNano() / int64(b.opts.Window)
	company := b.opts.Source + ".company." + keyPart(companyID) + "." + strconv.FormatInt(window, 10)
	return b.add(ctx, company, n, b.opts.CompanyBytes, BudgetCompany, budgetCompanyFlush)
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

func (b *Budgets) exceeded(kind BudgetKind, limit int64) error {
	if b.opts.OnExceeded != nil {
		b.opts.OnExceeded(kind)
	}
	return &BudgetExceededError{Kind: kind, Limit: limit}
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
// once gather has passed since its last write; until then the bytes wait in pending.
func (b *Budgets) add(ctx context.Context, key string, n, limit int64, kind BudgetKind, gather time.Duration) error {
	c := b.counter(key)
	c.mu.Lock()
	defer c.mu.Unlock()
	now := b.opts.Now()
	if !c.known {
		if err := b.refresh(ctx, key, c); err != nil {
			return err
		}
	}
	if c.used+c.pending+n > limit {
		return b.exceeded(kind, limit)
	}
	c.pending += n
	if now.Sub(c.written) < gather {
		return nil
	}
	return b.write(ctx, key, c, n, limit, kind, now)
}

// write adds c's pending bytes, the last n of them this charge's, to the bucket's counter with
// compare-and-set, reading it again when another process moved it; this charge is refused when
// the counter has no room for it any more.
func (b *Budgets) write(ctx context.Context, key string, c *budgetCounter, n, limit int64, kind BudgetKind, now time.Time) error {
	for range budgetCASAttempts {
		if c.used+c.pending > limit {
			c.pending -= n
			return b.exceeded(kind, limit)
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
				c.pending -= n
				return err
			}
			continue
		}
		if err != nil {
			c.known, c.pending = false, c.pending-n
			return fmt.Errorf("charging budget %s: %w", key, err)
		}
		c.used, c.rev, c.pending, c.written = c.used+c.pending, rev, 0, now
		return nil
	}
	c.pending -= n
	return fmt.Errorf("charging budget %s: %w (%d attempts)", key, cas.ErrContended, budgetCASAttempts)
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
