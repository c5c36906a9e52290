package brokersvc

import (
	"cmp"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// errLedgerFull is Begin's answer for a call of a run the ledger has no room for.
var errLedgerFull = errors.New("the broker holds the usage of as many runs as it may")

// ledger is the usage the broker metered and has not yet seen stored, per run: the coalescer
// between calls, which may come thousands a second, and the run stream, which gets at most one
// usage event per run per flush. It is pure (no I/O): Usage feeds it calls, takes the events
// due from it and tells it which were stored.
//
// A run's count is either open (calls end into it) or, once due closes it, pending: one event
// with the next seq, published again and again, identical, until it is acknowledged. Calls that
// end meanwhile go into the next open count. So an event is never changed after its message id
// is chosen, and the sum of a run's stored events is the sum of its calls, exactly.
type ledger struct {
	maxRuns int
	// idleFlushes is how many flushes a run's count is kept with nothing in it: a run calling
	// again soon keeps its meter (one meter, seqs without gaps, for a steady run) and an idle
	// one gives its room back.
	idleFlushes int
	newMeter    func() string
	now         func() time.Time

	mu   sync.Mutex
	runs map[events.RunRef]*runCount
}

// usageRow keys a run's rows: one per key, bound host and format.
type usageRow struct{ key, host, format string }

// callUsage is one ended call: what its response stated, and why it was not metered in full
// ("" when it was).
type callUsage struct {
	input, output, cacheRead, cacheWrite int64
	outcome                              string
}

type runCount struct {
	meter   string
	seq     uint64 // the last closed event's
	open    map[usageRow]*events.ModelUsage
	pending *events.RunUsageEvent
	calls   int  // begun and not ended: the count may not go
	release bool // a grant of the run was released: close it at once
	idle    int  // flushes in a row that found nothing
}

func (r *runCount) empty() bool { return r.calls == 0 && r.pending == nil && len(r.open) == 0 }

func newLedger(maxRuns, idleFlushes int, newMeter func() string, now func() time.Time) *ledger {
	return &ledger{maxRuns: maxRuns, idleFlushes: idleFlushes, newMeter: newMeter, now: now, runs: map[events.RunRef]*runCount{}}
}

// begin holds the run's count for a call until end: errLedgerFull when the ledger holds
// maxRuns runs, none of them empty.
func (l *ledger) begin(ref events.RunRef) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.runs[ref]
	if !ok {
		if len(l.runs) >= l.maxRuns && !l.evictOne() {
			return errLedgerFull
		}
		r = &runCount{meter: l.newMeter()}
		l.runs[ref] = r
	}
	r.calls++
	r.idle = 0
	return nil
}

// evictOne forgets one empty run (l.mu held). It is a scan, run only when the ledger is full.
func (l *ledger) evictOne() bool {
	for ref, r := range l.runs {
		if r.empty() {
			delete(l.runs, ref)
			return true
		}
	}
	return false
}

// end adds an ended call begun with begin.
func (l *ledger) end(ref events.RunRef, row usageRow, u callUsage) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.runs[ref]
	if !ok { // unreachable: begin held it
		r = &runCount{meter: l.newMeter(), calls: 1}
		l.runs[ref] = r
	}
	r.calls--
	if r.open == nil {
		r.open = map[usageRow]*events.ModelUsage{}
	}
	m := r.open[row]
	if m == nil {
		m = &events.ModelUsage{Key: row.key, Host: row.host, Format: row.format}
		r.open[row] = m
	}
	m.Calls++
	m.InputTokens += u.input
	m.OutputTokens += u.output
	m.CacheReadTokens += u.cacheRead
	m.CacheWriteTokens += u.cacheWrite
	if u.outcome != "" {
		if m.Unmetered == nil {
			m.Unmetered = map[string]int64{}
		}
		m.Unmetered[u.outcome]++
	}
}

// released marks the run to be closed by the next due(true): its grant ended. It reports
// whether the ledger holds the run.
func (l *ledger) released(ref events.RunRef) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.runs[ref]
	if ok {
		r.release = true
	}
	return ok
}

// due closes the open counts and returns every event to publish: the pending ones, old and
// new. releasedOnly takes only the runs marked released (a release's flush, between two
// ticks); a tick takes every run, and forgets those empty for idleFlushes ticks.
func (l *ledger) due(releasedOnly bool) []events.RunUsageEvent {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []events.RunUsageEvent
	for ref, r := range l.runs {
		if releasedOnly && !r.release {
			continue
		}
		r.release = false
		if r.pending == nil && len(r.open) > 0 {
			r.seq++
			rows := make([]events.ModelUsage, 0, len(r.open))
			for _, m := range r.open {
				rows = append(rows, *m)
			}
			slices.SortFunc(rows, func(a, b events.ModelUsage) int {
				return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(a.Host, b.Host), cmp.Compare(a.Format, b.Format))
			})
			r.pending = &events.RunUsageEvent{RunID: ref.RunID, CompanyID: ref.CompanyID, At: l.now().UTC(), Meter: r.meter, Seq: r.seq, Usage: rows}
			r.open = nil
		}
		if r.pending != nil {
			ev := *r.pending
			ev.Usage = slices.Clone(ev.Usage)
			for i := range ev.Usage {
				ev.Usage[i].Unmetered = maps.Clone(ev.Usage[i].Unmetered)
			}
			out = append(out, ev)
			r.idle = 0
			continue
		}
		if !releasedOnly && r.empty() {
			if r.idle++; r.idle > l.idleFlushes {
				delete(l.runs, ref)
			}
		}
	}
	slices.SortFunc(out, func(a, b events.RunUsageEvent) int {
		return cmp.Or(cmp.Compare(a.CompanyID, b.CompanyID), cmp.Compare(a.RunID, b.RunID))
	})
	return out
}

// stored drops the run's pending event of seq: the stream acknowledged it.
func (l *ledger) stored(ref events.RunRef, seq uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if r, ok := l.runs[ref]; ok && r.pending != nil && r.pending.Seq == seq {
		r.pending = nil
	}
}

// unpublished is whether any count is open or pending (shutdown waits for none).
func (l *ledger) unpublished() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.runs {
		if r.pending != nil || len(r.open) > 0 {
			return true
		}
	}
	return false
}

// len is how many runs the ledger holds.
func (l *ledger) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.runs)
}
