package isolation

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
)

// Company A's share of the noisy-neighbour test: requests that cost kubeclip's shared stores and
// queues something each.
const (
	// noisyFailing acquires are refused at validation: each leaves a lease record and a failed
	// event, and passes through the tenant-worker's first-attempt queue.
	noisyFailing = 2000
	// noisyParked acquires wait for A's busy agent in the dispatcher's parked queue.
	noisyParked = 1000
	// noisyLines is what A's loud run prints, noisyBurst lines a write every noisyInterval:
	// about 240 bytes each in the run stream (the line, its timestamp, the log event's share of
	// the envelope), some 48 MB in ten seconds, past the company's daily container-log budget
	// (companyBudget, 34,359,733 bytes) in about seven. The kubelet's log API serves only a
	// container's newest log file, so what it rotates away before the run-watcher reads it is
	// lost (docs/architecture.md, "A run's log and the kubelet"); the local cluster's
	// containerLogMaxSize (128Mi) holds this whole run. At the kubelet's default (10Mi) the run
	// lost its head when printed all at once (39 MB in 1.3 s: 4 runs of 40) and its tail when
	// paced like this beside A's flood and the tests/paperclip suite (129,229 of 200,000 lines
	// stored, no logStopped).
	noisyLines    = 200000
	noisyBurst    = 1000
	noisyInterval = 50 * time.Millisecond
	// quietRuns is how many ordinary runs B makes alone, then again beside A.
	quietRuns = 5

	// noisyExecs is the least number of recorded execs A runs in its pod lease,
	// noisyConcurrency at a time (the plugin's own bound on one company's executes); the flood
	// goes on until B's execs beside it are done.
	noisyExecs       = 5000
	noisyConcurrency = 32
	// loudExecBytes is what A's loud exec reads from /dev/zero and prints as base64: 40.5 MB of
	// output, past the company's daily recorded-output budget.
	loudExecBytes = 30_000_000
	// quietExecCount is how many short unrecorded exec round trips B makes alone, then beside
	// A's execs: the kind the plugin runs some 90 times a run (probes, uploads, bridge polls),
	// whose latency an agent waits on. quietRecorded is how many recorded ones (the agent's own
	// command, one a run) B makes in each phase, whose history is checked whole: enough for a
	// median that a few slow ones do not move.
	quietExecCount = 20
	quietRecorded  = 100
)

