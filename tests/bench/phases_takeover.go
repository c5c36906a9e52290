package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/runwatch"
)

const (
	// A (g) run streams at least takeoverMinStreaming, so a kill and its takeover fit, and at
	// most takeoverMaxStreaming: the bench's provider config gives a pod 120 s
	// (podActivityDeadlineSec).
	takeoverMinStreaming = 20 * time.Second
	takeoverMaxStreaming = 90 * time.Second
	// takeoverWarmLines is how many lines a run has streamed before it is first killed.
	takeoverWarmLines = 5
	// replicaReadyTimeout bounds a run-watcher process's start, informer sync included.
	replicaReadyTimeout = 30 * time.Second
	// claimGrace bounds how long the ownership watch may trail the resumed log event.
	claimGrace = 2 * time.Second
	// firstLineGrace bounds how long the bench's collector may trail the resumed log event.
	firstLineGrace = 10 * time.Second
	// maxKillFailures ends (g) after this many kills in a row measured nothing.
	maxKillFailures = 3
)

// watchingMessage is the record a run-watcher logs once its informers have synced.
var watchingMessage = []byte(`"message":"watching runs"`)

// takeover is what one kill measured.
type takeover struct {
	pipelinetest.Takeover
	// expired is when the stream stored the killed owner's key expiry marker, claimed when it
	// stored newOwner's claim of the run (server times).
	expired, claimed time.Time
	newOwner         string
	// firstLine is the delay of the first line written after the kill: its log event's
	// arrival at the bench after the line's kubelet timestamp.
	firstLine    time.Duration
	firstLineErr error
}

// streamingRun is one of (g)'s runs: the stub prints lines lines, one every
// --takeover-interval, until about ends.
type streamingRun struct {
	runID string
	lines int
	ends  time.Time
}

