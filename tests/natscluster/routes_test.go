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
	routeTLS(t, routes)
	nodes := startProduction(t, dir, routes)

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
		if info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != len(nodes)-1 {
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

// TestProductionRouteTLSRotates walks the rotation docs/operators.md gives (Route
// authentication) on the production overlay's nats.conf: a new CA and certificate from
// hack/deploy/route-tls.sh; then, each step followed by a restart of the three servers one at a
// time (files rewritten in place, as the mounted Secret changes), trust both CAs, present the new
// certificate, trust only the new CA. After every single restart each server routes to the two
// others (no split), and at the end a server presenting the old certificate is refused.
func TestProductionRouteTLSRotates(t *testing.T) {
	dir := t.TempDir()
	routes := filepath.Join(dir, "routes")
	routeTLS(t, routes)
	nodes := startProduction(t, dir, routes)

	old, fresh := filepath.Join(dir, "old"), filepath.Join(dir, "new")
	routeTLS(t, fresh)
	read := func(path string) []byte {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	if err := os.Mkdir(old, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"ca.crt", "tls.crt", "tls.key"} {
		if err := os.WriteFile(filepath.Join(old, f), read(filepath.Join(routes, f)), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, step := range []struct {
		name  string
		files map[string][]byte
	}{
		{"trust both CAs", map[string][]byte{"ca.crt": slices.Concat(read(filepath.Join(old, "ca.crt")), read(filepath.Join(fresh, "ca.crt")))}},
		{"present the new certificate", map[string][]byte{"tls.crt": read(filepath.Join(fresh, "tls.crt")), "tls.key": read(filepath.Join(fresh, "tls.key"))}},
		{"trust only the new CA", map[string][]byte{"ca.crt": read(filepath.Join(fresh, "ca.crt"))}},
	} {
		for f, data := range step.files {
			if err := os.WriteFile(filepath.Join(routes, f), data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		for _, node := range nodes {
			node.Kill()
			if err := node.Start(); err != nil {
				t.Fatalf("%s: %v", step.name, err)
			}
			waitHealthy(t, node)
			for _, n := range nodes {
				waitMesh(t, nodes, n)
			}
		}
	}

	var members []string
	for _, node := range nodes {
		members = append(members, fmt.Sprintf("nats://localhost:%d", node.RoutePort))
	}
	retired := fmt.Sprintf("tls { ca_file: %q, cert_file: %q, key_file: %q, verify: true }",
		filepath.Join(fresh, "ca.crt"), filepath.Join(old, "tls.crt"), filepath.Join(old, "tls.key"))
	refused(t, nodes, members, "retired-certificate", retired)
}

// routeTLS makes a route CA and certificate for loopback into dir with hack/deploy/route-tls.sh,
// as hack/deploy/secrets.sh makes the Secret kubeclip-nats-routes for the StatefulSet's names.
func routeTLS(t *testing.T, dir string) {
	t.Helper()
	script := exec.Command("bash", filepath.Join(root, "hack/deploy/route-tls.sh"), dir, "localhost", embeddednats.DefaultHost)
	if out, err := script.CombinedOutput(); err != nil {
		t.Fatalf("hack/deploy/route-tls.sh: %v\n%s", err, out)
	}
}

// startProduction starts the production overlay's nats.conf as three nats-server processes in
// dir, their route CA, certificate and key read from routes (where the pods mount the Secret),
// the shipped users with test passwords, and waits until each is healthy and routes to the two
// others. Only what a local run must change is replaced: ports, paths and the route hosts.
func startProduction(t *testing.T, dir, routes string) []*natstest.Node {
	t.Helper()
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
			"listen: 0.0.0.0:4222", fmt.Sprintf("listen: %s:%d", embeddednats.DefaultHost, port),
			"http: 0.0.0.0:8222", fmt.Sprintf("http: %s:%d", embeddednats.DefaultHost, monitorPort),
			"pid_file: /var/run/nats/nats.pid", fmt.Sprintf("pid_file: %q", filepath.Join(dir, name+".pid")),
			"store_dir: /data", fmt.Sprintf("store_dir: %q", filepath.Join(dir, name)),
			"listen: 0.0.0.0:6222", fmt.Sprintf("listen: %s:%d", embeddednats.DefaultHost, routePort),
		}
		for j := range n {
			local = append(local, fmt.Sprintf("nats://nats-%d.nats-headless:6222", j), fmt.Sprintf("nats://localhost:%d", ports[3*j+1]))
		}
		// Where the Secret kubeclip-nats-routes is mounted, should the file still read it (the
		// intruders show whether it does).
		conf := strings.ReplaceAll(string(shipped), natstest.RouteTLSMount, routes+"/")
		for k := 0; k < len(local); k += 2 {
			if !strings.Contains(conf, local[k]) {
				t.Fatalf("%s no longer has %q: change this test with it", productionConf, local[k])
			}
			conf = strings.ReplaceAll(conf, local[k], local[k+1])
		}
		nodes = append(nodes, natstest.StartNode(t, dir, natstest.NodeConfig{
			Name: name, Conf: conf, Port: port, RoutePort: routePort, MonitorPort: monitorPort, Env: []string{"POD_NAME=" + name},
		}))
	}
	for _, node := range nodes {
		waitHealthy(t, node)
		waitMesh(t, nodes, node)
	}
	return nodes
}

// waitHealthy waits a minute at most until node is healthy (natstest.Node.WaitHealthy): a server
// that cannot join the others never is.
func waitHealthy(t *testing.T, node *natstest.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if err := node.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
}

// waitMesh waits until node routes to every other of nodes, and to no one else.
func waitMesh(t *testing.T, nodes []*natstest.Node, node *natstest.Node) {
	t.Helper()
	var want []string
	for _, n := range nodes {
		if n != node {
			want = append(want, n.Name)
		}
	}
	slices.Sort(want)
	eventually(t, time.Minute, node.Name+" routes to the others", func() error {
		peers, err := node.Peers(t.Context())
		if err == nil && !slices.Equal(peers, want) {
			err = fmt.Errorf("%s routes to %v, want %v", node.Name, peers, want)
		}
		return err
	})
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