// TestNoisyNeighbour is issue 26's acceptance test: company A fills what it can of what every
// company shares, at the workers' default budgets, while company B runs ordinary leases and
// agent commands through the real workers:
//   - A's failing acquires leave lease records, its flood of new acquires waits for its agent,
//     and a run prints its logs past the company's daily log budget in seconds;
//   - A runs thousands of recorded execs, noisyConcurrency at a time, and one that prints past
//     the company's daily recorded-output budget in seconds.
//
// B's runs all succeed with complete histories (its leases' logs, its execs' recorded output),
// and B's acquire → created and short exec round trips stay within twice their figures alone
// (or a small floor above them, for this machine's noise); A's requests get clear errors naming
// what refused them, and its ended execs and runs leave no entry in KUBECLIP_EXECS and no run
// counter in KUBECLIP_BUDGETS. The stores' bytes and the two buckets' keys are reported at the
// end.
func TestNoisyNeighbour(t *testing.T) {
	began := time.Now()
	cs := clustertest.Clientset(t)
	noisy, quiet := pt.NewID("co"), pt.NewID("co")
	pt.CleanupTenant(t, cs, noisy)
	pt.CleanupTenant(t, cs, quiet)
	noisyClient, quietClient := newExecClient(t, noisy), newExecClient(t, quiet)

	// Both companies' pod leases, ready before anything is measured.
	var noisyPod, quietPod *podLease
	var wg sync.WaitGroup
	wg.Go(func() { noisyPod = acquirePod(t, noisy) })
	wg.Go(func() { quietPod = acquirePod(t, quiet) })
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	alone := quietLeases(t, quiet, nil)
	execsAlone, _ := quietExecs(t, quietClient, quietPod, "alone", quietExecCount, false)
	recordedAlone, printed := quietExecs(t, quietClient, quietPod, "alone-recorded", quietRecorded, true)

	// A's loud run, a day's container-log budget in seconds.
	loud := env.Acquire(t, noisy, pt.NewID("agent"), pt.StubConfig(map[string]string{
		"STUB_LINES": strconv.Itoa(noisyLines), "STUB_BURST": strconv.Itoa(noisyBurst), "STUB_INTERVAL": noisyInterval.String(),
	}))
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
			// Not followed one consumer each (Collect): the answers are read at the end through
			// one consumer, as Paperclip's plugin reads its answers (docs/architecture.md, Following thousands of leases). Creating
			// 400 consumers per round on the run stream stalled its writes for everybody,
			// company B's `created` among them (0.7-0.9 s a publish in the round after).
			r := env.NewRun(t, noisy, pt.NewID("agent"))
			r.PublishAcquire(sleeping(withConfig("egressAllowCidrs", []string{"10.0.0.0/33"})), true)
			failing = append(failing, r)
		}
	}
	// The figures are the report; the bound catches first attempts queued behind another
	// company's backlog (a median of 600 ms behind 600 of A's, 29 ms alone, before issue 26),
	// with room for the noise of a shared 2-core machine at tens of milliseconds. That noise
	// comes and goes with whatever else runs (`make test` runs two packages at once): a median
	// over the bound is measured again once, alone and beside, and fails only twice over. A
	// company served behind another's backlog is over it every time.
	acquireBound := func(alone []time.Duration) time.Duration {
		return max(2*median(alone), median(alone)+250*time.Millisecond)
	}
	loaded := quietLeases(t, quiet, flood)
	for attempt := 1; ; attempt++ {
		t.Logf("company B's acquire → created alone: %v (median %s); each behind %d of company A's new acquires: %v (median %s)",
			alone, median(alone), (noisyParked+noisyFailing)/quietRuns, loaded, median(loaded))
		if median(loaded) <= acquireBound(alone) {
			break
		}
		if attempt == 2 {
			t.Errorf("company B's acquire → created took %s (median) beside company A, %s alone; want at most %s (twice)", median(loaded), median(alone), acquireBound(alone))
			break
		}
		t.Logf("over the bound %s: measuring again", acquireBound(alone))
		alone, loaded = quietLeases(t, quiet, nil), quietLeases(t, quiet, flood)
	}

	// A's recorded execs: a flood noisyConcurrency at a time, and one loud exec past the
	// company's recorded-output budget, while B runs its execs beside them.
	companies := map[string]string{"A": noisy, "B": quiet}
	reportBuckets(t, "before", companies)
	floodCtx, stopFlood := context.WithTimeout(t.Context(), 5*time.Minute)
	defer stopFlood()
	execFlood := pt.FloodExecs(floodCtx, noisyClient, execclient.Exec{
		Lease: noisyPod.Lease, Command: "echo", Args: []string{"noise"}, Record: true, Timeout: time.Minute,
	}, noisyConcurrency)
	pt.Eventually(t, time.Minute, "company A's first execs to end", func() bool { return execFlood.Ended() >= 2*noisyConcurrency })
	loudDone := make(chan loudExec, 1)
	go func() { loudDone <- runLoudExec(t, noisyClient, noisyPod) }()
	endedBefore := execFlood.Ended()
	execsBeside, _ := quietExecs(t, quietClient, quietPod, "beside", quietExecCount, false)
	// As for acquires: a median over the bound is measured again once, A's flood still running.
	execBound := max(2*median(execsAlone), median(execsAlone)+execFloor)
	if median(execsBeside) > execBound {
		t.Logf("company B's exec round trip beside company A: %v (median %s), over the bound %s: measuring again", execsBeside, median(execsBeside), execBound)
		execsBeside, _ = quietExecs(t, quietClient, quietPod, "beside-again", quietExecCount, false)
	}
	probe := probeRunStream(t, quiet)
	recordedBeside, printedBeside := quietExecs(t, quietClient, quietPod, "beside-recorded", quietRecorded, true)
	probed := probe()
	maps.Copy(printed, printedBeside)
	// B's recorded execs, the agent's own command, are bounded as its short ones are.
	recordedBound := max(2*median(recordedAlone), median(recordedAlone)+execFloor)
	if median(recordedBeside) > recordedBound {
		t.Logf("company B's recorded exec round trip beside company A: %v (median %s), over the bound %s: measuring again", recordedBeside, median(recordedBeside), recordedBound)
		recordedBeside, printedBeside = quietExecs(t, quietClient, quietPod, "beside-recorded-again", quietRecorded, true)
		maps.Copy(printed, printedBeside)
	}
	endedBeside := execFlood.Ended() - endedBefore
	inProgress := len(bucketKeys(t, execsvc.RecordedBucket, noisy))
	t.Logf("company B's exec round trip alone: %v (median %s, p90 %s); beside company A's execs (%d of them ended meanwhile, %d at a time, and its loud exec): %v (median %s, p90 %s)",
		execsAlone, median(execsAlone), percentile(execsAlone, 0.9), endedBeside, noisyConcurrency, execsBeside, median(execsBeside), percentile(execsBeside, 0.9))
	t.Logf("company B's recorded exec round trip alone: %v (median %s, p90 %s); beside company A's execs: %v (median %s, p90 %s)",
		recordedAlone, median(recordedAlone), percentile(recordedAlone, 0.9), recordedBeside, median(recordedBeside), percentile(recordedBeside, 0.9))
	for _, p := range []struct {
		store string
		took  []time.Duration
	}{{env.Subjects.RunStream(), probed.run}, {execsvc.RecordedBucket, probed.execs}, {events.BudgetBucket, probed.budgets}, {"a stream of its own", probed.own}} {
		t.Logf("meanwhile a quiet client's publish to %s took median %s, p90 %s, max %s (n=%d)", p.store, median(p.took), percentile(p.took, 0.9), slices.Max(p.took), len(p.took))
	}
	// B's execs, short and recorded, stay within twice their figure alone, or execFloor above
	// it. A recorded one waits for four NATS round trips in a row from the exec-worker beyond an
	// unrecorded one's (pkg/execsvc TestRecordedExecRoundTrips counts them), and A's flood leaves
	// the 2-core machine no idle CPU, so every hop waits to be scheduled: the run stream itself
	// answers a quiet client as fast beside A as a stream of its own (the probe above), B's plain
	// execs slow too, and the recorded ones slow by the number of their hops, the more the busier
	// the machine (docs/security.md, "Recorded execs beside a flood"). So they need the floor
	// more than the short ones do: beside another suite, as make test runs this one, they took
	// several times their figure alone, yet far less than A's own round trip (logged below),
	// which a B exec served behind A's would take.
	if m := median(execsBeside); m > execBound {
		t.Errorf("company B's exec round trip took %s (median) beside company A, %s alone; want at most %s (twice that, or %s above it)", m, median(execsAlone), execBound, execFloor)
	}
	if m := median(recordedBeside); m > recordedBound {
		t.Errorf("company B's recorded exec round trip took %s (median) beside company A, %s alone; want at most %s (twice that, or %s above it)", m, median(recordedAlone), recordedBound, execFloor)
	}
	pt.Eventually(t, 3*time.Minute, fmt.Sprintf("%d of company A's execs to end", noisyExecs), func() bool { return execFlood.Ended() >= noisyExecs })
	tally := execFlood.Stop()
	loudGot := <-loudDone
	t.Logf("company A's exec flood: %d execs (%d at a time) in %s, a round trip of %s on average: %d exited 0, failed %v; its entries in %s while B ran beside it: %d",
		tally.Ended(), noisyConcurrency, tally.Took.Round(time.Millisecond), (tally.Took * noisyConcurrency / time.Duration(max(1, tally.Ended()))).Round(time.Millisecond),
		tally.Exited, tally.Failed, execsvc.RecordedBucket, inProgress)
	if len(tally.Failed) > 0 {
		t.Errorf("company A's execs failed: %v; want every one to exit 0 (a budget stops recording, not the command)", tally.Failed)
	}
	checkLoudExec(t, noisyPod, loudGot)
	checkRecorded(t, quietPod, printed)

	// A's ended execs left no entry: each is purged after its final event (pkg/execsvc recorded.go).
	// At the default --store-bytes (8 GiB) the bucket's share is 68,719,472 bytes, which no test
	// fills by count in its time: before issue 26 the old 64 MiB bucket refused every company's
	// starts after 294,337 ended execs of one company, about 300,000 at today's share. So the
	// claim here is that A's thousands of execs leave 0 entries; pkg/execsvc
	// TestFullStoresRefuseNoStart fills the bucket at its real size and shows a full one
	// refuses no start.
	pt.Eventually(t, 30*time.Second, "company A's ended execs to leave "+execsvc.RecordedBucket, func() bool {
		return len(bucketKeys(t, execsvc.RecordedBucket, noisy)) == 0
	})
	execCounter := counterValue(t, companyCounter(events.BudgetSourceExec, noisy))
	t.Logf("company A's recorded output charged today: %d bytes of its %d-byte budget", execCounter, companyBudget())
	if execCounter > companyBudget() {
		t.Errorf("company A's recorded-output counter %d is past its budget %d", execCounter, companyBudget())
	}

	// The ends of both pod leases drop their run counters (runwatch endRun).
	noisyPod.release(t)
	quietPod.release(t)

	// A's requests were refused clearly, once the flood drained: each failing acquire for its
	// config, naming the field, until A had created its lease-record quota for the day, and from
	// then on for the quota, naming it (--lease-record-quota: 1,864 a day at the defaults).
	refused := map[events.Code]int{}
	answers := acquireFailures(t, noisy, failing)
	for i, r := range failing {
		f, ok := answers[r.RunID]
		switch {
		case !ok:
			t.Fatalf("company A's failing acquire %d of %d (%s): no failed event", i+1, len(failing), r.RunID)
		case f.Code == events.CodeInvalidConfig && f.Field == "config.egressAllowCidrs[0]":
		case f.Code == events.CodeQuotaExceeded && strings.Contains(f.Message, "lease-record quota"):
		default:
			t.Fatalf("company A's failing acquire %d of %d: %+v; want invalid_config naming config.egressAllowCidrs[0], or quota_exceeded naming the lease-record quota", i+1, len(failing), f)
		}
		refused[f.Code]++
	}
	t.Logf("company A's %d failing acquires: %v", len(failing), refused)
	checkLoudRun(t, loud)

	// Every ended run of either company left no counter in KUBECLIP_BUDGETS (runwatch endRun).
	// A run with no result yet keeps its own: A's busy agent, or, once its lease's deadline
	// ended it (a slow machine), the next of A's acquires that waited for the agent.
	runs, err := env.JS.Stream(t.Context(), env.Subjects.RunStream())
	if err != nil {
		t.Fatal(err)
	}
	inFlight := func(key string) bool {
		parts := strings.Split(key, ".")
		ref := events.RunRef{CompanyID: parts[len(parts)-2], RunID: parts[len(parts)-1]}
		ended, err := events.ResultPublished(t.Context(), runs, env.Subjects, ref)
		if err != nil {
			t.Fatalf("reading %s's result: %v", key, err)
		}
		return !ended
	}
	for name, company := range companies {
		var left, running []string
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			left, running = nil, nil
			for _, k := range runCounters(bucketKeys(t, events.BudgetBucket, company)) {
				if inFlight(k) {
					running = append(running, k)
				} else {
					left = append(left, k)
				}
			}
			if len(left) == 0 || time.Now().After(deadline) {
				break
			}
		}
		t.Logf("company %s: runs in flight with their counters: %v", name, running)
		if len(left) > 0 {
			t.Errorf("company %s's ended runs left their counters in %s: %v", name, events.BudgetBucket, left)
		}
	}
	reportStores(t)
	reportBuckets(t, "after", companies)
	t.Logf("TestNoisyNeighbour took %s", time.Since(began).Round(time.Second))
}

