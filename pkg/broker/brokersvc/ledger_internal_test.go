package brokersvc

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
)

func testLedger(maxRuns, idle int) *ledger {
	n := 0
	at := time.Date(2026, 8, 24, 10, 0, 0, 0, time.UTC)
	return newLedger(maxRuns, idle, func() string { n++; return fmt.Sprintf("m%d", n) }, func() time.Time { return at })
}

var (
	runA   = events.Ref("company-a", "run-1")
	runB   = events.Ref("company-a", "run-2")
	runC   = events.Ref("company-b", "run-1")
	rowAnt = usageRow{key: "ANTHROPIC_API_KEY", host: "api.anthropic.com", format: events.UsageFormatAnthropicMessages}
	rowOAI = usageRow{key: "OPENAI_API_KEY", host: "api.openai.com", format: events.UsageFormatOpenAIResponses}
)

func call(t *testing.T, l *ledger, ref events.RunRef, row usageRow, u callUsage) {
	t.Helper()
	if err := l.begin(ref); err != nil {
		t.Fatal(err)
	}
	l.end(ref, row, u)
}

// sum adds the rows of evs by key, host and format, as a consumer of the stream would.
func sum(evs []events.RunUsageEvent) map[usageRow]events.ModelUsage {
	out := map[usageRow]events.ModelUsage{}
	for _, ev := range evs {
		for _, u := range ev.Usage {
			k := usageRow{u.Key, u.Host, u.Format}
			s := out[k]
			s.Key, s.Host, s.Format = u.Key, u.Host, u.Format
			s.Calls += u.Calls
			s.InputTokens += u.InputTokens
			s.OutputTokens += u.OutputTokens
			s.CacheReadTokens += u.CacheReadTokens
			s.CacheWriteTokens += u.CacheWriteTokens
			for o, n := range u.Unmetered {
				if s.Unmetered == nil {
					s.Unmetered = map[string]int64{}
				}
				s.Unmetered[o] += n
			}
			out[k] = s
		}
	}
	return out
}

// TestLedgerCoalescesARunsCalls: a thousand calls between two flushes are one event whose rows
// (one per key, host and format, sorted) add up to the calls exactly, unmetered ones counted
// by outcome with the tokens they stated.
func TestLedgerCoalescesARunsCalls(t *testing.T) {
	l := testLedger(10, 60)
	for i := range 1000 {
		call(t, l, runA, rowAnt, callUsage{input: int64(i), output: 2, cacheRead: 3, cacheWrite: 1})
	}
	call(t, l, runA, rowOAI, callUsage{input: 5, outcome: "truncated"})
	call(t, l, runA, rowOAI, callUsage{outcome: OutcomeFailed})
	evs := l.due(false)
	want := []events.RunUsageEvent{{
		RunID: "run-1", CompanyID: "company-a", At: time.Date(2026, 8, 24, 10, 0, 0, 0, time.UTC), Meter: "m1", Seq: 1,
		Usage: []events.ModelUsage{
			{Key: "ANTHROPIC_API_KEY", Host: "api.anthropic.com", Format: "anthropic_messages", Calls: 1000, InputTokens: 999 * 1000 / 2, OutputTokens: 2000, CacheReadTokens: 3000, CacheWriteTokens: 1000},
			{Key: "OPENAI_API_KEY", Host: "api.openai.com", Format: "openai_responses", Calls: 2, InputTokens: 5, Unmetered: map[string]int64{"truncated": 1, "failed": 1}},
		},
	}}
	if diff := cmp.Diff(want, evs); diff != "" {
		t.Errorf("due (-want +got):\n%s", diff)
	}
}

// TestLedgerRepublishesAPendingEventUnchanged: until the stream acknowledges an event, every
// flush returns it again, identical (same meter, seq and counts, so the same message id
// stores it once), and calls that end meanwhile wait for the next seq; the sum of the events
// stored is the sum of the calls, exactly.
func TestLedgerRepublishesAPendingEventUnchanged(t *testing.T) {
	l := testLedger(10, 60)
	var total int64
	var stored []events.RunUsageEvent
	add := func(n int64) {
		call(t, l, runA, rowAnt, callUsage{input: n, output: n * 2})
		total += n
	}
	add(10)
	first := l.due(false)
	add(7) // ends while the first event is unacknowledged
	again := l.due(false)
	if diff := cmp.Diff(first, again); diff != "" {
		t.Fatalf("the pending event changed before its ack (-first +again):\n%s", diff)
	}
	l.stored(runA, 1)
	stored = append(stored, first...)
	add(5)
	second := l.due(false)
	if len(second) != 1 || second[0].Seq != 2 || second[0].Meter != "m1" || second[0].Usage[0].InputTokens != 12 {
		t.Fatalf("after the ack: %+v, want seq 2 of meter m1 with the 12 input tokens that ended since", second)
	}
	l.stored(runA, 1) // a late ack of the old seq changes nothing
	if again := l.due(false); len(again) != 1 || again[0].Seq != 2 {
		t.Fatalf("a stale ack dropped the pending event: %+v", again)
	}
	l.stored(runA, 2)
	stored = append(stored, second...)
	if got := l.due(false); len(got) != 0 {
		t.Errorf("nothing ended since, yet due gave %+v", got)
	}
	s := sum(stored)[rowAnt]
	if s.InputTokens != total || s.OutputTokens != 2*total || s.Calls != 3 {
		t.Errorf("the stored events add up to %+v, want %d input, %d output in 3 calls", s, total, 2*total)
	}
}

