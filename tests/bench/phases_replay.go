package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/runwatch"
)

// replayTarget is (h)'s target: a 100k-event run replays in under a second (the anchors:
// JetStream ordered consumers read over a million messages per second).
const replayTarget = 100_000

// syntheticRun is a run (h) published straight into the run stream: log events and a result,
// no workload behind it.
type syntheticRun struct {
	companyID, runID string
	logEvents        int
	lines            int
	bytes            int // payload bytes of the log events
}

// events is every event of the run: its log events and its result.
func (r syntheticRun) events() int { return r.logEvents + 1 }

// replayPhase is (h): a synthetic run of --replay-lines agent lines is published into the run
// stream with the real Publisher (sequential synchronous publishes with the run-watcher's
// expected-last-sequence fence, not timed), then read from its first event with events.Follow
// until caught up, decoding included, --replay-rounds times; the raw side reads the same
// messages with a bare ordered consumer and no decoding.
//
// It does so twice. First with one line per event, as the run-watcher publishes an agent that
// writes its lines one at a time (its flush interval is 5 ms; stream-json lines come further
// apart), so events = lines = 100k: the count the target is about. Then with the lines packed
// by runwatch.LogBatcher as the run-watcher packs a burst (≤ 1000 lines, ≤ 64 KiB per event):
// lines per second, the rate at which a reader gets a burst-heavy log back.
func (b *bench) replayPhase(ctx context.Context, rep *report) error {
	js, err := b.pipe.jetStream(ctx, "bench-replay", zerolog.Nop())
	if err != nil {
		return err
	}
	single, err := b.publishSyntheticRun(ctx, false)
	if err != nil {
		return err
	}
	batched, err := b.publishSyntheticRun(ctx, true)
	if err != nil {
		return err
	}

	sFollow, sRaw, err := b.replays(ctx, js, single)
	if err != nil {
		return err
	}
	bFollow, bRaw, err := b.replays(ctx, js, batched)
	if err != nil {
		return err
	}

	// Rates per round: events (or lines) over each replay's duration; the median is reported.
	evRate := rates(sFollow, single.events())
	rawEvRate := rates(sRaw, single.events())
	metEvents := median(evRate) >= replayTarget
	rep.add(row{
		Metric: fmt.Sprintf("(h) replay a %d-line run, 1 line per event: events/s (= lines/s)", single.lines),
		N:      single.events(), Unit: "ev/s", P50: round2(median(evRate)),
		RawN: single.events(), RawP50: round2(median(rawEvRate)), Ratio: ratio(median(evRate), median(rawEvRate)),
		Raw:    "the same messages read by a bare ordered consumer until caught up, no decoding: msgs/s",
		Target: fmt.Sprintf("≥ %d events/s", replayTarget), Met: &metEvents,
		dist: dist{pipe: sFollow, raw: sRaw},
	})
	lineRate := rates(bFollow, batched.lines)
	rawLineRate := rates(bRaw, batched.lines)
	metLines := median(lineRate) >= replayTarget
	rep.add(row{
		Metric: fmt.Sprintf("(h') replay a %d-line run, batched (%d events): lines/s", batched.lines, batched.events()),
		N:      batched.lines, Unit: "lines/s", P50: round2(median(lineRate)),
		RawN: batched.lines, RawP50: round2(median(rawLineRate)), Ratio: ratio(median(lineRate), median(rawLineRate)),
		Raw:    "the same messages read by a bare ordered consumer until caught up, no decoding: their lines/s",
		Target: fmt.Sprintf("≥ %d lines/s", replayTarget), Met: &metLines,
		dist: dist{pipe: bFollow, raw: bRaw},
	})
	rep.note("(h): replay = events.Follow from the run's first event until Pending = 0 (ordered consumer, every message decoded), on its own NATS connection; median of %d rounds, raw and Follow alternating. "+
		"(h) counts events: %d log events of one line each plus the result, %.0f bytes per log event, %s in %s (median), i.e. %s events/s = %s lines/s (rounds: %s). "+
		"(h') packs the same kind of lines as the run-watcher packs a burst: %d log events of ≤ %d lines / ≤ %d KiB plus the result, %s in %s, i.e. %s lines/s and %s events/s of about %d lines each (rounds, lines/s: %s). "+
		"The target (≥ %d/s, a 100k-event run in < 1 s) is about events; (h) is the run where events and lines are the same",
		b.s.replayRounds,
		single.logEvents, float64(single.bytes)/float64(single.logEvents), mib(single.bytes), median(sFollow).Round(time.Millisecond),
		rate0(median(evRate)), rate0(median(evRate)), joinRates(evRate),
		batched.logEvents, runwatch.DefaultLogMaxLines, events.MaxLogEventBytes>>10, mib(batched.bytes), median(bFollow).Round(time.Millisecond),
		rate0(median(lineRate)), rate0(median(rates(bFollow, batched.events()))), batched.lines/max(1, batched.logEvents), joinRates(lineRate),
		replayTarget)
	return nil
}

