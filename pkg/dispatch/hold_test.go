package dispatch

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// deliveredMsg publishes one message to a scratch stream and returns it as a consumer delivers
// it, so it carries real metadata (the stream's timestamp holdAgent measures the wait from).
func deliveredMsg(t *testing.T, js jetstream.JetStream) (jetstream.Msg, time.Time) {
	t.Helper()
	ctx := t.Context()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SCRATCH", Subjects: []string{"scratch.>"}})
	if err != nil {
		t.Fatalf("creating stream: %v", err)
	}
	if _, err := js.Publish(ctx, "scratch.acquire", []byte("{}")); err != nil {
		t.Fatalf("publishing: %v", err)
	}
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatalf("creating consumer: %v", err)
	}
	m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatalf("fetching: %v", err)
	}
	md, err := m.Metadata()
	if err != nil {
		t.Fatalf("reading metadata: %v", err)
	}
	return m, md.Timestamp
}

// guardTTL reads the per-key TTL the guard of the agent was written with.
func guardTTL(t *testing.T, js jetstream.JetStream, companyID, agentID string) string {
	t.Helper()
	stream, err := js.Stream(t.Context(), "KV_"+AgentBucket)
	if err != nil {
		t.Fatalf("looking up the agent bucket's stream: %v", err)
	}
	msg, err := stream.GetLastMsgForSubject(t.Context(), "$KV."+AgentBucket+"."+agentKey(companyID, agentID))
	if err != nil {
		t.Fatalf("reading the guard: %v", err)
	}
	return msg.Header.Get(jetstream.MsgTTLHeader)
}

func TestHoldAgent(t *testing.T) {
	g, js := newAgentGuard(t)
	m, published := deliveredMsg(t, js)
	parked, err := js.CreateStream(t.Context(), ParkedStreamConfig(1, 0))
	if err != nil {
		t.Fatalf("creating the parking stream: %v", err)
	}
	const busyTimeout, busyRetry = 5 * time.Minute, 2 * time.Second

	tests := []struct {
		name       string
		agentID    string
		heldBy     string        // "" when the agent is free
		waited     time.Duration // since the acquire was published
		expiresIn  time.Duration // requestedExpiresAt - published; 0 for none
		wantErr    func(t *testing.T, err error)
		config     string // the acquire's config; {"backend":"job"} when empty
		wantHolder string
		wantTTL    string // of the guard, when this run took it
		wantParked bool   // the dispatch waits in KUBECLIP_PARKED
	}{
		{
			name: "free agent: the run takes it for the config's deadline plus margin", agentID: "free-1",
			wantHolder: "run-1", wantTTL: "1h5m0s", // podActivityDeadlineSec 3600 + 5m
		},
		{
			name: "free agent, bounded lease: the guard lasts the lease plus margin", agentID: "free-2",
			expiresIn: 30 * time.Minute, wantHolder: "run-1", wantTTL: "35m0s",
		},
		{
			name: "the run already holds it", agentID: "own", heldBy: "run-1",
			waited: time.Hour, wantHolder: "run-1",
		},
		{
			name: "free agent, a week's deadline: the guard lasts a week plus margin", agentID: "free-3",
			config: `{"backend":"job","podActivityDeadlineSec":604800}`, wantHolder: "run-1", wantTTL: "168h5m0s",
		},
		{
			name: "busy agent within the wait: parked, not held", agentID: "busy-1", heldBy: "run-0",
			waited: time.Minute, wantHolder: "run-0", wantParked: true,
		},
		{
			name: "busy agent past the wait: agent_busy", agentID: "busy-2", heldBy: "run-0",
			waited: busyTimeout, wantHolder: "run-0",
			wantErr: func(t *testing.T, err error) {
				te, ok := events.AsTerminal(err)
				if !ok {
					t.Fatalf("error %v (%T) is not terminal", err, err)
				}
				if diff := cmp.Diff([2]string{string(events.CodeAgentBusy), "agentId"}, [2]string{string(te.Code), te.Field}); diff != "" {
					t.Errorf("(code, field) (-want +got):\n%s", diff)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.heldBy != "" {
				if _, err := g.take(t.Context(), "acme", tc.agentID, tc.heldBy, time.Hour); err != nil {
					t.Fatalf("taking the guard for %s: %v", tc.heldBy, err)
				}
			}
			req := events.AcquireRequest{
				RunID: "run-1", CompanyID: "acme", EnvironmentID: "env-1", AgentID: tc.agentID,
				Config: json.RawMessage(`{"backend":"job"}`),
			}
			if tc.config != "" {
				req.Config = json.RawMessage(tc.config)
			}
			if tc.expiresIn > 0 {
				req.RequestedExpiresAt = published.Add(tc.expiresIn).Format(time.RFC3339Nano)
			}
			plan, err := lease.New(req, published, policy.DefaultOperator())
			if err != nil {
				t.Fatalf("lease.New() error: %v", err)
			}
			d := &Dispatcher{
				opts: Options{
					Now:              func() time.Time { return published.Add(tc.waited) },
					AgentBusyTimeout: busyTimeout,
					AgentBusyRetry:   busyRetry,
				},
				agents: g,
				parked: parked,
			}
			d.opts.JetStream = js

			held, err := d.holdAgent(t.Context(), zerolog.New(zerolog.NewTestWriter(t)), m, plan)
			switch {
			case tc.wantErr != nil:
				tc.wantErr(t, err)
			case err != nil:
				t.Fatalf("holdAgent() error: %v", err)
			case held == tc.wantParked: // a dispatch is either held or parked
				t.Errorf("holdAgent() held = %v, want %v", held, !tc.wantParked)
			}
			_, perr := parked.GetMsg(t.Context(), 1, jetstream.WithGetMsgSubject(parkedSubject("acme", tc.agentID)))
			if gotParked := perr == nil; gotParked != tc.wantParked {
				t.Errorf("parked = %v (%v), want %v", gotParked, perr, tc.wantParked)
			}
			if diff := cmp.Diff(tc.wantHolder, holder(t, g, "acme", tc.agentID)); diff != "" {
				t.Errorf("guard holder (-want +got):\n%s", diff)
			}
			if tc.wantTTL != "" {
				if diff := cmp.Diff(tc.wantTTL, guardTTL(t, js, "acme", tc.agentID)); diff != "" {
					t.Errorf("guard TTL (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// TestParkedStreamIsSizedFromTheStore: the parking stream takes its share of the operator's
// store and, full, refuses a new parked dispatch rather than drop one that waits.
func TestParkedStreamIsSizedFromTheStore(t *testing.T) {
	const store = 64 << 20
	c := ParkedStreamConfig(1, store)
	if want := int64(store / 1000 * 30); c.MaxBytes != want || c.Discard != jetstream.DiscardNew {
		t.Errorf("max bytes %d, discard %v; want %d, DiscardNew", c.MaxBytes, c.Discard, want)
	}
}