// TestLedgerReleaseFlushesOnlyThatRun: a release closes the released run's count at once; the
// other runs wait for the tick.
func TestLedgerReleaseFlushesOnlyThatRun(t *testing.T) {
	l := testLedger(10, 60)
	call(t, l, runA, rowAnt, callUsage{input: 1})
	call(t, l, runB, rowAnt, callUsage{input: 2})
	if l.released(runC) {
		t.Error("released reports a run the ledger does not hold")
	}
	if !l.released(runA) {
		t.Fatal("released does not find a run the ledger holds")
	}
	evs := l.due(true)
	if len(evs) != 1 || evs[0].RunID != "run-1" || evs[0].CompanyID != "company-a" {
		t.Fatalf("a release's flush gave %+v, want run-1's event only", evs)
	}
	if evs := l.due(true); len(evs) != 0 {
		t.Errorf("a second release flush with no release gave %+v", evs)
	}
	if evs := l.due(false); len(evs) != 2 {
		t.Errorf("the tick gave %d events, want both runs' (run-1's still pending)", len(evs))
	}
}

// TestLedgerBoundsItsRuns: past maxRuns, a new run is refused while every held run has a call
// in flight or usage not stored; a run whose usage was stored gives its room to the next, and
// an idle run is forgotten after idleFlushes ticks.
func TestLedgerBoundsItsRuns(t *testing.T) {
	l := testLedger(2, 3)
	if err := l.begin(runA); err != nil {
		t.Fatal(err)
	}
	call(t, l, runB, rowAnt, callUsage{input: 1})
	if err := l.begin(runC); !errors.Is(err, errLedgerFull) {
		t.Fatalf("a third run: %v, want errLedgerFull", err)
	}
	l.end(runA, rowAnt, callUsage{input: 1})
	for _, ev := range l.due(false) {
		if ev.RunID == "run-2" {
			l.stored(runB, ev.Seq)
		}
	}
	if err := l.begin(runC); err != nil { // run-2 is empty now: evicted for run-1 of company-b
		t.Fatalf("a third run once one was empty: %v", err)
	}
	l.end(runC, rowAnt, callUsage{})
	if err := l.begin(runB); !errors.Is(err, errLedgerFull) {
		t.Fatalf("run-2 again, with run-1's and company-b's usage unstored: %v, want errLedgerFull", err)
	}
	for _, ev := range l.due(false) {
		l.stored(events.Ref(ev.CompanyID, ev.RunID), ev.Seq)
	}
	for range 3 {
		l.due(false)
	}
	if n := l.len(); n != 2 {
		t.Fatalf("after 3 idle ticks the ledger holds %d runs, want 2 (kept for idleFlushes)", n)
	}
	l.due(false)
	if n := l.len(); n != 0 {
		t.Errorf("after 4 idle ticks the ledger holds %d runs, want 0", n)
	}
	if l.unpublished() {
		t.Error("an empty ledger has usage unpublished")
	}
}

// TestLedgerEventsArePublishable: what the ledger makes passes the contract's checks.
func TestLedgerEventsArePublishable(t *testing.T) {
	l := testLedger(10, 60)
	call(t, l, runA, rowAnt, callUsage{input: 1, outcome: "no_usage"})
	call(t, l, runA, usageRow{key: "ANTHROPIC_API_KEY", host: "api.anthropic.com", format: events.UsageFormatNone}, callUsage{outcome: "path"})
	p, err := events.NewPublisher(events.PublisherOptions{JS: noJS{}})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range l.due(false) {
		msg, err := p.Msg(ev)
		if err != nil {
			t.Fatalf("the ledger's event does not pass the contract: %v", err)
		}
		if got, want := msg.Header.Get("ce-id"), "company-a.run-1.usage.m1.1"; got != want {
			t.Errorf("ce-id %q, want %q", got, want)
		}
	}
}

type noJS struct{}

func (noJS) PublishMsg(context.Context, *nats.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return nil, errors.New("not for publishing")
}