// publishSyntheticRun publishes a run of --replay-lines stub-like assistant lines, one per event
// or packed by a LogBatcher, and its result, each event fenced on the previous one as the
// run-watcher does. The collector skips its log events; it has passed them once it saw the
// result.
func (b *bench) publishSyntheticRun(ctx context.Context, batched bool) (syntheticRun, error) {
	r := syntheticRun{companyID: newID("replay-"), runID: newID("run-")}
	b.events.skipLogsOf(r.runID)
	start := time.Now()
	var last uint64 // the run's previous log event's stream sequence
	publish := func(ev events.RunLogEvent) error {
		msg, err := b.pub.Msg(ev)
		if err != nil {
			return err
		}
		ack, err := b.pub.Publish(ctx, ev, jetstream.WithExpectLastSequencePerSubject(last))
		if err != nil {
			return fmt.Errorf("publishing synthetic log event %d: %w", ev.Seq, err)
		}
		last = ack.Sequence
		r.logEvents++
		r.lines += len(ev.Lines)
		r.bytes += len(msg.Data)
		return nil
	}
	lineMaxPerEvent := 1
	if batched {
		lineMaxPerEvent = runwatch.DefaultLogMaxLines
	}
	batcher, err := runwatch.NewLogBatcher(runwatch.LogBatcherOptions{
		RunID: r.runID, CompanyID: r.companyID, Pod: "synthetic-" + r.runID, Container: policy.AgentContainerName,
		MaxLines: lineMaxPerEvent,
	})
	if err != nil {
		return r, err
	}
	session := newID("session-")
	t0 := time.Now().Add(-time.Hour).UTC()
	for i := 1; i <= b.s.replayLines; i++ {
		line := events.LogLine{
			TS:   t0.Add(time.Duration(i) * time.Millisecond).Format("2006-01-02T15:04:05.000000000Z07:00"),
			Text: fmt.Sprintf(`{"type":"assistant","session_id":%q,"message":{"id":"msg_%d","content":[{"type":"text","text":"stub line %d"}]}}`, session, i, i),
		}
		for _, ev := range batcher.Add(line) {
			if err := publish(ev); err != nil {
				return r, err
			}
		}
	}
	if ev, ok := batcher.Flush(); ok {
		if err := publish(ev); err != nil {
			return r, err
		}
	}
	exit := 0
	result := events.RunResultEvent{RunID: r.runID, CompanyID: r.companyID, Outcome: events.OutcomeSucceeded, ExitCode: &exit, Reason: "Completed"}
	if _, err := b.pub.Publish(ctx, result, jetstream.WithExpectLastSequencePerSubject(0)); err != nil {
		return r, fmt.Errorf("publishing the synthetic run's result: %w", err)
	}
	wctx, cancel := b.waitCtx(ctx)
	defer cancel()
	if _, err := b.events.result(wctx, r.runID); err != nil {
		return r, err
	}
	b.logf("replay: synthetic run of %d lines in %d log events (%s) published in %s",
		r.lines, r.logEvents, mib(r.bytes), time.Since(start).Round(time.Millisecond))
	return r, nil
}

