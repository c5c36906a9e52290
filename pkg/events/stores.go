package events

import (
	"fmt"
	"time"
)

// Store is one stream or KV bucket kubeclip keeps in the JetStream store. Every one has a byte
// limit, its share of the operator's store (Options.StoreBytes, the workers' --store-bytes):
// StoreLimit is the one place that turns a share into bytes, and Stores lists them all.
type Store int

// The stores. The lease-request and run streams are named after the subject prefix
// (Subjects.LeaseStream, Subjects.RunStream); every other name is fixed.
const (
	StoreRuns          Store = iota // PAPERCLIP_RUNS: run events, logs and recorded execs
	StoreLeaseRequests              // PAPERCLIP_LEASES: acquire, release and destroy requests
	StoreWork                       // KUBECLIP_WORK: dispatches (tenant-worker → dispatcher)
	StoreRetry                      // KUBECLIP_RETRY: requests waiting for a retry
	StoreParked                     // KUBECLIP_PARKED: dispatches waiting for their agent
	StoreLeaseRecords               // KV KUBECLIP_LEASES: one record per run
	StoreTenants                    // KV KUBECLIP_TENANTS: one record per tenant namespace
	StoreExecs                      // KV KUBECLIP_EXECS: one entry per recorded exec
	StoreBudgets                    // KV KUBECLIP_BUDGETS: byte counters per run and company
	StoreAgents                     // KV KUBECLIP_AGENTS: one guard per busy agent
	StoreWarm                       // KV KUBECLIP_WARM: one record per warm pool
	StoreOwnership                  // KV KUBECLIP_WATCH: one key per run being watched
	StoreGrants                     // KV KUBECLIP_GRANTS: the credential broker's grants
	storeCount
)

// StoreShare is one row of the table: a store, its name on the server (the streams' names
// with the default prefix; a bucket's stream is "KV_" + its name), its share of the store in
// thousandths, and what bounds one company in it (docs/security.md, Budgets).
type StoreShare struct {
	Store      Store
	Name       string
	Bucket     bool
	Permille   int64
	PerCompany string
}

// Stores is the table of every stream and bucket, in Store order. The shares add up to 836
// thousandths, at most StoreSharedPermille: the rest of the store is headroom (the file store's own records and
// compaction, a bucket's delete markers), so every stream and bucket reaches its own limit
// before the server's max_file_store, and a full one never makes the server refuse another's
// writes.
func Stores() []StoreShare {
	return []StoreShare{
		// Run events are what companies write (logs, recorded execs): the bulk. Full, the
		// oldest go (DiscardOld); what one company writes is bounded by its daily budgets,
		// sized so the companies the store is sized for fit the whole retention
		// (CompanyBudget).
		{StoreRuns, "PAPERCLIP_RUNS", false, 600, "recorded output and logs: CompanyBudget per source and window"},
		// Requests of a few KiB each, consumed within seconds.
		{StoreLeaseRequests, "PAPERCLIP_LEASES", false, 30, "one request per acquire, release or destroy; acquires bounded by LeaseRecordQuota"},
		{StoreWork, WorkStream, false, 30, "one dispatch per accepted acquire, deleted when handled"},
		{StoreRetry, RetryStream, false, 30, "one copy per retried request, deleted when handled"},
		{StoreParked, "KUBECLIP_PARKED", false, 30, "one dispatch per agent waiting for its previous run"},
		// One record per run for RecordTTL, a few revisions of a few hundred bytes each: the
		// per-company quota (LeaseRecordQuota) is sized from this share.
		{StoreLeaseRecords, "KUBECLIP_LEASES", true, 80, "LeaseRecordQuota records a day; a failed acquire's record expires after a day"},
		{StoreTenants, "KUBECLIP_TENANTS", true, 2, "the operator's tenants-per-company cap, one small record each"},
		// About 300 bytes per recorded exec: some 200,000 execs at 8 GiB.
		{StoreExecs, "KUBECLIP_EXECS", true, 8, "one entry per recorded exec"},
		// About 150 bytes per counter: two per run (exec and log) and a few per company.
		{StoreBudgets, BudgetBucket, true, 8, "two counters per run, one per source and window, one for lease records"},
		{StoreAgents, "KUBECLIP_AGENTS", true, 2, "one guard per agent with a run in flight"},
		// Pool records hold a provider config (up to 64 KiB).
		{StoreWarm, "KUBECLIP_WARM", true, 4, "one record per warm pool shape"},
		{StoreOwnership, "KUBECLIP_WATCH", true, 2, "one key per run in flight"},
		// One grant per brokered key per lease, about 600 bytes (12 KiB at its largest, which
		// the broker's per-company quota is sized from): 10 ‰ holds some 1,700 grants of the
		// largest size per company at the default store and companies.
		{StoreGrants, "KUBECLIP_GRANTS", true, 10, "the credential broker's grants-per-company quota, one grant per brokered key per lease"},
	}
}

// StreamNames are the names of every store's stream on the server, for the prefix of s: the
// lease-request and run streams are named after it, a bucket's stream is "KV_" + its name.
func (s Subjects) StreamNames() []string {
	var names []string
	for _, st := range Stores() {
		switch {
		case st.Store == StoreRuns:
			names = append(names, s.RunStream())
		case st.Store == StoreLeaseRequests:
			names = append(names, s.LeaseStream())
		case st.Bucket:
			names = append(names, "KV_"+st.Name)
		default:
			names = append(names, st.Name)
		}
	}
	return names
}

