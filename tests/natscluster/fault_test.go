package natscluster

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/internal/natstest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// fault is one node killed, and when writes came back.
type fault struct {
	what   string
	killed time.Time
	// resumed is when the first publish after the kill was stored.
	resumed time.Time
	// firstEvent is when the first run event after the kill was stored (any run's).
	firstEvent time.Time
}

// probe publishes to the run stream, under a run of its own, to tell when writes resume.
type probe struct {
	pub *events.Publisher
	run string
	seq atomic.Uint64
}

func newProbe(env *pt.Env) *probe {
	pub, _ := events.NewPublisher(events.PublisherOptions{JS: env.JS, Subjects: env.Subjects})
	return &probe{pub: pub, run: pt.NewID("probe")}
}

// until publishes, each attempt bounded by a second, until one is stored, and returns when.
func (p *probe) until(ctx context.Context) (time.Time, error) {
	deadline := time.Now().Add(faultTimeout)
	for {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		_, err := p.pub.Publish(actx, events.RunLogEvent{RunID: p.run, CompanyID: "probe", Seq: p.seq.Add(1), Pod: "probe", Container: "probe"})
		cancel()
		if err == nil {
			return time.Now(), nil
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("no publish stored within %s: %w", faultTimeout, err)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// kill SIGKILLs n and waits until writes resume.
func kill(t *testing.T, p *probe, what string, n *natstest.Node) *fault {
	t.Helper()
	f := &fault{what: what, killed: time.Now()}
	n.Kill()
	resumed, err := p.until(t.Context())
	if err != nil {
		t.Fatalf("after killing %s: %v", what, err)
	}
	f.resumed = resumed
	t.Logf("killed %s; writes resumed %s later", what, f.resumed.Sub(f.killed).Round(time.Millisecond))
	return f
}

// restart starts n again on its port and store and waits until it is healthy (its streams
// caught up).
func restart(t *testing.T, n *natstest.Node) {
	t.Helper()
	start := time.Now()
	if err := n.Start(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), faultTimeout)
	defer cancel()
	if err := n.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("restarted node %s; healthy after %s", n.Name, time.Since(start).Round(time.Millisecond))
}

// firstEventAfter is when the stream stored the first run event after at, of any run.
func firstEventAfter(histories map[*pt.Run][]events.Received, at time.Time) time.Time {
	var first time.Time
	for _, evs := range histories {
		for _, e := range evs {
			if e.Published.After(at) && (first.IsZero() || e.Published.Before(first)) {
				first = e.Published
				break
			}
		}
	}
	return first
}

// report logs each fault's figures as columns: what died, when writes resumed and when the
// runs' events flowed again, in seconds after the kill.
func report(t *testing.T, faults []*fault) {
	var b strings.Builder
	fmt.Fprintf(&b, "%-32s %18s %20s\n", "fault", "writes_resumed_s", "first_run_event_s")
	for _, f := range faults {
		first := "-"
		if !f.firstEvent.IsZero() {
			first = fmt.Sprintf("%.3f", f.firstEvent.Sub(f.killed).Seconds())
		}
		fmt.Fprintf(&b, "%-32s %18.3f %20s\n", f.what, f.resumed.Sub(f.killed).Seconds(), first)
	}
	t.Logf("faults:\n%s", b.String())
}