// takeoverPhase is (g): run-watcher takeover after a crash. The in-process run-watcher stops
// and --takeover-replicas run-watcher processes (--bin, --ownership-ttl, distinct
// --replica-id) join the bench's JetStream server. For each of --takeover-kills kills, the
// process owning a streaming stub run (its KUBECLIP_WATCH key) is SIGKILLed, and
// pipelinetest.MeasureTakeover measures from the SIGKILL to the run's next log event stored
// (necessarily written by the replica that took over); then a replacement process starts and
// the bench waits until it watches. Each kill comes after a random pause, so at a random point
// of the owner's renewal cycle, as a crash would. Runs are started as needed, sized to the kills left. At
// the end every run's history is checked: each line once, log seq without gaps, one result.
// The in-process run-watcher comes back for the phases after.
func (b *bench) takeoverPhase(ctx context.Context, rep *report) (err error) {
	ttl := b.s.ownershipTTL
	if err := b.pipe.stopWorkers(componentRunWatcher); err != nil {
		return err
	}
	defer func() {
		if rerr := b.pipe.restartRunWatcher(ctx); rerr != nil {
			err = errors.Join(err, fmt.Errorf("restarting the in-process run-watcher: %w", rerr))
		}
	}()
	env, err := pipelinetest.Attach(pipelinetest.Options{Name: "bench-takeover", OwnershipTTL: ttl}, b.pipe.nats, b.binDir(), b.s.kubeconfig)
	if env != nil {
		defer func() { err = errors.Join(err, b.closeReplicas(env, err)) }()
	}
	if err != nil {
		return fmt.Errorf("starting the run-watcher processes: %w", err)
	}
	if err := b.keepReplicas(ctx, env); err != nil {
		return err
	}
	b.logf("(g): %d run-watcher processes watching (binaries in %s, logs in %s)", b.s.takeoverReplicas, env.Bin, env.LogDir)

	var (
		gaps, toExpiry, toClaim, toResume, firstLines samples
		runs                                          []streamingRun
		ended, failures                               int
	)
	cur := -1
	margin := 2*ttl + 3*time.Second // what a kill needs of a run's remaining lines
	cycle := 2 * ttl                // estimate of one pause, kill, takeover and replacement
	for i := range b.s.takeoverKills {
		if cur < 0 || time.Until(runs[cur].ends) < margin {
			r, err := b.startStreamingRun(ctx, env, time.Duration(b.s.takeoverKills-i)*cycle+margin)
			if err != nil {
				return err
			}
			runs, cur = append(runs, r), len(runs)
		}
		began := time.Now()
		// A crash comes at any moment of the owner's renewal cycle: the pause puts the kill at a
		// random point of it, at least one renewal after the owner claimed the run.
		if err := sleep(ctx, ttl/3+rand.N(ttl/3)); err != nil {
			return err
		}
		tk, err := b.killOwner(ctx, env, runs[cur].runID)
		switch {
		case ctx.Err() != nil:
			return context.Cause(ctx)
		case err != nil:
			failures++
			b.logf("(g) kill %d: %v", i+1, err)
			gaps.add(0, err)
			cur = -1
		case tk.Result:
			ended++
			b.logf("(g) kill %d: %s owned run %s, whose log had ended: not counted", i+1, tk.Owner, runs[cur].runID)
			cur = -1
		default:
			failures = 0
			gaps.add(tk.Gap, nil)
			if tk.expired.IsZero() || tk.claimed.IsZero() {
				toExpiry.add(0, fmt.Errorf("kill %d: the ownership watch saw no expiry or claim", i+1))
			} else {
				toExpiry.add(tk.expired.Sub(tk.Killed), nil)
				toClaim.add(tk.claimed.Sub(tk.expired), nil)
				toResume.add(tk.Resumed.Sub(tk.claimed), nil)
			}
			firstLines.add(tk.firstLine, tk.firstLineErr)
			b.logf("(g) kill %d: %s → %s, next log event (seq %d) stored %s after the SIGKILL",
				i+1, tk.Owner, tk.newOwner, tk.Seq, tk.Gap.Round(time.Millisecond))
		}
		if failures >= maxKillFailures {
			return fmt.Errorf("%d kills in a row measured nothing, last: %w", failures, err)
		}
		if err := b.keepReplicas(ctx, env); err != nil {
			return err
		}
		cycle = (cycle*time.Duration(i+1) + time.Since(began)) / time.Duration(i+2)
	}
	complete, problems := b.checkStreamingRuns(ctx, env, runs)

	ttlMS := float64(2*ttl) / float64(time.Millisecond)
	rep.add(latencyRow("(g) run-watcher takeover: SIGKILL of the run's owner → next log event stored", gaps, toExpiry,
		"SIGKILL → the owner's KUBECLIP_WATCH key expired (expiry marker stored): the floor the ownership TTL sets",
		fmt.Sprintf("p99 ≤ 2 × ownership TTL (%s)", 2*ttl), func(_, p99, _ float64) bool { return p99 <= ttlMS }))
	rep.add(latencyRow("(g') first line written after the SIGKILL: kubelet timestamp → its log event received", firstLines, samples{},
		"", "none (informational)", nil))
	rep.Breakdown = append(rep.Breakdown,
		stageRow(phaseTakeover, "stage SIGKILL → the owner's key expired (expiry marker stored)", toExpiry),
		stageRow(phaseTakeover, "stage key expired → run claimed by another replica", toClaim),
		stageRow(phaseTakeover, "stage claimed → next log event stored (log read back, follow resumed)", toResume))
	rep.note("(g): %d SIGKILLs of the process owning a streaming run, among %d run-watcher processes with --ownership-ttl %s (renewed every %s: a dead owner's key expires %s to %s after the kill, plus the server's expiry check); a replacement process started after each kill, then a pause of %s to %s (a random point of the renewal cycle); streaming runs: %d, a line every %s; %d kill(s) came after the run's log had ended and are not counted",
		len(gaps.d)+gaps.errs, b.s.takeoverReplicas, ttl, ttl/3, ttl*2/3, ttl, ttl/3, ttl*2/3, len(runs), b.s.takeoverInterval, ended)
	rep.note("(g): histories after the kills: %d of %d runs complete (every stub line exactly once and in order, log seq without gaps, one result)%s",
		complete, len(runs), problems)
	return nil
}