// StoreSharedPermille is the most the shares may add up to, in thousandths of the store: 15 %
// stays free as headroom (TestStoreSharesLeaveHeadroom).
const StoreSharedPermille = 850

// MinStoreBytes is the smallest store Options.Validate accepts: at it every bucket's share
// still holds its largest value (64 KiB, a warm pool record, in KUBECLIP_WARM's 4 ‰).
const MinStoreBytes = 16 << 20

// StoreLimit is store s's byte limit in a JetStream store of storeBytes (0: DefaultStoreBytes).
func StoreLimit(storeBytes int64, s Store) int64 {
	if storeBytes <= 0 {
		storeBytes = DefaultStoreBytes
	}
	if s < 0 || s >= storeCount {
		panic(fmt.Sprintf("events: no store %d", s)) // a programming error: the table lists every Store
	}
	return storeBytes / 1000 * Stores()[s].Permille
}

// The per-company bounds of what a company writes, sized so the companies the store is sized
// for all fit their shares for the whole retention (docs/security.md, Budgets).
const (
	// DefaultStoreCompanies is how many companies the store is sized for (the workers'
	// --store-companies): each may write its full budgets every day of the retention without
	// evicting another's history.
	DefaultStoreCompanies = 4
	// budgetSources is how many writers are budgeted per company: recorded execs (exec-worker,
	// source "exec") and container logs (run-watcher, source "log").
	budgetSources = 2
	// budgetedPermille is the part of the run stream the budgeted writers may fill; the rest is
	// for what no budget counts (created, status, result, released and failed events, a few
	// KiB per run, and each recording's stop and exit events).
	budgetedPermille = 800
	// leaseRecordRunBytes is what one run's lease record costs KUBECLIP_LEASES at most: its
	// five revisions (requested, dispatching, created, releasing, released) with ids of
	// MaxTokenLen bytes, subject, headers and the store's record took 5,286 bytes
	// (pkg/lease.TestLeaseRecordQuotaFitsItsShare); 6 KiB leaves margin.
	leaseRecordRunBytes = 6 << 10
)

// windowsIn is how many budget windows one retention touches: the whole ones, and one more for
// a window that began before the oldest event kept.
func windowsIn(retention, window time.Duration) int64 {
	return int64((retention+window-1)/window) + 1
}

// CompanyBudget is what one company may write per window and source (recorded output, logs)
// into the run stream: the budgeted part of the run stream's share, divided among the
// companies the store is sized for, both sources, and every window one retention spans. So
// companies × sources × windows × CompanyBudget ≤ the run stream's limit: as long as no more
// companies than that write at their budgets, no event is evicted before the retention ends.
func (o Options) CompanyBudget(window time.Duration) int64 {
	o = o.withDefaults()
	if window <= 0 {
		window = DefaultBudgetWindow
	}
	budgeted := StoreLimit(o.StoreBytes, StoreRuns) / 1000 * budgetedPermille
	return budgeted / (int64(o.Companies) * budgetSources * windowsIn(o.RunMaxAge, window))
}

// LeaseRecordQuota is how many lease records one company may create per LeaseRecordWindow: the
// lease records' share divided among the companies the store is sized for, every window a
// record's life (RecordTTL, the run retention) spans, and a run's record at its largest.
func (o Options) LeaseRecordQuota() int64 {
	o = o.withDefaults()
	perCompany := StoreLimit(o.StoreBytes, StoreLeaseRecords) / int64(o.Companies)
	return perCompany / (windowsIn(o.RunMaxAge, LeaseRecordWindow) * leaseRecordRunBytes)
}

// CheckLeaseRecordQuota reports an error naming setting when perDay records a day, for every
// company the store is sized for, do not fit the lease records' share for a record's life.
func (o Options) CheckLeaseRecordQuota(setting string, perDay int64) error {
	if fit := o.LeaseRecordQuota(); perDay > fit || perDay <= 0 {
		o = o.withDefaults()
		return fmt.Errorf("%s is %d lease records a day, but %d companies × %d days of records of up to %d bytes fit the lease records' %d bytes only at %d or less: lower it, or raise the store bytes or lower the companies the store is sized for",
			setting, perDay, o.Companies, windowsIn(o.RunMaxAge, LeaseRecordWindow), leaseRecordRunBytes, StoreLimit(o.StoreBytes, StoreLeaseRecords), fit)
	}
	return nil
}

// LeaseRecordWindow is the window of LeaseRecordQuota.
const LeaseRecordWindow = 24 * time.Hour

// CheckCompanyBudget reports an error naming setting when bytes per window, for every company
// the store is sized for, does not fit the run stream for the retention.
func (o Options) CheckCompanyBudget(setting string, bytes int64, window time.Duration) error {
	if fit := o.CompanyBudget(window); bytes > fit || bytes <= 0 {
		o = o.withDefaults()
		return fmt.Errorf("%s is %d bytes per %s, but %d companies × %d sources × %d windows of %s retention fit the run stream's %d bytes only at %d or less: lower it, or raise the store bytes or lower the companies the store is sized for",
			setting, bytes, window, o.Companies, budgetSources, windowsIn(o.RunMaxAge, window), o.RunMaxAge, StoreLimit(o.StoreBytes, StoreRuns), fit)
	}
	return nil
}
