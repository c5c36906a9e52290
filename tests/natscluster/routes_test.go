package natscluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/embeddednats"
	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// root is the repository root, seen from this package.
const root = "../.."

// productionConf is the production overlay's server config, as its ConfigMap ships it.
const productionConf = root + "/deploy/kustomize/overlays/production/nats.conf"

// TestProductionRoutesRefuseUnauthenticatedPeers runs the production overlay's nats.conf as
// three nats-server processes, with route certificates from hack/deploy/route-tls.sh (what
// hack/deploy/secrets.sh puts into the Secret kubeclip-nats-routes) and the shipped users. Only
// what a local run must change is replaced (ports, paths, the route hosts), so the test fails if
// the shipped file loses its route authentication. The three form a cluster (each routes to the
// two others, JetStream has a meta leader, an R3 stream takes a write on every replica). Then a
// fourth server routes at them, once with no TLS and no credentials, once with a certificate of
// another CA for the route user's name: each is refused. It never appears in a member's routez,
// has no route itself, and an exec stream's stdin published on node 1 (what the intruder
// heard: another company's exec request) reaches a member's subscriber, never the intruder's.
func TestProductionRoutesRefuseUnauthenticatedPeers(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	routes := filepath.Join(dir, "routes")
	script := exec.Command("bash", filepath.Join(root, "hack/deploy/route-tls.sh"), routes, "localhost", embeddednats.DefaultHost)
	if out, err := script.CombinedOutput(); err != nil {
		t.Fatalf("hack/deploy/route-tls.sh: %v\n%s", err, out)
	}
	shipped, err := os.ReadFile(productionConf)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := os.ReadFile(filepath.Join(root, natstest.ShippedAuthConf))
	if err != nil {
		t.Fatal(err)
	}
	// nats.conf includes ./nats-auth.conf, beside it in the ConfigMap; the nodes' files are in dir.
	if err := os.WriteFile(filepath.Join(dir, "nats-auth.conf"), auth, 0o600); err != nil {
		t.Fatal(err)
	}
	natstest.SetAuthPasswords(t)

	const n = 3
	ports := natstest.FreePorts(t, 3*n)
	var nodes []*natstest.Node
	for i := range n {
		port, routePort, monitorPort := ports[3*i], ports[3*i+1], ports[3*i+2]
		name := fmt.Sprintf("nats-%d", i)
		// The pod's paths and ports, and the StatefulSet's DNS names (which resolve only in the
		// cluster), for this node's.
		local := []string{
			// Where the Secret kubeclip-nats-routes is mounted (if the file still reads it).
			natstest.RouteTLSMount, routes + "/",
			"listen: 0.0.0.0:4222", fmt.Sprintf("listen: %s:%d", embeddednats.DefaultHost, port),
			"http: 0.0.0.0:8222", fmt.Sprintf("http: %s:%d", embeddednats.DefaultHost, monitorPort),
			"pid_file: /var/run/nats/nats.pid", fmt.Sprintf("pid_file: %q", filepath.Join(dir, name+".pid")),
			"store_dir: /data", fmt.Sprintf("store_dir: %q", filepath.Join(dir, name)),
			"listen: 0.0.0.0:6222", fmt.Sprintf("listen: %s:%d", embeddednats.DefaultHost, routePort),
		}
		for j := range n {
			local = append(local, fmt.Sprintf("nats://nats-%d.nats-headless:6222", j), fmt.Sprintf("nats://localhost:%d", ports[3*j+1]))
		}
		conf := string(shipped)
		for k := 0; k < len(local); k += 2 {
			if k > 0 && !strings.Contains(conf, local[k]) {
				t.Fatalf("%s no longer has %q: change this test with it", productionConf, local[k])
			}
			conf = strings.ReplaceAll(conf, local[k], local[k+1])
		}
		nodes = append(nodes, natstest.StartNode(t, dir, natstest.NodeConfig{
			Name: name, Conf: conf, Port: port, RoutePort: routePort, MonitorPort: monitorPort, Env: []string{"POD_NAME=" + name},
		}))
	}
	var names []string
	for _, node := range nodes {
		names = append(names, node.Name)
	}
	for _, node := range nodes {
		if err := node.WaitHealthy(ctx); err != nil {
			t.Fatal(err)
		}
		want := slices.DeleteFunc(slices.Clone(names), func(s string) bool { return s == node.Name })
		eventually(t, time.Minute, node.Name+" routes to the others", func() error {
			peers, err := node.Peers(ctx)
			if err == nil && !slices.Equal(peers, want) {
				err = fmt.Errorf("%s routes to %v, want %v", node.Name, peers, want)
			}
			return err
		})
	}

	// JetStream: the workers' streams at three replicas, a write taken by each.
	worker := connect(t, nodes[0], "kubeclip")
	js, err := jetstream.New(worker)
	if err != nil {
		t.Fatal(err)
	}
	if err := events.EnsureStreams(ctx, js, events.Options{Replicas: 3, StoreBytes: natstest.ClusterStoreBytes}); err != nil {
		t.Fatalf("creating the R3 streams: %v", err)
	}
	var s events.Subjects
	subject, err := s.Run("company", "run", events.KindLog)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(ctx, subject, []byte("{}"))
	if err != nil {
		t.Fatalf("publishing to the R3 run stream: %v", err)
	}
	eventually(t, time.Minute, "every replica of the run stream has the write", func() error {
		stream, err := js.Stream(ctx, s.RunStream())
		if err != nil {
			return err
		}
		info := stream.CachedInfo()
		if info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != n-1 {
			return fmt.Errorf("run stream cluster: %+v", info.Cluster)
		}
		for _, r := range info.Cluster.Replicas {
			if !r.Current || r.Lag > 0 {
				return fmt.Errorf("replica %s current %v lag %d, write at %d", r.Name, r.Current, r.Lag, ack.Sequence)
			}
		}
		return nil
	})

	var members []string
	for _, node := range nodes {
		members = append(members, fmt.Sprintf("nats://localhost:%d", node.RoutePort))
	}
	for _, tc := range []struct {
		name string
		// tls is the intruder's route tls block; none for a peer with no credentials at all.
		tls string
	}{
		{name: "no-credentials"},
		{name: "untrusted-certificate", tls: func() string {
			// A certificate for the route user's name, from a CA of its own that bears the
			// installation CA's name (so the intruder's TLS offers it); the intruder trusts the
			// installation's CA, so it would accept the members.
			other := natstest.ForgeRouteTLS(t, filepath.Join(dir, "untrusted"), filepath.Join(routes, "ca.crt"))
			return fmt.Sprintf("tls { ca_file: %q, cert_file: %q, key_file: %q, verify: true }",
				filepath.Join(routes, "ca.crt"), other.Cert, other.Key)
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refused(t, nodes, members, tc.name, tc.tls)
		})
	}
}