// keepReplicas starts run-watcher processes until --takeover-replicas run, and waits until
// each watches.
func (b *bench) keepReplicas(ctx context.Context, env *pipelinetest.Env) error {
	for len(env.Workers(pipelinetest.RunWatcher)) < b.s.takeoverReplicas {
		w, err := env.StartWorker(pipelinetest.RunWatcher)
		if err != nil {
			return err
		}
		if err := waitWatching(ctx, w); err != nil {
			return err
		}
	}
	return nil
}

// waitWatching waits until the run-watcher process w logged that it watches runs (its
// informers synced): from then on it can take a run over.
func waitWatching(ctx context.Context, w *pipelinetest.Worker) error {
	ctx, cancel := context.WithTimeout(ctx, replicaReadyTimeout)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if data, err := os.ReadFile(w.LogPath); err == nil && bytes.Contains(data, watchingMessage) {
			return nil
		}
		if w.Exited() {
			return fmt.Errorf("%s exited before it watched runs (log: %s)", w.ID, w.LogPath)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not watch runs (log: %s): %w", w.ID, w.LogPath, context.Cause(ctx))
		case <-tick.C:
		}
	}
}

// closeReplicas stops the run-watcher processes (SIGTERM: they hand their runs back) and
// removes their logs, which it keeps when the phase failed.
func (b *bench) closeReplicas(env *pipelinetest.Env, failed error) error {
	err := env.Close()
	if err != nil || failed != nil {
		b.logf("(g): run-watcher logs kept in %s", env.LogDir)
		return err
	}
	return os.RemoveAll(env.Dir)
}

// binDir is --bin as an absolute path when it holds the run-watcher, else "" (Attach builds
// the binaries).
func (b *bench) binDir() string {
	dir, err := filepath.Abs(b.s.bin)
	if err == nil {
		if _, err = os.Stat(filepath.Join(dir, pipelinetest.RunWatcher)); err == nil {
			return dir
		}
	}
	b.logf("no run-watcher binary in %s (%v): building the binaries", b.s.bin, err)
	return ""
}

// startStreamingRun starts a stub run of the warm company that prints a line every
// --takeover-interval for about streaming (bounded), and returns once one of the processes
// owns it and it has streamed a few lines.
func (b *bench) startStreamingRun(ctx context.Context, env *pipelinetest.Env, streaming time.Duration) (streamingRun, error) {
	streaming = min(max(streaming, takeoverMinStreaming), takeoverMaxStreaming)
	lines := int(streaming / b.s.takeoverInterval)
	runID, _, err := b.acquire(ctx, b.warmCompany, stubEnv(lines, b.s.takeoverInterval))
	if err != nil {
		return streamingRun{}, fmt.Errorf("starting a streaming run: %w", err)
	}
	wctx, cancel := b.waitCtx(ctx)
	defer cancel()
	pod, err := b.pods.running(wctx, runID)
	if err != nil {
		return streamingRun{}, err
	}
	r := streamingRun{runID: runID, lines: lines, ends: pod.running.Add(time.Duration(lines) * b.s.takeoverInterval)}
	if _, err := b.events.waitFor(wctx, runID, func(ev *runEvents) bool { return len(ev.lines) >= takeoverWarmLines }); err != nil {
		return r, err
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		owner, err := pipelinetest.Owner(wctx, env.JS, events.Ref(b.warmCompany, runID))
		if err != nil {
			return r, err
		}
		if owner != "" {
			b.logf("(g): run %s (%d lines, %s apart) streams, owned by %s", runID, lines, b.s.takeoverInterval, owner)
			return r, nil
		}
		select {
		case <-wctx.Done():
			return r, fmt.Errorf("run %s has no owner: %w", runID, context.Cause(wctx))
		case <-tick.C:
		}
	}
}

