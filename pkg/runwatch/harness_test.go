package runwatch

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	k8sfake "k8s.io/client-go/kubernetes/fake"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

const (
	testNamespace = "paperclip-acme"
	testCompany   = "acme"
)

// harness is the run goroutines' dependencies wired to a real JetStream server, without
// informers or a cluster, and a Watcher around them (for reconcile).
type harness struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	pub    *events.Publisher
	d      *deps
	w      *Watcher
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	_, _, js := natstest.Start(t)
	if err := events.EnsureStreams(t.Context(), js, events.Options{}); err != nil {
		t.Fatalf("creating streams: %v", err)
	}
	if err := lease.EnsureBuckets(t.Context(), js, lease.BucketOptions{}); err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(t.Context(), events.Subjects{}.RunStream())
	if err != nil {
		t.Fatalf("looking up the run stream: %v", err)
	}
	pub, err := events.NewPublisher(events.PublisherOptions{JS: js, Now: clock})
	if err != nil {
		t.Fatalf("creating publisher: %v", err)
	}
	leases, err := js.KeyValue(t.Context(), lease.Bucket)
	if err != nil {
		t.Fatalf("opening the lease bucket: %v", err)
	}
	opts := Options{
		JetStream: js, Now: clock, Container: agentContainer,
		// Chunks go out when a test flushes, not when a timer says.
		FlushInterval: time.Hour,
	}
	d := &deps{
		opts: opts, log: testLogger(t), pub: pub, stream: stream,
		leases: lease.Records{KV: leases}, cluster: &clusterCache{},
		// An empty cluster: the workloads' lookups (reconcile's Exists) find nothing.
		workloads: workload.Deps{Clientset: k8sfake.NewClientset()},
	}
	w := &Watcher{opts: opts, log: d.log, publisher: pub, trackers: map[events.RunRef]*tracker{}}
	return &harness{js: js, stream: stream, pub: pub, d: d, w: w}
}

// lease records a lease for runID, as the dispatcher does before it creates the workload; the
// watcher follows only leased runs.
func (h *harness) lease(t *testing.T, runID string) {
	t.Helper()
	if _, _, err := h.d.leases.Create(t.Context(), lease.Record{RunID: runID, CompanyID: testCompany, Namespace: testNamespace, Backend: string(policy.BackendJob), State: lease.StateCreated}); err != nil {
		t.Fatalf("creating the lease of %s: %v", runID, err)
	}
}

// tracker returns a tracker of runID with a fresh journal.
func (h *harness) tracker(t *testing.T, runID string) *tracker {
	t.Helper()
	ref := events.Ref(testCompany, runID)
	tr := newTracker(h.d, testNamespace, ref, func() {})
	tr.journal = newJournal(ref, h.d.journalOptions(h.d.log))
	return tr
}

// publish publishes ev and returns its stream sequence.
func (h *harness) publish(t *testing.T, ev events.Event) uint64 {
	t.Helper()
	ack, err := h.pub.Publish(t.Context(), ev)
	if err != nil {
		t.Fatalf("publishing %T: %v", ev, err)
	}
	return ack.Sequence
}

// runEvents reads every event of kind the stream holds for runID, in order.
func runEvents[E any](t *testing.T, h *harness, runID string, kind events.RunKind) []E {
	t.Helper()
	out, err := readRunEvents[E](t.Context(), h, runID, kind)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// readRunEvents reads every event of kind of the run from the stream.
func readRunEvents[E any](ctx context.Context, h *harness, runID string, kind events.RunKind) ([]E, error) {
	subj, err := events.Subjects{}.Run(testCompany, runID, kind)
	if err != nil {
		return nil, err
	}
	cons, err := h.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{subj}})
	if err != nil {
		return nil, fmt.Errorf("creating consumer: %w", err)
	}
	var out []E
	for {
		batch, err := cons.FetchNoWait(100)
		if err != nil {
			return nil, fmt.Errorf("fetching: %w", err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			var ev E
			if err := json.Unmarshal(msg.Data(), &ev); err != nil {
				return nil, fmt.Errorf("decoding %s: %w", msg.Subject(), err)
			}
			out = append(out, ev)
		}
		if err := batch.Error(); err != nil {
			return nil, fmt.Errorf("fetching: %w", err)
		}
		if n == 0 {
			return out, nil
		}
	}
}
