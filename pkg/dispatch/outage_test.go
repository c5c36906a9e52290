package dispatch

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// TestKubernetesOutageEndsBackendUnavailable is issue 8.5: a Kubernetes outage longer than the
// retry budget ended as `internal`, never `backend_unavailable`, the agent guard was not freed
// (the agent blocked about 65 minutes) and the lease stayed dispatching. The dispatcher here
// talks to an API server address nobody listens on.
func TestKubernetesOutageEndsBackendUnavailable(t *testing.T) {
	js, start := unreachableDispatcher(t, nil)
	start()
	ctx := t.Context()

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
	if _, err := pub.Publish(ctx, planned(t, req)); err != nil {
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