// refused starts a server named name that routes at the members' route URLs with the route
// tls block tlsConf (natstest.StartIntruder) and shows the members never admit it.
func refused(t *testing.T, nodes []*natstest.Node, members []string, name, tlsConf string) {
	ctx := t.Context()
	intruder := natstest.StartIntruder(t, name, "kubeclip", members, tlsConf)
	if peers, err := intruder.Peers(ctx); err != nil || len(peers) > 0 {
		t.Fatalf("%s was admitted as a route by %v (%v)", name, peers, err)
	}
	for _, node := range nodes {
		peers, err := node.Peers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(peers, name) {
			t.Errorf("%s admits %s as a route: %v", node.Name, name, peers)
		}
	}

	// A stream's stdin, published on node 1: a member's subscriber on node 3 gets it (the routes
	// carry it), the intruder's subscriber to everything does not: with no route, nothing could
	// carry it there.
	stranger, err := nats.Connect(intruder.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stranger.Close)
	heard, err := stranger.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	if err := stranger.Flush(); err != nil {
		t.Fatal(err)
	}
	reader := connect(t, nodes[2], "exec-worker")
	sub, err := reader.SubscribeSync("paperclip.exec.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := reader.Flush(); err != nil {
		t.Fatal(err)
	}
	writer := connect(t, nodes[0], "exec-worker")
	const stdin = "paperclip.exec.lease.stream.io.stdin"
	eventually(t, time.Minute, "node 3 hears node 1", func() error {
		if err := writer.Publish(stdin, []byte(`{"env":{"ANTHROPIC_API_KEY":"sk-ant-test"}}`)); err != nil {
			return err
		}
		_, err := sub.NextMsg(time.Second)
		return err
	})
	if err := stranger.Flush(); err != nil {
		t.Fatal(err)
	}
	if m, err := heard.NextMsg(100 * time.Millisecond); err == nil {
		t.Fatalf("%s heard %s", name, m.Subject)
	}
}

// connect opens a connection to node as the shipped user (kubeclip or exec-worker) on its
// inbox prefix, its test password set. Cleanup closes it.
func connect(t *testing.T, node *natstest.Node, user string) *nats.Conn {
	t.Helper()
	prefix := map[string]string{"kubeclip": inbox.WorkersPrefix, "exec-worker": inbox.ExecWorkerPrefix}[user]
	nc, err := nats.Connect(node.URL(), natstest.User(user), nats.CustomInboxPrefix(prefix))
	if err != nil {
		t.Fatalf("connecting to %s as %s: %v", node.Name, user, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// eventually polls cond until it returns nil, failing the test with its last error after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), timeout)
	defer cancel()
	for {
		err := cond()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not after %s: %v", what, timeout, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
