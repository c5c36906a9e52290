package lease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// A company can create lease records at will: every acquire leaves one, a failing one too, and
// KUBECLIP_LEASES refuses every company's writes once full (a KV bucket discards new). So the
// records one company creates are counted per events.LeaseRecordWindow and refused past its
// quota (events.Options.LeaseRecordQuota: the bucket's share divided among the companies the
// store is sized for, for the whole life of a record), and a failed acquire's record expires
// after FailedRecordTTL rather than RecordTTL.

// QuotaSource names the lease records' counters in KUBECLIP_BUDGETS
// ("lease.company.<company>.<window>") and the budget metric's source.
const QuotaSource = "lease"

// FailedRecordTTL is how long the record of a failed acquire is kept: long enough that a
// redelivery of the acquire (its consumer retries for about 1.5 minutes, the duplicate window
// is 10 minutes) or the host asking again the same day finds the failure rather than running
// the acquire again; short enough that failing acquires do not pile records up for RecordTTL.
const FailedRecordTTL = 24 * time.Hour

// RecordQuota counts the lease records each company creates, across every tenant-worker
// replica (a company counter per window in KUBECLIP_BUDGETS, pkg/events.Budgets).
type RecordQuota struct {
	budgets *events.Budgets
	limit   int64
}

// NewRecordQuota counts in kv (events.BudgetBucket) at most perWindow records per company per
// events.LeaseRecordWindow. now is the clock (nil: time.Now); onExceeded, when not nil, is told
// every record refused (the budget metric, source QuotaSource, kind company).
func NewRecordQuota(kv jetstream.KeyValue, perWindow int64, now func() time.Time, onExceeded func(events.BudgetKind)) (*RecordQuota, error) {
	if perWindow < 1 {
		return nil, fmt.Errorf("lease: a quota of %d lease records per company refuses every acquire", perWindow)
	}
	b, err := events.NewBudgets(events.BudgetOptions{KV: kv, Source: QuotaSource, CompanyBytes: perWindow, Window: events.LeaseRecordWindow, Now: now, OnExceeded: onExceeded})
	if err != nil {
		return nil, err
	}
	return &RecordQuota{budgets: b, limit: perWindow}, nil
}

// RecordQuotaError refuses a record to a company that created its quota in the window.
type RecordQuotaError struct {
	Limit  int64
	Window time.Duration
}

func (e *RecordQuotaError) Error() string {
	return fmt.Sprintf("the company created %d lease records within %s, its lease-record quota (the lease records' share of the store, --store-bytes, divided among --store-companies); acquire again in the next window", e.Limit, e.Window)
}

// CreateCounted is Create for an acquire: a run that has a record already gets it back
// uncounted (a redelivered or retried acquire), a new one is counted against its company's
// quota first and refused past it (*RecordQuotaError, no record written). q nil counts nothing.
func (r Records) CreateCounted(ctx context.Context, rec Record, q *RecordQuota) (stored Record, created bool, err error) {
	if q != nil {
		existing, _, err := r.Get(ctx, rec.Ref())
		switch {
		case err == nil:
			return existing, false, nil
		case !errors.Is(err, ErrNotFound):
			return Record{}, false, err
		}
		var be *events.BudgetExceededError
		if err := q.budgets.ChargeCompany(ctx, rec.CompanyID, 1); errors.As(err, &be) {
			return Record{}, false, &RecordQuotaError{Limit: q.limit, Window: events.LeaseRecordWindow}
		} else if err != nil {
			return Record{}, false, fmt.Errorf("counting the lease record of run %s: %w", rec.RunID, err)
		}
	}
	return r.Create(ctx, rec)
}
