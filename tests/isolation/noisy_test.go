package isolation

import (
	"context"
	"errors"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// Company A's share of the noisy-neighbour test: requests that cost kubeclip's shared stores and
// queues something each, and no pod.
const (
	// noisyFailing acquires are refused at validation: each leaves a lease record and a failed
	// event, and passes through the tenant-worker's first-attempt queue.
	noisyFailing = 2000
	// noisyParked acquires wait for A's busy agent in the dispatcher's parked queue.
	noisyParked = 1000
	// noisyLines is what A's one real run prints: its logs go through the run-watcher's log
	// budget and the run stream next to B's.
	noisyLines = 20000
	// quietRuns is how many ordinary runs B makes alone, then again beside A.
	quietRuns = 5
)

// TestNoisyNeighbour is issue 26's acceptance test: company A fills what it can of what every
// company shares (failing acquires leaving lease records, a flood of new acquires waiting for
// their agent, a run printing as fast as it can), while company B runs ordinary leases through
// the real workers. B's runs all succeed with complete histories, and B's acquire → created
// stays within twice its figure alone; A's requests get clear errors naming what refused them.
// The stores' bytes are reported at the end.
func TestNoisyNeighbour(t *testing.T) {
	cs := clustertest.Clientset(t)
	noisy, quiet := pt.NewID("co"), pt.NewID("co")
	pt.CleanupTenant(t, cs, noisy)
	pt.CleanupTenant(t, cs, quiet)

	alone := quietLeases(t, quiet, nil)

	// A's real run, printing noisyLines as fast as the stub can.
	loud := env.Acquire(t, noisy, pt.NewID("agent"), pt.StubConfig(map[string]string{"STUB_LINES": strconv.Itoa(noisyLines)}))
	// A's busy agent, for the acquires that wait for it.
	agent := pt.NewID("agent")
	holder := env.Acquire(t, noisy, agent, sleeping())
	held := pt.WaitKind[events.RunCreatedEvent](holder, runTimeout)
	var parked, failing []*pt.Run
	t.Cleanup(func() {
		for _, r := range parked {
			r.Release("", true)
		}
		holder.Release(held.ProviderLeaseID, true)
	})
	// Before each of B's acquires A publishes its share of the flood, so each of B's first
	// attempts arrives behind a fresh backlog of A's: acquires waiting for A's busy agent, and
	// acquires whose config the tenant-worker refuses (each leaving a lease record).
	flood := func() {
		for range noisyParked / quietRuns {
			r := env.NewRun(t, noisy, agent)
			r.PublishAcquire(sleeping(), true)
			parked = append(parked, r)
		}
		for range noisyFailing / quietRuns {
			r := env.NewRun(t, noisy, pt.NewID("agent"))
			r.Collect()
			r.PublishAcquire(sleeping(withConfig("egressAllowCidrs", []string{"10.0.0.0/33"})), true)
			failing = append(failing, r)
		}
	}
	loaded := quietLeases(t, quiet, flood)
	t.Logf("company B's acquire → created alone: %v (median %s); each behind %d of company A's new acquires: %v (median %s)",
		alone, median(alone), (noisyParked+noisyFailing)/quietRuns, loaded, median(loaded))
	// The figures are the report; the bound catches first attempts queued behind another
	// company's backlog (a median of 600 ms behind 600 of A's, 29 ms alone, before issue 26),
	// with room for the noise of a shared 2-core machine at tens of milliseconds.
	if m, limit := median(loaded), max(2*median(alone), median(alone)+250*time.Millisecond); m > limit {
		t.Errorf("company B's acquire → created took %s (median) beside company A, %s alone; want at most %s", m, median(alone), limit)
	}

	// A's requests were refused clearly, once the flood drained: each failing acquire for its
	// config, naming the field, until A had created its lease-record quota for the day, and from
	// then on for the quota, naming it (--lease-record-quota: 1,864 a day at the defaults).
	refused := map[events.Code]int{}
	for i, r := range failing {
		f := waitFailed(t, r, events.LeaseAcquire)
		switch {
		case f.Code == events.CodeInvalidConfig && f.Field == "config.egressAllowCidrs[0]":
		case f.Code == events.CodeQuotaExceeded && strings.Contains(f.Message, "lease-record quota"):
		default:
			t.Fatalf("company A's failing acquire %d of %d: %+v; want invalid_config naming config.egressAllowCidrs[0], or quota_exceeded naming the lease-record quota", i+1, len(failing), f)
		}
		refused[f.Code]++
	}
	t.Logf("company A's %d failing acquires: %v", len(failing), refused)
	res := pt.WaitKind[events.RunResultEvent](loud, 5*time.Minute)
	t.Logf("company A's loud run: %s", res.Outcome)

	reportStores(t)
}

// quietLeases runs quietRuns ordinary leases of company one after another, each to its result,
// checks each run's whole history, and returns their acquire → created times. before, if not
// nil, runs just before each acquire.
func quietLeases(t *testing.T, company string, before func()) []time.Duration {
	t.Helper()
	const lines = 5
	var took []time.Duration
	for range quietRuns {
		if before != nil {
			before()
		}
		start := time.Now()
		r := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(map[string]string{"STUB_LINES": strconv.Itoa(lines)}))
		pt.WaitKind[events.RunCreatedEvent](r, runTimeout)
		took = append(took, time.Since(start))
		pt.WaitKind[events.RunResultEvent](r, runTimeout)
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		evs, err := pt.History(ctx, env, company, r.RunID)
		cancel()
		if err != nil {
			t.Fatalf("company %s run %s: %v", company, r.RunID, err)
		}
		if problems := pt.CheckHistory(evs, pt.Want{Lines: lines}); len(problems) > 0 {
			t.Errorf("company %s run %s's history:\n%s", company, r.RunID, strings.Join(problems, "\n"))
		}
	}
	return took
}

// reportStores logs every stream's (and so every bucket's) bytes and messages against its limit.
func reportStores(t *testing.T) {
	t.Helper()
	names := env.JS.StreamNames(t.Context())
	var all []string
	for n := range names.Name() {
		all = append(all, n)
	}
	if err := names.Err(); err != nil && !errors.Is(err, jetstream.ErrEndOfData) {
		t.Fatalf("listing streams: %v", err)
	}
	sort.Strings(all)
	t.Logf("%-28s %14s %10s %14s", "stream", "bytes", "messages", "max bytes")
	for _, n := range all {
		s, err := env.JS.Stream(t.Context(), n)
		if err != nil {
			t.Fatalf("stream %s: %v", n, err)
		}
		info := s.CachedInfo()
		t.Logf("%-28s %14d %10d %14d", n, info.State.Bytes, info.State.Msgs, info.Config.MaxBytes)
	}
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
