package dispatch

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/internal/natstest"
)

// newAgentGuard returns a guard over a fresh KUBECLIP_AGENTS bucket on a real JetStream server.
func newAgentGuard(t *testing.T) (agentGuard, jetstream.JetStream) {
	t.Helper()
	_, _, js := natstest.Start(t)
	kv, err := js.CreateKeyValue(t.Context(), AgentBucketConfig(1, 0))
	if err != nil {
		t.Fatalf("creating the agent bucket: %v", err)
	}
	return agentGuard{kv: kv}, js
}

// holder reads the run holding the agent, "" when nobody does.
func holder(t *testing.T, g agentGuard, companyID, agentID string) string {
	t.Helper()
	entry, err := g.kv.Get(t.Context(), agentKey(companyID, agentID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return ""
	}
	if err != nil {
		t.Fatalf("reading the guard: %v", err)
	}
	return string(entry.Value())
}

func TestAgentGuardTakeAndFree(t *testing.T) {
	g, _ := newAgentGuard(t)
	log := zerolog.New(zerolog.NewTestWriter(t))
	const company, agent, ttl = "acme", "agent-1", time.Hour

	steps := []struct {
		name       string
		op         string // "take" or "free"
		agentID    string
		runID      string
		wantTaken  string // take's result
		wantHolder string // the guard's value afterwards
	}{
		{name: "A takes a free agent", op: "take", agentID: agent, runID: "run-a", wantTaken: "run-a", wantHolder: "run-a"},
		{name: "B finds A holding it", op: "take", agentID: agent, runID: "run-b", wantTaken: "run-a", wantHolder: "run-a"},
		{name: "A takes it again", op: "take", agentID: agent, runID: "run-a", wantTaken: "run-a", wantHolder: "run-a"},
		{name: "B cannot free A's hold", op: "free", agentID: agent, runID: "run-b", wantHolder: "run-a"},
		{name: "an empty agent id frees nothing", op: "free", agentID: "", runID: "run-a", wantHolder: "run-a"},
		{name: "A frees it", op: "free", agentID: agent, runID: "run-a", wantHolder: ""},
		{name: "freeing a free agent is a no-op", op: "free", agentID: agent, runID: "run-a", wantHolder: ""},
		{name: "B takes the freed agent", op: "take", agentID: agent, runID: "run-b", wantTaken: "run-b", wantHolder: "run-b"},
		{name: "A finds B holding it", op: "take", agentID: agent, runID: "run-a", wantTaken: "run-b", wantHolder: "run-b"},
		{name: "another agent is independent", op: "take", agentID: "agent-2", runID: "run-c", wantTaken: "run-c", wantHolder: "run-c"},
	}
	for _, tc := range steps {
		ok := t.Run(tc.name, func(t *testing.T) {
			switch tc.op {
			case "take":
				got, err := g.take(t.Context(), company, tc.agentID, tc.runID, ttl)
				if err != nil {
					t.Fatalf("take() error: %v", err)
				}
				if diff := cmp.Diff(tc.wantTaken, got); diff != "" {
					t.Errorf("take() holder (-want +got):\n%s", diff)
				}
			case "free":
				g.free(t.Context(), log, company, tc.agentID, tc.runID)
			default:
				t.Fatalf("unknown op %q", tc.op)
			}
			id := tc.agentID
			if id == "" {
				id = agent
			}
			if diff := cmp.Diff(tc.wantHolder, holder(t, g, company, id)); diff != "" {
				t.Errorf("guard value afterwards (-want +got):\n%s", diff)
			}
		})
		if !ok {
			break // later steps build on this one
		}
	}
	if got := holder(t, g, company, agent); got != "run-b" {
		t.Errorf("agent-1 is held by %q at the end, want run-b", got)
	}
}

func TestAgentGuardKeysAreScopedByCompany(t *testing.T) {
	g, _ := newAgentGuard(t)
	for _, company := range []string{"acme", "globex"} {
		got, err := g.take(t.Context(), company, "agent-1", "run-"+company, time.Hour)
		if err != nil {
			t.Fatalf("take() error: %v", err)
		}
		if got != "run-"+company {
			t.Errorf("take() for company %s = %q, want run-%s", company, got, company)
		}
	}
}

func TestAgentGuardTTLFreesAnAbandonedAgent(t *testing.T) {
	g, _ := newAgentGuard(t)
	const company, agent = "acme", "agent-1"

	got, err := g.take(t.Context(), company, agent, "run-dead", time.Second)
	if err != nil {
		t.Fatalf("take() error: %v", err)
	}
	if got != "run-dead" {
		t.Fatalf("take() = %q, want run-dead", got)
	}
	// Nobody frees run-dead's guard: its dispatcher died. The TTL must.
	eventually(t, "the guard's TTL to free the agent", func() bool {
		got, err := g.take(t.Context(), company, agent, "run-next", time.Hour)
		if err != nil {
			t.Fatalf("take() error: %v", err)
		}
		return got == "run-next"
	})
	if got := holder(t, g, company, agent); got != "run-next" {
		t.Errorf("agent held by %q, want run-next", got)
	}
}

// TestAgentBucketAllowsKeyTTLs: agent guards carry their own TTL, which the bucket must allow,
// and a second guard of the same agent is refused.
func TestAgentBucketAllowsKeyTTLs(t *testing.T) {
	g, _ := newAgentGuard(t)
	ctx := t.Context()
	if _, err := g.kv.Create(ctx, "c1/agent-1", []byte("r1"), jetstream.KeyTTL(time.Minute)); err != nil {
		t.Errorf("creating an agent guard with a TTL: %v", err)
	}
	if _, err := g.kv.Create(ctx, "c1/agent-1", []byte("r2"), jetstream.KeyTTL(time.Minute)); !errors.Is(err, jetstream.ErrKeyExists) {
		t.Errorf("a second guard for the same agent: got %v, want ErrKeyExists", err)
	}
}