// killOwner SIGKILLs the process owning runID and measures the takeover (MeasureTakeover),
// watching the run's ownership key meanwhile to see when it expired and who claimed it.
func (b *bench) killOwner(ctx context.Context, env *pipelinetest.Env, runID string) (takeover, error) {
	var tk takeover
	wctx, cancel := context.WithTimeout(ctx, 2*b.s.ownershipTTL+b.s.waitTimeout)
	defer cancel()
	kv, err := env.JS.KeyValue(wctx, runwatch.OwnershipBucket)
	if err != nil {
		return tk, fmt.Errorf("opening %s: %w", runwatch.OwnershipBucket, err)
	}
	watch, err := kv.Watch(wctx, events.Ref(b.warmCompany, runID).Key(), jetstream.UpdatesOnly())
	if err != nil {
		return tk, fmt.Errorf("watching the owner of run %s: %w", runID, err)
	}
	defer func() { _ = watch.Stop() }()
	if tk.Takeover, err = env.KillOwner(wctx, b.warmCompany, runID); err != nil || tk.Result {
		return tk, err
	}
	// The claim was stored before the resumed log event; the watch may deliver it a bit later.
	grace := time.NewTimer(claimGrace)
	defer grace.Stop()
	for tk.claimed.IsZero() {
		select {
		case e, ok := <-watch.Updates():
			switch {
			case !ok:
				return tk, fmt.Errorf("the ownership watch of run %s ended", runID)
			case e == nil:
			case e.Operation() != jetstream.KeyValuePut:
				if tk.expired.IsZero() {
					tk.expired = e.Created()
				}
			case string(e.Value()) != tk.Owner && !tk.expired.IsZero():
				tk.claimed, tk.newOwner = e.Created(), string(e.Value())
			}
		case <-grace.C:
			tk.newOwner = "?"
			return tk, b.firstLineAfter(ctx, runID, &tk)
		}
	}
	return tk, b.firstLineAfter(ctx, runID, &tk)
}

// firstLineAfter finds the first line runID wrote after the kill (by its kubelet timestamp)
// among the lines the bench received and records its delay in tk; a line that does not arrive
// is tk.firstLineErr. It fails only when ctx ended.
func (b *bench) firstLineAfter(ctx context.Context, runID string, tk *takeover) error {
	wctx, cancel := context.WithTimeout(ctx, firstLineGrace)
	defer cancel()
	var ts, at time.Time
	_, err := b.events.waitFor(wctx, runID, func(r *runEvents) bool {
		ts, at = time.Time{}, time.Time{}
		for k, received := range r.lines {
			t, err := time.Parse(time.RFC3339Nano, k.ts)
			if err == nil && t.After(tk.Killed) && (ts.IsZero() || t.Before(ts)) {
				ts, at = t, received
			}
		}
		return !ts.IsZero()
	})
	if err != nil {
		tk.firstLineErr = fmt.Errorf("run %s: no line written after the kill arrived: %w", runID, err)
		return ctx.Err()
	}
	tk.firstLine = at.Sub(ts)
	return nil
}

// checkStreamingRuns waits for each run's result and checks its history; it returns how many
// are complete and a summary of what was wrong with the others.
func (b *bench) checkStreamingRuns(ctx context.Context, env *pipelinetest.Env, runs []streamingRun) (int, string) {
	complete := 0
	var problems string
	for _, r := range runs {
		wctx, cancel := context.WithDeadline(ctx, r.ends.Add(b.s.waitTimeout))
		var found []string
		if _, err := b.events.result(wctx, r.runID); err != nil {
			found = []string{err.Error()}
		} else if evs, err := pipelinetest.History(wctx, env, b.warmCompany, r.runID); err != nil {
			found = []string{err.Error()}
		} else {
			found = pipelinetest.CheckHistory(evs, pipelinetest.Want{Lines: r.lines})
		}
		cancel()
		if len(found) == 0 {
			complete++
			continue
		}
		b.logf("(g): run %s: %v", r.runID, found)
		problems += fmt.Sprintf("; run %s: %s", r.runID, found[0])
	}
	return complete, problems
}
