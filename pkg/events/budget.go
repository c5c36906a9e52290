package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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
	DefaultRunBudget     = 256 << 20
	DefaultCompanyBudget = 1 << 30
	DefaultBudgetWindow  = 24 * time.Hour
	// budgetBucketBytes bounds BudgetBucket: a counter is about 150 bytes with its headers,
	// history 1, so 16 MiB holds some 100,000 runs' counters within the bucket's TTL.
	budgetBucketBytes = 16 << 20
	// budgetCASAttempts bounds the compare-and-set retries of one charge: replicas charging
	// the same company at once take turns.
	budgetCASAttempts = 20
)

// BudgetBucketConfig is KUBECLIP_BUDGETS. Its TTL is the run stream's age (what a company's
// bytes occupy the store for), so a run's counter lives as long as its events.
func BudgetBucketConfig(replicas int, ttl time.Duration) jetstream.KeyValueConfig {
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
		MaxBytes:     budgetBucketBytes,
		Storage:      jetstream.FileStorage,
		Replicas:     replicas,
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
	// CompanyBytes is the most one company may write per Window (default 1 GiB a day). With the
	// run stream's 14-day age that bounds a company's share of the stream at 14 GiB per source
	// before the stream's own byte limit evicts the oldest events.
	CompanyBytes int64
	Window       time.Duration
	Now          func() time.Time
	// OnExceeded is told every charge a budget refuses (the budget metric); nil means none.
	OnExceeded func(kind BudgetKind)
}

// Budgets charges bytes to a run's and its company's counters in BudgetBucket. The counters are
// shared by every replica and survive restarts; a charge is one compare-and-set per counter.
type Budgets struct{ opts BudgetOptions }

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
	if opts.CompanyBytes <= 0 {
		opts.CompanyBytes = DefaultCompanyBudget
	}
	if opts.Window <= 0 {
		opts.Window = DefaultBudgetWindow
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Budgets{opts: opts}, nil
}

// BudgetExceededError is a charge a budget refused.
type BudgetExceededError struct {
	Kind  BudgetKind
	Limit int64
}

func (e *BudgetExceededError) Error() string {
	return fmt.Sprintf("the %s budget of %d bytes is used up", e.Kind, e.Limit)
}

// Charge counts n bytes against ref's run and company. A *BudgetExceededError says which
// budget n does not fit; then nothing is counted.
func (b *Budgets) Charge(ctx context.Context, ref RunRef, n int64) error {
	window := b.opts.Now().UnixNano() / int64(b.opts.Window)
	counters := []struct {
		kind  BudgetKind
		key   string
		limit int64
	}{
		{BudgetCompany, b.opts.Source + ".company." + keyPart(ref.CompanyID) + "." + strconv.FormatInt(window, 10), b.opts.CompanyBytes},
		{BudgetRun, b.opts.Source + ".run." + ref.Key(), b.opts.RunBytes},
	}
	// Check both first, so a charge the company refuses is not counted against the run.
	for _, c := range counters {
		used, _, err := b.read(ctx, c.key)
		if err != nil {
			return err
		}
		if used+n > c.limit {
			return b.exceeded(c.kind, c.limit)
		}
	}
	for _, c := range counters {
		if err := b.add(ctx, c.key, n, c.limit, c.kind); err != nil {
			return err
		}
	}
	return nil
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

// add adds n to the counter with compare-and-set, refusing past limit.
func (b *Budgets) add(ctx context.Context, key string, n, limit int64, kind BudgetKind) error {
	for range budgetCASAttempts {
		used, rev, err := b.read(ctx, key)
		if err != nil {
			return err
		}
		if used+n > limit {
			return b.exceeded(kind, limit)
		}
		value := []byte(strconv.FormatInt(used+n, 10))
		if rev == 0 {
			_, err = b.opts.KV.Create(ctx, key, value)
		} else {
			_, err = b.opts.KV.Update(ctx, key, value, rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue // another replica charged it meanwhile
		}
		if err != nil {
			return fmt.Errorf("charging budget %s: %w", key, err)
		}
		return nil
	}
	return fmt.Errorf("charging budget %s: %d concurrent updates in a row", key, budgetCASAttempts)
}
