package natstest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

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
}

// Node is one nats-server process of a Cluster.
type Node struct {
	// Name is the server's name (n1, n2, ...), as JetStream reports a stream's leader.
	Name string
	// Port is its client port, fixed for its life: a restarted node listens where it did.
	Port int

	bin, conf, logPath string
	monitorPort        int

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// StartCluster starts n nats-server processes on free loopback ports, stored in t.TempDir(),
// and returns as soon as each accepts client connections: JetStream may have no meta leader yet,
// as when a fresh cluster and its clients start together (WaitHealthy waits for it). The servers
// are killed by Cleanup; the tail of each one's log is printed when the test failed.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	bin := ServerBinary(t)
	dir := t.TempDir()
	ports := freePorts(t, 3*n) // client, route and monitoring port of each node
	var routes []string
	for i := range n {
		routes = append(routes, fmt.Sprintf("nats-route://%s:%d", embeddednats.DefaultHost, ports[3*i+1]))
	}
	c := &Cluster{}
	for i := range n {
		name := fmt.Sprintf("n%d", i+1)
		node := &Node{
			Name: name, Port: ports[3*i], monitorPort: ports[3*i+2], bin: bin,
			conf: filepath.Join(dir, name+".conf"), logPath: filepath.Join(dir, name+".log"),
		}
		conf := clusterConf(name, node.Port, ports[3*i+1], node.monitorPort, filepath.Join(dir, name), routes)
		if err := os.WriteFile(node.conf, []byte(conf), 0o600); err != nil {
			t.Fatalf("natstest: writing %s: %v", node.conf, err)
		}
		c.Nodes = append(c.Nodes, node)
	}
	t.Cleanup(func() {
		for _, node := range c.Nodes {
			node.Kill()
		}
		if t.Failed() {
			for _, node := range c.Nodes {
				t.Logf("natstest: last lines of %s's log:\n%s", node.Name, tail(node.logPath, 40))
			}
		}
	})
	for _, node := range c.Nodes {
		if err := node.Start(); err != nil {
			t.Fatalf("natstest: %v", err)
		}
	}
	return c
}

// clusterConf is a node's configuration: the production overlay's nats.conf on loopback ports,
// with its memory store, default_max_consumers (embeddednats.DefaultMaxConsumers) and route
// retries, and a file store of ClusterStoreBytes rather than 8 GB.
func clusterConf(name string, port, routePort, monitorPort int, store string, routes []string) string {
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
  routes: [%s]
  connect_retries: 120
}
`, name, embeddednats.DefaultHost, port, embeddednats.DefaultHost, monitorPort, store, ClusterStoreBytes, embeddednats.DefaultMaxConsumers,
		embeddednats.DefaultHost, routePort, strings.Join(routes, ", "))
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

// ServerBinary returns the nats-server binary of the version go.mod pins, built once into the
// kubeclip cache ($KUBECLIP_CACHE, default ~/.cache/kubeclip) and reused by every later test.
func ServerBinary(t testing.TB) string {
	t.Helper()
	version, err := serverVersion()
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	cache := os.Getenv("KUBECLIP_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Fatalf("natstest: finding the cache directory: %v", err)
		}
		cache = filepath.Join(home, ".cache", "kubeclip")
	}
	bin := filepath.Join(cache, "nats-server", version, "nats-server")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	// Built beside its final name and renamed: packages built at the same time never see half
	// a binary.
	tmp := fmt.Sprintf("%s.%d", bin, os.Getpid())
	cmd := exec.Command("go", "build", "-trimpath", "-o", tmp, serverModule)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("natstest: building nats-server %s (go build %s, from inside the kubeclip module): %v\n%s", version, serverModule, err, out)
	}
	if err := os.Rename(tmp, bin); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	return bin
}

// serverVersion is the nats-server version go.mod pins (a test runs inside the module).
func serverVersion() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", serverModule).Output()
	if err != nil {
		return "", fmt.Errorf("finding the pinned %s (go list -m, from inside the kubeclip module): %w", serverModule, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// freePorts returns n distinct loopback ports free at the time of the call.
func freePorts(t testing.TB, n int) []int {
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
