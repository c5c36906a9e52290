package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
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

// TestKubernetesOutageEndsBackendUnavailable is issue 8.5: a Kubernetes outage longer than the
// retry budget ended as `internal`, never `backend_unavailable`, the agent guard was not freed
// (the agent blocked about 65 minutes) and the lease stayed dispatching. The dispatcher here
// talks to an API server address nobody listens on.
func TestKubernetesOutageEndsBackendUnavailable(t *testing.T) {
	_, _, js := natstest.Start(t)
	ctx := t.Context()
	if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := lease.EnsureBuckets(ctx, js, lease.BucketOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg := &rest.Config{Host: "https://127.0.0.1:1", Timeout: time.Second}
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
	d, err := New(Options{
		Clientset: cs, Dynamic: dyn, Metadata: md, Applier: applier, JetStream: js, Logger: zerolog.New(zerolog.NewTestWriter(t)),
		Backoff: func(uint64) time.Duration { return 10 * time.Millisecond }, ReconcileInterval: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})

	// What the tenant-worker leaves before it hands a lease over: the lease record and the
	// company's claim on its namespace.
	ref := events.Ref("acme", "run-outage")
	leases, _ := js.KeyValue(ctx, lease.Bucket)
	if _, _, err := (lease.Records{KV: leases}).Create(ctx, lease.Record{RunID: ref.RunID, CompanyID: ref.CompanyID, AgentID: "agent-1", State: lease.StateRequested}); err != nil {
		t.Fatal(err)
	}
	tenants, _ := js.KeyValue(ctx, lease.TenantBucket)
	owner, _ := json.Marshal(lease.TenantRecord{CompanyID: "acme"})
	if _, err := tenants.Put(ctx, "paperclip-acme", owner); err != nil {
		t.Fatal(err)
	}
	pub, err := events.NewPublisher(events.PublisherOptions{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	req := events.DispatchRequest{Namespace: "paperclip-acme", AcquireRequest: events.AcquireRequest{
		RunID: ref.RunID, CompanyID: ref.CompanyID, EnvironmentID: "env", AgentID: "agent-1", Config: json.RawMessage(`{"backend":"job"}`),
	}}
	if _, err := pub.Publish(ctx, req); err != nil {
		t.Fatal(err)
	}

	var failed events.RunFailedEvent
	err = events.Follow(ctx, js, events.Subjects{}, ref.CompanyID, ref.RunID, events.FollowOptions{}, func(r events.Received) error {
		if f, ok := r.Event.(events.RunFailedEvent); ok {
			failed = f
			return events.ErrStopFollowing
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if failed.Code != events.CodeBackendUnavailable || strings.Contains(failed.Message, "127.0.0.1") {
		t.Errorf("failed = %s %q, want backend_unavailable without the API server's address", failed.Code, failed.Message)
	}
	rec, _, err := (lease.Records{KV: leases}).Get(ctx, ref)
	if err != nil || rec.State != lease.StateFailed || rec.Failure != events.CodeBackendUnavailable {
		t.Errorf("lease after the outage: %+v (%v), want failed with backend_unavailable", rec, err)
	}
	agents, _ := js.KeyValue(ctx, AgentBucket)
	if _, err := agents.Get(ctx, agentKey("acme", "agent-1")); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("agent guard after the outage: %v, want freed", err)
	}
}
