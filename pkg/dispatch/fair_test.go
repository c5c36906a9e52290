package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// unreachableDispatcher makes a Dispatcher on a fresh nats-server (streams and buckets created)
// whose Kubernetes clients talk to an API server address nobody listens on; mod adjusts its
// Options. start runs it until the test ends.
func unreachableDispatcher(t *testing.T, mod func(*Options)) (js jetstream.JetStream, start func()) {
	t.Helper()
	js, opts := unreachableOptions(t, nil)
	if mod != nil {
		mod(&opts)
	}
	return js, startDispatcher(t, opts)
}

// unreachableOptions are unreachableDispatcher's Options before mod; wrap, when set, wraps the
// Kubernetes clients' transport (to see what they would send).
func unreachableOptions(t *testing.T, wrap func(http.RoundTripper) http.RoundTripper) (jetstream.JetStream, Options) {
	t.Helper()
	_, _, js := natstest.Start(t)
	ctx := t.Context()
	if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := lease.EnsureBuckets(ctx, js, lease.BucketOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := &rest.Config{Host: "https://127.0.0.1:1", Timeout: time.Second}
	if wrap != nil {
		cfg.WrapTransport = wrap
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	md, err := metadata.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	applier, err := k8s.NewApplier(k8s.ApplierOptions{Dynamic: dyn, Mapper: k8s.NewRESTMapper(cs.Discovery())})
	if err != nil {
		t.Fatal(err)
	}
	return js, Options{
		Clientset: cs, Dynamic: dyn, Metadata: md, Applier: applier, JetStream: js, Logger: zerolog.New(zerolog.NewTestWriter(t)),
		Backoff: func(uint64) time.Duration { return 10 * time.Millisecond }, ReconcileInterval: time.Hour,
	}
}

// startDispatcher makes a Dispatcher of opts; the function it returns runs it until the test
// ends.
func startDispatcher(t *testing.T, opts Options) func() {
	t.Helper()
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return func() {
		runCtx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- d.Run(runCtx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
	}
}

// TestDispatchesAreServedPerCompany is issue 26 item 15 at the dispatcher: company flood's
// thousands of dispatches are on the work queue before company quiet's one; quiet's is handled
// (here: refused, its namespace being no tenant of its company, and reported `failed`) while at
// least 90 % of flood's still wait. The run stream's order of `failed` events shows it.
func TestDispatchesAreServedPerCompany(t *testing.T) {
	const flood = 2000
	js, start := unreachableDispatcher(t, func(o *Options) {
		o.Concurrency = 2
		o.Logger = zerolog.Nop()
	})
	ctx := t.Context()
	pub, err := events.NewPublisher(events.PublisherOptions{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	dispatch := func(companyID, runID string) {
		req := events.DispatchRequest{Namespace: "paperclip-" + companyID, AcquireRequest: events.AcquireRequest{
			RunID: runID, CompanyID: companyID, EnvironmentID: "env", AgentID: "agent-1", Config: json.RawMessage(`{"backend":"job"}`),
		}}
		if _, err := pub.Publish(ctx, planned(t, req)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range flood {
		dispatch("flood", fmt.Sprintf("run-%d", i))
	}
	dispatch("quiet", "run-0")
	start()

	var seq uint64
	err = events.Follow(ctx, js, events.Subjects{}, "quiet", "run-0", events.FollowOptions{}, func(r events.Received) error {
		if _, ok := r.Event.(events.RunFailedEvent); ok {
			seq = r.StreamSeq
			return events.ErrStopFollowing
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// The dispatcher publishes nothing but these `failed` events: every one before quiet's is
	// one of flood's.
	before := seq - 1
	t.Logf("company quiet's dispatch failed at run-stream sequence %d, behind %d of company flood's %d", seq, before, flood)
	if before > flood/10 {
		t.Errorf("company quiet's dispatch was handled after %d of company flood's %d, want while at least 90%% were waiting", before, flood)
	}
}
