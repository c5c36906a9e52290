package runwatch

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/cas"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// ownership is a replica that owns n runs in a fresh ownership bucket with ttl. Claiming
// 10,000 runs takes seconds under -race: a test that must not see keys expire while it claims
// gives a TTL of a minute.
type ownership struct {
	srv  *server.Server
	nc   *nats.Conn
	kv   jetstream.KeyValue
	o    *owners
	refs []events.RunRef
}

func ownedRuns(tb testing.TB, n int, ttl time.Duration, log zerolog.Logger) ownership {
	tb.Helper()
	srv, nc, js := natstest.Start(tb)
	kv, err := js.CreateOrUpdateKeyValue(tb.Context(), OwnershipBucketConfig(ttl, 1, 0))
	if err != nil {
		tb.Fatalf("creating the ownership bucket: %v", err)
	}
	o, err := newOwners(nc, kv, "replica-1", ttl, log)
	if err != nil {
		tb.Fatal(err)
	}
	refs := make([]events.RunRef, n)
	var g errgroup.Group
	g.SetLimit(64)
	for i := range refs {
		refs[i] = events.Ref(testCompany, fmt.Sprintf("run-%05d", i))
		g.Go(func() error {
			if ok, err := o.claim(tb.Context(), refs[i]); err != nil || !ok {
				return fmt.Errorf("claiming %s: %v, %w", refs[i].RunID, ok, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		tb.Fatal(err)
	}
	return ownership{srv: srv, nc: nc, kv: kv, o: o, refs: refs}
}

// stored is every key of the bucket with its holder and revision.
func (w ownership) stored(t *testing.T) map[string]string {
	t.Helper()
	lister, err := w.kv.ListKeys(t.Context())
	if err != nil {
		t.Fatalf("listing the ownership keys: %v", err)
	}
	out := map[string]string{}
	for key := range lister.Keys() {
		e, err := w.kv.Get(t.Context(), key)
		if err != nil {
			t.Fatalf("reading %s: %v", key, err)
		}
		out[key] = fmt.Sprintf("%s@%d", e.Value(), e.Revision())
	}
	return out
}

// owned is what the replica believes it holds, in stored's shape.
func (w ownership) owned() map[string]string {
	w.o.mu.Lock()
	defer w.o.mu.Unlock()
	out := map[string]string{}
	for ref, rev := range w.o.owned {
		out[ref.Key()] = fmt.Sprintf("%s@%d", w.o.id, rev)
	}
	return out
}

// TestRenewAllKeepsTenThousandRuns renews 10,000 runs pass after pass: each pass writes every
// key again (its revision moves), the replica records the revision stored, so the next pass's
// revision check passes, and nothing is lost.
func TestRenewAllKeepsTenThousandRuns(t *testing.T) {
	w := ownedRuns(t, 10_000, time.Minute, testLogger(t))
	before := w.stored(t)
	for pass := range 3 {
		if lost := w.o.renewAll(t.Context()); len(lost) > 0 {
			t.Fatalf("pass %d lost %d runs, first %s", pass, len(lost), lost[0].RunID)
		}
	}
	after := w.stored(t)
	if diff := cmp.Diff(w.owned(), after); diff != "" {
		t.Errorf("the replica's revisions differ from the bucket's (-owned +stored):\n%s", diff)
	}
	for key, was := range before {
		if after[key] == was {
			t.Errorf("%s was not renewed: still %s", key, was)
			break
		}
	}
}

// TestRenewAllLosesOnlyExpiredRuns: a run whose key expired is lost, whether another replica
// took it meanwhile (its key is left as it is) or nobody did; the others are renewed.
func TestRenewAllLosesOnlyExpiredRuns(t *testing.T) {
	w := ownedRuns(t, 50, time.Minute, testLogger(t))
	expired, taken := w.refs[3], w.refs[17]
	for _, ref := range []events.RunRef{expired, taken} {
		// What the server does to a key whose TTL ran out.
		if err := w.kv.Purge(t.Context(), ref.Key()); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := cas.Take(t.Context(), w.kv, taken.Key(), []byte("replica-2")); err != nil {
		t.Fatal(err)
	}
	takenBefore, err := w.kv.Get(t.Context(), taken.Key())
	if err != nil {
		t.Fatal(err)
	}

	lost := w.o.renewAll(t.Context())

	sortRefs := cmpopts.SortSlices(func(a, b events.RunRef) bool { return a.Key() < b.Key() })
	if diff := cmp.Diff([]events.RunRef{expired, taken}, lost, sortRefs); diff != "" {
		t.Errorf("lost runs (-want +got):\n%s", diff)
	}
	if w.o.owns(expired) || w.o.owns(taken) {
		t.Error("the replica still believes it owns a lost run")
	}
	takenAfter, err := w.kv.Get(t.Context(), taken.Key())
	if err != nil {
		t.Fatal(err)
	}
	if string(takenAfter.Value()) != "replica-2" || takenAfter.Revision() != takenBefore.Revision() {
		t.Errorf("the other replica's key is %s@%d, want replica-2@%d untouched", takenAfter.Value(), takenAfter.Revision(), takenBefore.Revision())
	}
	stored := w.stored(t)
	delete(stored, taken.Key())
	if diff := cmp.Diff(w.owned(), stored); diff != "" {
		t.Errorf("the replica's revisions differ from the bucket's (-owned +stored):\n%s", diff)
	}
}

// TestRenewAllStopsOnShutdown ends a pass over 10,000 runs midway: it returns without a line
// per run (issue 16's run-watcher logged "renewing run ownership failed: context canceled"
// thousands of times at SIGTERM), and what it renewed before it stopped is recorded, so the
// next pass loses nothing.
func TestRenewAllStopsOnShutdown(t *testing.T) {
	var logged syncBuffer
	w := ownedRuns(t, 10_000, time.Minute, zerolog.New(&logged))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	// The first renewal published: the pass is under way.
	sub, err := w.nc.Subscribe(ownershipSubjectPrefix+">", func(*nats.Msg) { cancel() })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()

	if lost := w.o.renewAll(ctx); len(lost) > 0 {
		t.Errorf("the stopped pass lost %d runs", len(lost))
	}
	if got := logged.String(); got != "" {
		t.Errorf("the stopped pass logged:\n%.500s", got)
	}
	if diff := cmp.Diff(w.owned(), w.stored(t)); diff != "" {
		t.Errorf("the replica's revisions differ from the bucket's (-owned +stored):\n%.2000s", diff)
	}
	if lost := w.o.renewAll(t.Context()); len(lost) > 0 {
		t.Errorf("the next pass lost %d runs, first %s", len(lost), lost[0].RunID)
	}
}

// TestRenewAllWithoutNATS: while NATS is away a pass stops at its first unanswered renewal and
// says so once, not once per run; the runs stay owned.
func TestRenewAllWithoutNATS(t *testing.T) {
	var logged syncBuffer
	w := ownedRuns(t, 2_000, time.Second, zerolog.New(&logged))
	w.srv.Shutdown()
	w.srv.WaitForShutdown()

	if lost := w.o.renewAll(t.Context()); len(lost) > 0 {
		t.Errorf("lost %d runs while NATS was away", len(lost))
	}
	if got := strings.Count(logged.String(), "renewing run ownership failed"); got != 1 {
		t.Errorf("logged %d failures, want 1:\n%.1000s", got, logged.String())
	}
	for _, ref := range w.refs {
		if !w.o.owns(ref) {
			t.Fatalf("%s is no longer owned", ref.RunID)
		}
	}
}

// syncBuffer is a log destination safe for the publisher's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// BenchmarkRenewAll times one renewal pass over 10,000 owned runs (ns/op is one pass) and
// counts the runs lost.
func BenchmarkRenewAll(b *testing.B) {
	w := ownedRuns(b, 10_000, DefaultOwnershipTTL, zerolog.Nop())
	lost := 0
	for b.Loop() {
		lost += len(w.o.renewAll(b.Context()))
	}
	b.ReportMetric(float64(lost), "lost")
}

// TestReleaseAll hands 10,000 runs over at shutdown: every key is deleted and nothing is
// logged; a release cut short by its deadline says so once.
func TestReleaseAll(t *testing.T) {
	var logged syncBuffer
	w := ownedRuns(t, 10_000, time.Minute, zerolog.New(&logged))
	w.o.releaseAll(t.Context())
	if got := w.stored(t); len(got) > 0 {
		t.Errorf("%d keys left after releaseAll", len(got))
	}
	if got := logged.String(); got != "" {
		t.Errorf("releaseAll logged:\n%.500s", got)
	}

	w = ownedRuns(t, 1_000, time.Minute, zerolog.New(&logged))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	w.o.releaseAll(ctx)
	if got := strings.Count(logged.String(), "releasing run ownership failed"); got != 1 {
		t.Errorf("logged %d failures, want 1:\n%.1000s", got, logged.String())
	}
	if w.o.owns(w.refs[0]) {
		t.Error("a run not released is still owned")
	}
}

// TestSettleIgnoresARunClaimedAgain: a run released and claimed again while a pass renewed it
// at its old revision is refused by the stream (the key moved on), and is still owned at its new
// revision, not lost.
func TestSettleIgnoresARunClaimedAgain(t *testing.T) {
	o := &owners{owned: map[events.RunRef]uint64{}}
	ref := events.Ref(testCompany, "run-again")
	o.owned[ref] = 12 // claimed again at 12 after the pass read 7
	refused := &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}
	if got := o.settle(ref, 7, nil, refused); got != renewKept {
		t.Errorf("settle = %v, want kept", got)
	}
	if rev, ok := o.owned[ref]; !ok || rev != 12 {
		t.Errorf("owned at %d (%v), want 12", rev, ok)
	}
	if got := o.settle(ref, 12, nil, refused); got != renewLost || o.owns(ref) {
		t.Errorf("settle at the revision held = %v, owned %v; want lost", got, o.owns(ref))
	}
}
