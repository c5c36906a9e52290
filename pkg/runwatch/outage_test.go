package runwatch

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestJournalRetriesAChunkAfterAnOutage: a quiet agent's line whose publish failed while the
// run stream had no leader is stored within a few seconds of writes resuming, without another
// line to carry it. The journal's connection stays on a node that survives; the stream's leader
// and a third node are SIGKILLed, so the stream has no quorum until they are back. Before, the
// chunk waited for the next line or the run's end (issue 16: 41.8–43.1 s after writes resumed).
func TestJournalRetriesAChunkAfterAnOutage(t *testing.T) {
	ctx := t.Context()
	cluster := natstest.StartCluster(t, 3)
	if err := cluster.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	_, setup := cluster.Connect(t)
	if err := events.EnsureStreams(ctx, setup, events.Options{Replicas: 3, StoreBytes: natstest.ClusterStoreBytes}); err != nil {
		t.Fatalf("creating streams: %v", err)
	}
	runStreamName := events.Subjects{}.RunStream()
	leader, err := cluster.StreamLeader(ctx, setup, runStreamName)
	if err != nil {
		t.Fatal(err)
	}
	others := cluster.Others(leader)
	survivor, killed := others[0], []*natstest.Node{leader, others[1]}

	nc, err := nats.Connect(survivor.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, runStreamName)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := events.NewPublisher(events.PublisherOptions{JS: js, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{js: js, stream: stream, pub: pub}
	const runID = "run-quiet"
	j := newJournal(events.Ref(testCompany, runID), journalOptions{
		subjects: events.Subjects{}, pub: pub, stream: stream, now: time.Now, interval: 20 * time.Millisecond, log: testLogger(t),
	})
	t.Cleanup(j.stop)
	if err := j.setPod("pc-x-abcde", agentContainer); err != nil {
		t.Fatal(err)
	}
	// stored reports chunk seq stored; a read that fails (the stream settling) is a no.
	stored := func(seq uint64) func() bool {
		return func() bool {
			last, err := events.LastRunEvent[events.RunLogEvent](ctx, stream, events.Subjects{}, events.Ref(testCompany, runID))
			return err == nil && last.Ours && last.Event.Seq >= seq
		}
	}
	if err := j.add(ctx, kline(t, ts0, "before the outage")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, "the first line stored", stored(1))

	for _, n := range killed {
		n.Kill()
	}
	if err := j.add(ctx, kline(t, ts1, "during the outage, then silence")); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, time.Minute, "the journal's publish failing", func() bool {
		j.mu.Lock()
		defer j.mu.Unlock()
		return j.failures > 0
	})

	for _, n := range killed {
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
	}
	// Writes resume when a probe publish, on another run's subject, is stored.
	probe := events.RunLogEvent{RunID: "run-probe", CompanyID: testCompany, Seq: 1, Pod: "p", Container: "c"}
	waitUntil(t, time.Minute, "writes resuming", func() bool {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := pub.Publish(pctx, probe)
		return err == nil
	})
	resumed := time.Now()
	// publishRetryLimit, one publish, and room for a loaded machine: before the fix the line
	// waited for the next one, which never comes.
	waitUntil(t, 15*time.Second, "the quiet run's line stored after writes resumed", stored(2))
	t.Logf("the quiet run's line was stored %s after writes resumed", time.Since(resumed).Round(time.Millisecond))

	want := []events.RunLogEvent{
		logEvent(runID, 1, line(ts0, "before the outage")),
		logEvent(runID, 2, line(ts1, "during the outage, then silence")),
	}
	// The stream may still be settling after the restarts (a read can find no responders for a
	// moment): read until a read succeeds.
	var got []events.RunLogEvent
	waitUntil(t, 30*time.Second, "a read of the run's log events", func() bool {
		var err error
		got, err = readRunEvents[events.RunLogEvent](ctx, h, runID, events.KindLog)
		return err == nil
	})
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(events.RunLogEvent{}, "At")); diff != "" {
		t.Errorf("published log events (-want +got):\n%s", diff)
	}
}

// waitUntil polls cond until it holds, failing the test after timeout.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestRetryBackoff pins the journal's retry spacing: quick at first, then no more than one
// publish per run every publishRetryLimit, which bounds a line's wait after writes resume.
func TestRetryBackoff(t *testing.T) {
	for n, want := range map[uint64]time.Duration{
		1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 5: 1600 * time.Millisecond, 6: 2 * time.Second, 1000: 2 * time.Second,
	} {
		if got := retryBackoff(n); got != want {
			t.Errorf("retryBackoff(%d) = %s, want %s", n, got, want)
		}
	}
}