// execFloor is the least slack B's exec round trip gets beside A when twice its figure alone is
// only a few milliseconds: the noise of this shared 2-core machine, where A's flood, the two
// exec-workers, the suite's JetStream server (in the test process, built with -race), both pods
// and whatever other suite `make test` runs at once take turns on the CPUs. B's median beside A
// measured 8 to 32 ms (3.5 to 5.6 ms alone) on a quiet machine, beside a busy loop and beside
// another session's tests. It stays below A's own round trip (136 to 238 ms on average, 32 in
// flight): a B exec that waited behind A's would take about that, and fail.
const execFloor = 100 * time.Millisecond

// checkLoudRun checks A's loud run: it succeeds, its log stops at the company's daily log budget
// with a logStopped event naming it, and what was stored before is the stub's lines from the
// first, in order, without a gap.
func checkLoudRun(t *testing.T, loud *pt.Run) {
	t.Helper()
	res := pt.WaitKind[events.RunResultEvent](loud, 5*time.Minute)
	var logs []events.RunLogEvent
	var stops []events.BudgetKind
	var created, stopped, ended time.Time
	for _, r := range loud.Events() {
		switch ev := r.Event.(type) {
		case events.RunCreatedEvent:
			created = r.Published
		case events.RunResultEvent:
			ended = r.Published
		case events.RunLogEvent:
			if ev.LogStopped != "" {
				stops = append(stops, ev.LogStopped)
				stopped = r.Published
			}
			logs = append(logs, ev)
		}
	}
	lines := pt.StubLines(logs)
	counter := counterValue(t, companyCounter(events.BudgetSourceLog, loud.CompanyID))
	t.Logf("company A's loud run: %s; %d of its %d lines stored in %d log events, then logStopped %v %s after created (result %s after); its container-log counter %d bytes of its %d-byte budget",
		res.Outcome, len(lines), noisyLines, len(logs), stops, stopped.Sub(created).Round(time.Millisecond), ended.Sub(created).Round(time.Millisecond), counter, companyBudget())
	switch {
	case res.Outcome != events.OutcomeSucceeded:
		t.Errorf("company A's loud run: %s (%s: %s), want succeeded (a log budget stops the log, not the run)", res.Outcome, res.Reason, res.Message)
	case len(stops) != 1 || stops[0] != events.BudgetCompany:
		t.Errorf("company A's loud run: log stopped by %v, want once by the company budget", stops)
	case logs[len(logs)-1].LogStopped == "":
		t.Errorf("company A's loud run: a log event after logStopped")
	case len(lines) >= noisyLines || !slices.Equal(lines, pt.WantStubLines(len(lines))):
		t.Errorf("company A's loud run: stored %d lines, want stub lines 1..n in order for some n < %d", len(lines), noisyLines)
	case counter > companyBudget():
		t.Errorf("company A's container-log counter %d is past its budget %d", counter, companyBudget())
	}
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

// acquireFailures reads the failed acquires of company's runs from the run stream through one
// consumer until it has one for each of runs (or runTimeout passed), by run id. Other runs' are
// skipped (A's waiting acquires past its lease-record quota fail too).
func acquireFailures(t *testing.T, company string, runs []*pt.Run) map[string]events.RunFailedEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), runTimeout)
	defer cancel()
	cons, err := env.JS.OrderedConsumer(ctx, env.Subjects.RunStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{env.Subjects.Prefix() + ".run." + company + ".*." + string(events.KindFailed)},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{}
	for _, r := range runs {
		want[r.RunID] = true
	}
	out := map[string]events.RunFailedEvent{}
	for len(out) < len(want) {
		m, err := cons.Next(jetstream.FetchContext(ctx))
		if err != nil {
			t.Fatalf("reading company %s's failed acquires (%d of %d): %v", company, len(out), len(want), err)
		}
		ev, err := env.Subjects.DecodeRunEvent(m.Subject(), m.Data())
		if err != nil {
			t.Fatalf("decoding %s: %v", m.Subject(), err)
		}
		if f, ok := ev.(events.RunFailedEvent); ok && f.Request == events.LeaseAcquire && want[f.RunID] {
			out[f.RunID] = f
		}
	}
	return out
}
