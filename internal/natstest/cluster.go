package natstest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/embeddednats"
)

// serverModule is the module whose main package is nats-server: the version go.mod pins is the
// one the cluster runs.
const serverModule = "github.com/nats-io/nats-server/v2"

// ClusterStoreBytes is each node's max_file_store: a cluster's streams take their share of it
// (events.Options.StoreBytes, the workers' --store-bytes), or find no peer with room for them.
const ClusterStoreBytes = 1 << 30

// Cluster is nats-server processes on loopback, each with JetStream, joined by cluster routes,
// as the production overlay runs them. They are processes, not in-process servers, so a test
// can SIGKILL one the way a node or a pod dies, and start it again on its port and store.
type Cluster struct {
	Nodes []*Node
	// Routes is the CA and certificate the nodes route with.
	Routes RouteTLS
}

// Node is one nats-server process of a Cluster.
type Node struct {
	// Name is the server's name (n1, n2, ...), as JetStream reports a stream's leader.
	Name string
	// Port is its client port, fixed for its life: a restarted node listens where it did.
	Port int
	// RoutePort is its cluster port, where other servers route to it.
	RoutePort int

	bin, conf, logPath string
	monitorPort        int
	env                []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// StartCluster starts n nats-server processes on free loopback ports, stored in t.TempDir(),
// and returns as soon as each accepts client connections: JetStream may have no meta leader yet,
// as when a fresh cluster and its clients start together (WaitHealthy waits for it). The routes
// between them are authenticated as the production overlay's are: TLS both ways with a CA of the
// cluster's own (NewRouteTLS), a peer admitted only with a certificate it signed for RouteName.
// The servers are killed by Cleanup; the tail of each one's log is printed when the test failed.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	dir := t.TempDir()
	ports := FreePorts(t, 3*n) // client, route and monitoring port of each node
	tls := NewRouteTLS(t, filepath.Join(dir, "routes"))
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats-route://%s:%d", embeddednats.DefaultHost, ports[3*i+1]))
	}
	c := &Cluster{Routes: tls}
	for i := range n {
		name := fmt.Sprintf("n%d", i+1)
		conf := clusterConf(name, ports[3*i], ports[3*i+1], ports[3*i+2], filepath.Join(dir, name), routes, tls)
		c.Nodes = append(c.Nodes, StartNode(t, dir, NodeConfig{
			Name: name, Conf: conf, Port: ports[3*i], RoutePort: ports[3*i+1], MonitorPort: ports[3*i+2],
		}))
	}
	return c
}

// NodeConfig is one nats-server process: its name, its whole configuration, the client, route
// and monitoring ports that configuration listens on, and environment variables it reads beside
// the test's own.
type NodeConfig struct {
	Name, Conf                   string
	Port, RoutePort, MonitorPort int
	Env                          []string
}

// StartNode writes cfg.Conf into dir and starts a nats-server process with it, as StartCluster
// starts each of its nodes (for a test that runs a configuration of its own: a shipped one, or a
// server that is no member). Cleanup kills it and prints the tail of its log when the test
// failed.
func StartNode(t testing.TB, dir string, cfg NodeConfig) *Node {
	t.Helper()
	node := &Node{
		Name: cfg.Name, Port: cfg.Port, RoutePort: cfg.RoutePort, monitorPort: cfg.MonitorPort, bin: ServerBinary(t), env: cfg.Env,
		conf: filepath.Join(dir, cfg.Name+".conf"), logPath: filepath.Join(dir, cfg.Name+".log"),
	}
	if err := os.WriteFile(node.conf, []byte(cfg.Conf), 0o600); err != nil {
		t.Fatalf("natstest: writing %s: %v", node.conf, err)
	}
	t.Cleanup(func() {
		node.Kill()
		if t.Failed() {
			t.Logf("natstest: last lines of %s's log:\n%s", node.Name, tail(node.logPath, 40))
		}
	})
	if err := node.Start(); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	return node
}