// replays times --replay-rounds replays of r with events.Follow and as many raw reads, alternating
// which goes first.
func (b *bench) replays(ctx context.Context, js jetstream.JetStream, r syntheticRun) (follow, raw []time.Duration, err error) {
	for i := range b.s.replayRounds {
		steps := []func() error{
			func() error {
				d, err := b.followReplay(ctx, js, r)
				follow = append(follow, d)
				return err
			},
			func() error {
				d, err := b.rawReplay(ctx, js, r)
				raw = append(raw, d)
				return err
			},
		}
		if i%2 == 1 {
			slices.Reverse(steps)
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return follow, raw, err
			}
		}
	}
	return follow, raw, nil
}

// followReplay reads r from its first event with events.Follow until it has caught up and
// checks it got every event and line.
func (b *bench) followReplay(ctx context.Context, js jetstream.JetStream, r syntheticRun) (time.Duration, error) {
	wctx, cancel := b.waitCtx(ctx)
	defer cancel()
	var evs, lines int
	start := time.Now()
	err := events.Follow(wctx, js, b.subjects, r.companyID, r.runID, events.FollowOptions{}, func(rc events.Received) error {
		if rc.Err != nil {
			return fmt.Errorf("event %d: %w", rc.StreamSeq, rc.Err)
		}
		evs++
		if ev, ok := rc.Event.(events.RunLogEvent); ok {
			lines += len(ev.Lines)
		}
		if rc.Pending == 0 {
			return events.ErrStopFollowing
		}
		return nil
	})
	took := time.Since(start)
	if err != nil {
		return took, fmt.Errorf("replaying run %s: %w", r.runID, err)
	}
	if evs != r.events() || lines != r.lines {
		return took, fmt.Errorf("replaying run %s: got %d events and %d lines, want %d and %d", r.runID, evs, lines, r.events(), r.lines)
	}
	return took, nil
}

// rawReplay reads r's messages as Follow does (ordered consumer, same filter, same pull
// settings, metadata parsed) but without decoding them.
func (b *bench) rawReplay(ctx context.Context, js jetstream.JetStream, r syntheticRun) (time.Duration, error) {
	wctx, cancel := b.waitCtx(ctx)
	defer cancel()
	filter, err := b.subjects.RunFilter(r.companyID, r.runID)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	cons, err := js.OrderedConsumer(wctx, b.subjects.RunStream(), jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return 0, fmt.Errorf("raw replay of run %s: %w", r.runID, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return 0, fmt.Errorf("raw replay of run %s: %w", r.runID, err)
	}
	defer it.Stop()
	for n := 1; ; n++ {
		m, err := it.Next(jetstream.NextContext(wctx))
		if err != nil {
			return time.Since(start), fmt.Errorf("raw replay of run %s: %w", r.runID, err)
		}
		meta, err := m.Metadata()
		if err != nil {
			return time.Since(start), fmt.Errorf("raw replay of run %s: %w", r.runID, err)
		}
		if meta.NumPending == 0 {
			if n != r.events() {
				return time.Since(start), fmt.Errorf("raw replay of run %s: %d messages, want %d", r.runID, n, r.events())
			}
			return time.Since(start), nil
		}
	}
}

// rates turns durations into n per second each.
func rates(ds []time.Duration, n int) []float64 {
	out := make([]float64, 0, len(ds))
	for _, d := range ds {
		if d > 0 {
			out = append(out, float64(n)/d.Seconds())
		}
	}
	return out
}

// median is the middle value (the lower of the two middle ones), or zero without values.
func median[T float64 | time.Duration](vs []T) T {
	if len(vs) == 0 {
		return 0
	}
	s := slices.Clone(vs)
	slices.Sort(s)
	return s[(len(s)-1)/2]
}

func rate0(v float64) string { return fmt.Sprintf("%.0f", v) }

func joinRates(vs []float64) string {
	out := ""
	for i, v := range vs {
		if i > 0 {
			out += ", "
		}
		out += rate0(v)
	}
	return out
}

func mib(n int) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
