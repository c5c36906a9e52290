package events_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestStoreSharesLeaveHeadroom pins the table: every store has a share, in Store order, and the
// shares leave 15 % of the store free, so each stream and bucket reaches its own limit before
// the server's max_file_store (a full store refuses every stream's writes).
func TestStoreSharesLeaveHeadroom(t *testing.T) {
	var sum int64
	names := map[string]bool{}
	for i, s := range events.Stores() {
		if int(s.Store) != i {
			t.Errorf("row %d is store %d: the table must be in Store order", i, s.Store)
		}
		if s.Permille <= 0 || s.Name == "" || s.PerCompany == "" || names[s.Name] {
			t.Errorf("row %d (%s): share %d‰, per-company bound %q: every store needs a name of its own, a share and a bound", i, s.Name, s.Permille, s.PerCompany)
		}
		names[s.Name] = true
		sum += s.Permille
	}
	if sum > events.StoreSharedPermille {
		t.Errorf("the shares add up to %d‰, more than %d‰", sum, events.StoreSharedPermille)
	}
	t.Logf("the %d stores take %d‰ of the store", len(events.Stores()), sum)
	// The shipped store's limits (docs/security.md, Budgets lists them).
	for _, tc := range []struct {
		store events.Store
		want  int64
	}{
		{events.StoreRuns, 5153960400},
		{events.StoreLeaseRecords, 687194720},
		{events.StoreExecs, 68719472},
		{events.StoreBudgets, 68719472},
		{events.StoreOwnership, 17179868},
	} {
		if got := events.StoreLimit(0, tc.store); got != tc.want {
			t.Errorf("store %d: limit %d in the default store, want %d", tc.store, got, tc.want)
		}
	}
}

// TestCompanyBudgetsFitTheRunStream: for any store, retention and window, the companies the
// store is sized for, each writing its company budget per window from both sources (recorded
// execs and logs) through every window one retention spans, fit the budgeted part of the run
// stream: no company's history is evicted before the retention ends. Before, each company could
// write 1 GiB a day per source into a 4.8 GiB stream kept 14 days: one company turned it over in
// 2.4 days.
func TestCompanyBudgetsFitTheRunStream(t *testing.T) {
	for _, store := range []int64{events.MinStoreBytes, 1 << 30, events.DefaultStoreBytes, 100 << 30} {
		for _, companies := range []int{1, events.DefaultStoreCompanies, 50} {
			for _, retention := range []time.Duration{time.Hour, 7 * 24 * time.Hour, events.DefaultRunMaxAge, 90 * 24 * time.Hour} {
				for _, window := range []time.Duration{time.Hour, events.DefaultBudgetWindow, 36 * time.Hour} {
					o := events.Options{StoreBytes: store, Companies: companies, RunMaxAge: retention}
					budget := o.CompanyBudget(window)
					windows := int64((retention+window-1)/window) + 1
					written := budget * int64(companies) * 2 * windows
					if limit := events.StoreLimit(store, events.StoreRuns); written > limit*8/10 || budget <= 0 {
						t.Errorf("store %d, %d companies, retention %s, window %s: budget %d × %d companies × 2 sources × %d windows = %d, over 80%% of the run stream's %d",
							store, companies, retention, window, budget, companies, windows, written, limit)
					}
					if err := o.CheckCompanyBudget("--log-company-budget", budget, window); err != nil {
						t.Errorf("the derived budget is refused: %v", err)
					}
				}
			}
		}
	}
	// The shipped default: 8 GiB, 4 companies, 14 days, a day's window.
	o := events.Options{}
	if got, want := o.CompanyBudget(events.DefaultBudgetWindow), int64(34359733); got != want {
		t.Errorf("default company budget %d, want %d (about 33 MiB a day per source)", got, want)
	}
	// The old default (1 GiB a day) is refused, naming the setting and the bound.
	err := o.CheckCompanyBudget("--record-company-budget (KUBECLIP_RECORD_COMPANY_BUDGET)", 1<<30, events.DefaultBudgetWindow)
	if err == nil || !strings.Contains(err.Error(), "--record-company-budget") || !strings.Contains(err.Error(), fmt.Sprint(o.CompanyBudget(events.DefaultBudgetWindow))) {
		t.Errorf("a 1 GiB daily budget: %v, want a refusal naming the setting and the most that fits", err)
	}
}

// TestLeaseRecordQuotaIsSizedFromTheStore pins the lease-record quota: the lease records' share
// divided among the companies, every day of a record's life and a run's record at its largest.
func TestLeaseRecordQuotaIsSizedFromTheStore(t *testing.T) {
	for _, tc := range []struct {
		opts events.Options
		want int64
	}{
		{events.Options{}, 1864},
		{events.Options{Companies: 1}, 7456},
		{events.Options{StoreBytes: 64 << 30}, 14913},
		{events.Options{StoreBytes: events.MinStoreBytes}, 3},
	} {
		if got := tc.opts.LeaseRecordQuota(); got != tc.want {
			t.Errorf("%+v: quota %d, want %d", tc.opts, got, tc.want)
		}
		if err := tc.opts.CheckLeaseRecordQuota("--lease-record-quota", tc.want); err != nil {
			t.Errorf("%+v: the derived quota is refused: %v", tc.opts, err)
		}
		err := tc.opts.CheckLeaseRecordQuota("--lease-record-quota (KUBECLIP_LEASE_RECORD_QUOTA)", tc.want+1)
		if err == nil || !strings.Contains(err.Error(), "--lease-record-quota (KUBECLIP_LEASE_RECORD_QUOTA) is") || !strings.Contains(err.Error(), fmt.Sprintf("only at %d or less", tc.want)) {
			t.Errorf("%+v: one record a day more: %v, want a refusal naming the setting and the most that fits", tc.opts, err)
		}
	}
}

// TestOptionsRefuseAStoreTooSmall: below MinStoreBytes a bucket's share could not hold its
// largest value; a store sized for no company has no budgets, and one too small for its
// companies leaves them no lease record.
func TestOptionsRefuseAStoreTooSmall(t *testing.T) {
	for _, o := range []events.Options{{StoreBytes: events.MinStoreBytes - 1}, {Companies: -1}, {StoreBytes: events.MinStoreBytes, Companies: 50}} {
		if err := o.Validate(); err == nil {
			t.Errorf("%+v: valid, want an error", o)
		}
	}
	if err := (events.Options{StoreBytes: events.MinStoreBytes}).Validate(); err != nil {
		t.Errorf("the smallest store: %v", err)
	}
}