// StartIntruder starts a server named name that is no member of a cluster but routes at its
// route URLs (cluster name cluster) with the route tls block tlsConf, "" for none: no users, no
// JetStream, as a stranger would run it. It returns once its route to every URL was made and
// closed, or once it has a route: whether it was admitted is its Peers' and the members'.
func StartIntruder(t testing.TB, name, cluster string, routes []string, tlsConf string) *Node {
	t.Helper()
	ports := FreePorts(t, 3)
	conf := fmt.Sprintf(`server_name: %s
listen: %s:%d
http: %s:%d
cluster {
  name: %s
  listen: %s:%d
  %s
  routes: [%s]
  connect_retries: 120
}
`, name, embeddednats.DefaultHost, ports[0], embeddednats.DefaultHost, ports[1], cluster, embeddednats.DefaultHost, ports[2], tlsConf, strings.Join(routes, ", "))
	intruder := StartNode(t, t.TempDir(), NodeConfig{Name: name, Conf: conf, Port: ports[0], RoutePort: ports[2], MonitorPort: ports[1]})
	deadline := time.Now().Add(time.Minute)
	for {
		peers, err := intruder.Peers(t.Context())
		if err == nil && (len(peers) > 0 || routesClosed(intruder.Log(), routes)) {
			return intruder
		}
		if time.Now().After(deadline) {
			t.Fatalf("natstest: %s neither routed nor was refused by each of %v in a minute (%v)", name, routes, err)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("natstest: waiting for %s's routes: %v", name, t.Context().Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// routesClosed reports whether log, a server's, shows a route to each of routes (URLs) closed.
func routesClosed(log string, routes []string) bool {
	lines := strings.Split(log, "\n")
	for _, r := range routes {
		host := r[strings.LastIndex(r, "/")+1:]
		if !slices.ContainsFunc(lines, func(l string) bool {
			return strings.Contains(l, "Router connection closed:") && strings.HasSuffix(l, " Host: "+host)
		}) {
			return false
		}
	}
	return true
}

// clusterConf is a node's configuration: the production overlay's nats.conf on loopback ports,
// with its memory store, default_max_consumers (embeddednats.DefaultMaxConsumers), route
// retries and route authentication (tls, verify_and_map, the RouteName user), and a file store
// of ClusterStoreBytes rather than 8 GB.
func clusterConf(name string, port, routePort, monitorPort int, store string, routes []string, tls RouteTLS) string {
	return fmt.Sprintf(`server_name: %s
listen: %s:%d
http: %s:%d
jetstream {
  store_dir: %q
  max_memory_store: 64MB
  max_file_store: %d
  limits { default_max_consumers: %d }
}
cluster {
  name: natstest
  listen: %s:%d
  authorization { user: "CN=%s" }
  tls {
    ca_file: %q
    cert_file: %q
    key_file: %q
    verify_and_map: true
  }
  routes: [%s]
  connect_retries: 120
}
`, name, embeddednats.DefaultHost, port, embeddednats.DefaultHost, monitorPort, store, ClusterStoreBytes, embeddednats.DefaultMaxConsumers,
		embeddednats.DefaultHost, routePort, RouteName, tls.CA, tls.Cert, tls.Key, strings.Join(routes, ", "))
}

// RouteURLs is every node's route URL, as a server routes at the cluster.
func (c *Cluster) RouteURLs() []string {
	var urls []string
	for _, n := range c.Nodes {
		urls = append(urls, fmt.Sprintf("nats-route://%s:%d", embeddednats.DefaultHost, n.RoutePort))
	}
	return urls
}

// URLs is every node's client URL, comma-separated, as --nats-url takes a cluster.
func (c *Cluster) URLs() string {
	var urls []string
	for _, n := range c.Nodes {
		urls = append(urls, n.URL())
	}
	return strings.Join(urls, ",")
}

// Node returns the node named name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Others returns every node but n.
func (c *Cluster) Others(n *Node) []*Node {
	var out []*Node
	for _, o := range c.Nodes {
		if o != n {
			out = append(out, o)
		}
	}
	return out
}

// Connect opens a connection to the whole cluster that reconnects for as long as the test runs,
// as the workers' do. Cleanup closes it.
func (c *Cluster) Connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(c.URLs(), nats.Name(t.Name()), nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatalf("natstest: connecting to %s: %v", c.URLs(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: creating JetStream context: %v", err)
	}
	return nc, js
}

// WaitHealthy waits until every running node reports itself healthy (Node.WaitHealthy), or ctx
// ends.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	for _, n := range c.Nodes {
		if !n.Running() {
			continue
		}
		if err := n.WaitHealthy(ctx); err != nil {
			return err
		}
	}
	return nil
}

// StreamLeader returns the node that leads stream, asking through js.
func (c *Cluster) StreamLeader(ctx context.Context, js jetstream.JetStream, stream string) (*Node, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("reading stream %s: %w", stream, err)
	}
	info := s.CachedInfo()
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return nil, fmt.Errorf("stream %s has no leader", stream)
	}
	n := c.Node(info.Cluster.Leader)
	if n == nil {
		return nil, fmt.Errorf("stream %s is led by %q, not a node of the cluster", stream, info.Cluster.Leader)
	}
	return n, nil
}

// URL is the node's client URL; it does not change across restarts.
func (n *Node) URL() string { return fmt.Sprintf("nats://%s:%d", embeddednats.DefaultHost, n.Port) }

// Running reports whether the node's process is up.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil
}

