package natstest_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestStartServesJetStream(t *testing.T) {
	s, nc, js := natstest.Start(t)
	if !s.JetStreamEnabled() {
		t.Fatal("JetStream is not enabled")
	}
	if !nc.IsConnected() {
		t.Fatal("connection is not connected")
	}
	stream, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}})
	if err != nil {
		t.Fatalf("creating stream: %v", err)
	}
	if _, err := js.Publish(t.Context(), "t.x", []byte("hello")); err != nil {
		t.Fatalf("publishing: %v", err)
	}
	info, err := stream.Info(t.Context())
	if err != nil {
		t.Fatalf("stream info: %v", err)
	}
	if info.State.Msgs != 1 {
		t.Errorf("stream holds %d messages, want 1", info.State.Msgs)
	}

	// A second client, as a second worker replica would be.
	nc2, _ := natstest.Connect(t, s)
	if !nc2.IsConnected() {
		t.Fatal("second connection is not connected")
	}
}

// TestManyConsumersOnAStream: every lease the plugin follows holds an ordered consumer on the run
// stream. nats-server refuses the 1,001st consumer of a stream, even one with MaxConsumers -1,
// unless its config raises default_max_consumers; the test server is configured as the shipped
// ones are (embeddednats.DefaultMaxConsumers).
func TestManyConsumersOnAStream(t *testing.T) {
	_, _, js := natstest.Start(t)
	stream, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "RUNS", Subjects: []string{"runs.>"}, MaxConsumers: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1100 {
		if _, err := stream.CreateConsumer(t.Context(), jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy, InactiveThreshold: time.Minute}); err != nil {
			t.Fatalf("consumer %d: %v", i+1, err)
		}
	}
}

// TestClusterRefusesUnauthenticatedRoutes: the test cluster's routes are authenticated as the
// production overlay's (tests/natscluster runs that file): a server routing at it with no TLS,
// with a certificate for the route name from a look-alike CA, or with a certificate of the
// cluster's own CA for another name (verify_and_map's map), is never admitted.
func TestClusterRefusesUnauthenticatedRoutes(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	if err := c.WaitHealthy(t.Context()); err != nil {
		t.Fatal(err)
	}
	tlsConf := func(r natstest.RouteTLS) string {
		return fmt.Sprintf("tls { ca_file: %q, cert_file: %q, key_file: %q, verify: true }", c.Routes.CA, r.Cert, r.Key)
	}
	for _, tc := range []struct{ name, tls string }{
		{name: "no-credentials"},
		{name: "untrusted-certificate", tls: tlsConf(natstest.ForgeRouteTLS(t, t.TempDir(), c.Routes.CA))},
		{name: "other-name", tls: tlsConf(c.Routes.Issue(t, t.TempDir(), "kubeclip-nats-client"))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			intruder := natstest.StartIntruder(t, tc.name, "natstest", c.RouteURLs(), tc.tls)
			for _, n := range c.Nodes {
				peers, err := n.Peers(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				if slices.Contains(peers, tc.name) {
					t.Errorf("%s routes to %v", n.Name, peers)
				}
			}
			// The intruder lists a route it dialled from the TLS handshake until the member
			// refuses its CONNECT, a few milliseconds (and again at each retry): a refused route
			// is seen gone within the wait, an admitted one never is.
			if peers := routedPeers(t, intruder, 5*time.Second); len(peers) > 0 {
				t.Errorf("%s routes to %v for 5 s", intruder.Name, peers)
			}
			noMessageCrosses(t, intruder, c.Nodes[0])
		})
	}
}

// routedPeers returns no peers once n is seen without any within wait, else the last peers
// it listed.
func routedPeers(t *testing.T, n *natstest.Node, wait time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		peers, err := n.Peers(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if len(peers) == 0 || time.Now().After(deadline) {
			return peers
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// noMessageCrosses publishes on each of a and b to a subject the other subscribes to and
// fails if either message arrives within a second: what a route, if admitted, would carry
// within milliseconds.
func noMessageCrosses(t *testing.T, a, b *natstest.Node) {
	t.Helper()
	conns := make([]*nats.Conn, 2)
	subs := make([]*nats.Subscription, 2)
	for i, n := range []*natstest.Node{a, b} {
		nc, err := nats.Connect(n.URL())
		if err != nil {
			t.Fatalf("connecting to %s: %v", n.Name, err)
		}
		t.Cleanup(nc.Close)
		if subs[i], err = nc.SubscribeSync(fmt.Sprintf("probe.to.%d", i)); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		conns[i] = nc
	}
	for i, nc := range conns {
		if err := nc.Publish(fmt.Sprintf("probe.to.%d", 1-i), []byte("crossed")); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	for i, sub := range subs {
		if m, err := sub.NextMsg(time.Second); err == nil {
			t.Errorf("a message published on %s reached %s: %q", []*natstest.Node{a, b}[1-i].Name, []*natstest.Node{a, b}[i].Name, m.Data)
		}
	}
}

// TestClusterLosesANode: the cluster's nodes are processes a test can SIGKILL; an R3 stream
// elects another leader and takes writes again, and the node comes back on its port and store.
func TestClusterLosesANode(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	ctx := t.Context()
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	_, js := c.Connect(t)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}, Replicas: 3}); err != nil {
		t.Fatalf("creating stream: %v", err)
	}
	if _, err := js.Publish(ctx, "t.x", []byte("before")); err != nil {
		t.Fatalf("publishing: %v", err)
	}
	leader, err := c.StreamLeader(ctx, js, "T")
	if err != nil {
		t.Fatal(err)
	}
	leader.Kill()
	if leader.Running() {
		t.Fatal("the killed node still runs")
	}
	// Writes resume once the other two elect a leader.
	deadline := time.Now().Add(time.Minute)
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.Publish(pctx, "t.x", []byte("after"))
		cancel()
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no write accepted a minute after the leader died: %v", err)
		}
	}
	if l, err := c.StreamLeader(ctx, js, "T"); err != nil || l == leader {
		t.Fatalf("leader after the kill: %v, %v", l, err)
	}
	if err := leader.Start(); err != nil {
		t.Fatal(err)
	}
	if err := leader.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	// Healthy means the restarted node's replica is current again.
	s, err := js.Stream(ctx, "T")
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().State.Msgs; got != 2 {
		t.Errorf("stream holds %d messages, want 2", got)
	}
}