// Start starts the node's process on its ports and store and waits until it accepts client
// connections (not until JetStream is healthy: see WaitHealthy). It is a no-op while it runs.
func (n *Node) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return nil
	}
	logFile, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(n.bin, "-c", n.conf)
	cmd.Env = append(os.Environ(), n.env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("starting nats-server %s: %w", n.Name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(exited)
	}()
	n.cmd, n.exited = cmd, exited
	deadline := time.Now().Add(readyTimeout)
	for {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("%s:%d", embeddednats.DefaultHost, n.Port), time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-exited:
			n.cmd = nil
			return fmt.Errorf("nats-server %s exited at start:\n%s", n.Name, tail(n.logPath, 20))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nats-server %s not accepting connections after %s", n.Name, readyTimeout)
		}
	}
}

// Kill sends SIGKILL, as a node that dies would end, and waits until the process is gone. It is
// a no-op when the node is not running.
func (n *Node) Kill() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGKILL)
	<-n.exited
	n.cmd = nil
}

// WaitHealthy waits until the node's /healthz answers ok: connected to the cluster, JetStream
// up with a meta leader and its streams and consumers current.
func (n *Node) WaitHealthy(ctx context.Context) error {
	url := fmt.Sprintf("http://%s:%d/healthz", embeddednats.DefaultHost, n.monitorPort)
	var last string
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nats-server %s not healthy (last: %s): %w", n.Name, last, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Peers returns the names of the servers the node has a route to, each once and sorted, from
// its /routez.
func (n *Node) Peers(ctx context.Context) ([]string, error) {
	url := fmt.Sprintf("http://%s:%d/routez", embeddednats.DefaultHost, n.monitorPort)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("reading %s's routes: %w", n.Name, err)
	}
	defer resp.Body.Close()
	var routez server.Routez
	if err := json.NewDecoder(resp.Body).Decode(&routez); err != nil {
		return nil, fmt.Errorf("decoding %s's routes: %w", n.Name, err)
	}
	var peers []string
	for _, r := range routez.Routes {
		if !slices.Contains(peers, r.RemoteName) {
			peers = append(peers, r.RemoteName)
		}
	}
	slices.Sort(peers)
	return peers, nil
}

// Log returns what the node's processes have logged so far.
func (n *Node) Log() string {
	data, err := os.ReadFile(n.logPath)
	if err != nil {
		return err.Error()
	}
	return string(data)
}

// ServerBinary returns the nats-server binary of the version go.mod pins, built once into the
// kubeclip cache ($KUBECLIP_CACHE, default ~/.cache/kubeclip) and reused by every later test.
func ServerBinary(t testing.TB) string {
	t.Helper()
	bin, err := BuildServerBinary()
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	return bin
}

// BuildServerBinary is ServerBinary for a caller with no test at hand (a suite's TestMain).
func BuildServerBinary() (string, error) {
	version, err := serverVersion()
	if err != nil {
		return "", err
	}
	cache := os.Getenv("KUBECLIP_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("finding the cache directory: %w", err)
		}
		cache = filepath.Join(home, ".cache", "kubeclip")
	}
	bin := filepath.Join(cache, "nats-server", version, "nats-server")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return "", err
	}
	// Built beside its final name and renamed: packages built at the same time never see half
	// a binary.
	tmp := fmt.Sprintf("%s.%d", bin, os.Getpid())
	cmd := exec.Command("go", "build", "-trimpath", "-o", tmp, serverModule)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building nats-server %s (go build %s, from inside the kubeclip module): %w\n%s", version, serverModule, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		return "", err
	}
	return bin, nil
}

// serverVersion is the nats-server version go.mod pins (a test runs inside the module).
func serverVersion() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", serverModule).Output()
	if err != nil {
		return "", fmt.Errorf("finding the pinned %s (go list -m, from inside the kubeclip module): %w", serverModule, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// FreePorts returns n distinct loopback ports free at the time of the call.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", embeddednats.DefaultHost+":0")
		if err != nil {
			t.Fatalf("natstest: finding a free port: %v", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// tail returns the last n lines of the file at path.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
