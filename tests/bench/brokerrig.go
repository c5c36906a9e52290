package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/ca"
	"github.com/kubeclip/kubeclip/pkg/broker/mintclient"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// The rig of phase (p): a nats-server in the bench process (the grants' KV bucket and the run
// stream the broker watches), a local TLS upstream standing in for api.anthropic.com in the
// bench process, and the real credential-broker binary as a process of its own (so its RSS is
// the broker's alone), bound to that upstream by the operator override of the host's address
// (bindings' "upstreams"), as tests/paperclip and cmd/credential-broker's own test wire it.

const (
	// brokerHost is the bound host the calls are made to, by its name, on both routes.
	brokerHost = "api.anthropic.com"
	// brokerKey is the brokered key; brokerValue its real value, which the upstream must see on
	// both routes (the direct route sends it itself, as a CLI without the broker would).
	brokerKey   = "ANTHROPIC_API_KEY"
	brokerValue = "sk-ant-api03-BENCHVALUE-0123456789abcdefghijklmnopqrstuvwxyz"
	// brokerBinary is the broker's binary in --bin.
	brokerBinary = "credential-broker"
	// brokerStoreBytes is --store-bytes of both the streams and the broker (the grants bucket's
	// share of it sets the grants a company may hold).
	brokerStoreBytes = 1 << 30
	// brokerStartTimeout bounds the broker's start until /readyz answers 200.
	brokerStartTimeout = 30 * time.Second
	// brokerStopTimeout bounds its drain after SIGTERM (its proxy drains calls for 30 s at most,
	// and the phase ends every stream before it stops the broker).
	brokerStopTimeout = 40 * time.Second
)

// The upstream's answers: a Messages JSON body, and a Messages stream whose first event
// (message_start) is written and flushed at once. Both state usage, so the broker's meter has
// what it reads in production.
const (
	upstreamJSON = `{"id":"msg_b","type":"message","role":"assistant","model":"claude-bench","content":[{"type":"text","text":"hi"}],` +
		`"stop_reason":"end_turn","usage":{"input_tokens":31,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":9}}`
	upstreamFirstEvent = "event: message_start\n" +
		`data: {"type":"message_start","message":{"id":"msg_s","type":"message","role":"assistant","model":"claude-bench","content":[],"usage":{"input_tokens":25,"cache_read_input_tokens":0,"cache_creation_input_tokens":0,"output_tokens":1}}}` + "\n\n"
	upstreamRestEvents = "event: content_block_delta\n" +
		`data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hello"}}` + "\n\n" +
		"event: message_delta\n" +
		`data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":17}}` + "\n\n" +
		"event: message_stop\n" +
		`data: {"type":"message_stop"}` + "\n\n"
	upstreamStream = upstreamFirstEvent + upstreamRestEvents
)

// The requests: a small Messages call as a CLI sends it; the streamed one asks for SSE; the
// held one tells the upstream (by its metadata.user_id, a field the API has) to keep the stream
// open after its first event until the phase releases it.
const (
	callBody   = `{"model":"claude-bench","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}`
	streamBody = `{"model":"claude-bench","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}`
	holdBody   = `{"model":"claude-bench","max_tokens":64,"stream":true,"metadata":{"user_id":"bench-hold"},"messages":[{"role":"user","content":"hi"}]}`
	holdMarker = `"user_id":"bench-hold"`
)

// brokerUpstream is the local TLS upstream: a certificate for api.anthropic.com from a CA of its
// own (the broker trusts it through --upstream-ca, the direct route through its pool), HTTP/2
// and HTTP/1.1 as the real host offers them.
type brokerUpstream struct {
	srv  *httptest.Server
	pool *ca.CA
	// release ends every held stream.
	release     chan struct{}
	releaseOnce sync.Once

	mu sync.Mutex
	// wrongKeys counts requests whose x-api-key was not the real value: the broker did not
	// swap (or the direct route sent something else). A functional failure.
	wrongKeys int
	calls     int
}

func startBrokerUpstream() (*brokerUpstream, error) {
	authority, err := ca.Generate(ca.Options{Hosts: []string{brokerHost}})
	if err != nil {
		return nil, fmt.Errorf("making the upstream's CA: %w", err)
	}
	issuer, err := ca.NewIssuer(ca.IssuerOptions{CA: authority, Hosts: []string{brokerHost}})
	if err != nil {
		return nil, fmt.Errorf("making the upstream's certificate: %w", err)
	}
	u := &brokerUpstream{pool: authority, release: make(chan struct{})}
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(u.serve))
	u.srv.EnableHTTP2 = true
	u.srv.TLS = &tls.Config{GetCertificate: issuer.GetCertificate, MinVersion: tls.VersionTLS12}
	u.srv.StartTLS()
	return u, nil
}

func (u *brokerUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	u.mu.Lock()
	u.calls++
	if r.Header.Get("X-Api-Key") != brokerValue {
		u.wrongKeys++
	}
	u.mu.Unlock()
	if err != nil || r.Method != http.MethodPost || r.URL.Path != "/v1/messages" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	if !bytes.Contains(body, []byte(`"stream":true`)) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, upstreamJSON)
		return
	}
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, upstreamFirstEvent)
	flusher.Flush()
	if bytes.Contains(body, []byte(holdMarker)) {
		select {
		case <-u.release:
		case <-r.Context().Done():
			return
		}
	}
	_, _ = io.WriteString(w, upstreamRestEvents)
	flusher.Flush()
}

// releaseStreams ends every held stream, now and from now on.
func (u *brokerUpstream) releaseStreams() { u.releaseOnce.Do(func() { close(u.release) }) }

func (u *brokerUpstream) counts() (calls, wrongKeys int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.calls, u.wrongKeys
}

func (u *brokerUpstream) close() {
	u.releaseStreams()
	u.srv.Close()
}

// brokerRig is everything phase (p) runs against.
type brokerRig struct {
	dir      string
	nats     *pipelinetest.NATS
	nc       *nats.Conn
	upstream *brokerUpstream
	// installation is the installation CA the broker's leaves come from (the pods trust it).
	installation *ca.CA
	cmd          *exec.Cmd
	exited       chan error // the broker process's Wait, once
	pid          int
	listen       string // the broker proxy's address (hostAliases point api.anthropic.com here)
	opsAddr      string // its /readyz and /metrics
	logPath      string
	placeholder  string
}

// startBrokerRig starts the rig; bin is the broker's binary.
func startBrokerRig(ctx context.Context, bin string) (r *brokerRig, err error) {
	r = &brokerRig{exited: make(chan error, 1)}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.close())
			r = nil
		}
	}()
	if r.dir, err = os.MkdirTemp("", "kubeclip-bench-broker-"); err != nil {
		return r, fmt.Errorf("making the broker's directory: %w", err)
	}
	if r.nats, err = pipelinetest.StartNATS(filepath.Join(r.dir, "nats")); err != nil {
		return r, err
	}
	// The streams the broker watches (the run stream: released leases) exist before it starts,
	// as the other workers create them in an installation.
	if r.nc, err = nats.Connect(r.nats.URL(), nats.Name("kubeclip-bench-broker"), nats.CustomInboxPrefix(inbox.PaperclipPrefix)); err != nil {
		return r, fmt.Errorf("connecting to the broker's NATS: %w", err)
	}
	js, err := jetstream.New(r.nc)
	if err != nil {
		return r, fmt.Errorf("opening JetStream: %w", err)
	}
	if err := events.EnsureStreams(ctx, js, events.Options{StoreBytes: brokerStoreBytes}); err != nil {
		return r, fmt.Errorf("creating the streams: %w", err)
	}
	if r.upstream, err = startBrokerUpstream(); err != nil {
		return r, err
	}
	args, err := r.writeFiles()
	if err != nil {
		return r, err
	}
	ports, err := freePorts(2)
	if err != nil {
		return r, err
	}
	r.listen = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	r.opsAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	args = append(args, "--nats-url", r.nats.URL(), "--listen", r.listen, "--ops-addr", r.opsAddr,
		"--store-bytes", strconv.Itoa(brokerStoreBytes), "--log-level", "info")
	r.logPath = filepath.Join(r.dir, "broker.log")
	logFile, err := os.Create(r.logPath)
	if err != nil {
		return r, fmt.Errorf("creating the broker's log: %w", err)
	}
	defer logFile.Close() // the process has its own descriptor
	r.cmd = exec.Command(bin, args...)
	r.cmd.Env = brokerEnv()
	r.cmd.Stdout, r.cmd.Stderr = logFile, logFile
	if err := r.cmd.Start(); err != nil {
		r.cmd = nil
		return r, fmt.Errorf("starting %s: %w", bin, err)
	}
	r.pid = r.cmd.Process.Pid
	go func() { r.exited <- r.cmd.Wait() }()
	if err := r.waitReady(ctx); err != nil {
		return r, err
	}
	if r.placeholder, err = r.mint(ctx); err != nil {
		return r, err
	}
	return r, nil
}

// writeFiles writes what the broker reads (installation CA, sealing key, bindings, the
// upstream's CA) and returns the flags naming them.
func (r *brokerRig) writeFiles() ([]string, error) {
	var err error
	if r.installation, err = ca.Generate(ca.Options{Hosts: []string{brokerHost}}); err != nil {
		return nil, fmt.Errorf("making the installation CA: %w", err)
	}
	keyPEM, err := r.installation.KeyPEM()
	if err != nil {
		return nil, err
	}
	sealing := make([]byte, broker.SealingKeyLen)
	if _, err := rand.Read(sealing); err != nil {
		return nil, fmt.Errorf("making the sealing key: %w", err)
	}
	bindings, err := json.Marshal(map[string]any{brokerKey: map[string]any{
		"hosts": []string{brokerHost}, "headers": []string{"x-api-key", "authorization"}, "errors": "anthropic",
		"upstreams": map[string]string{brokerHost: r.upstream.srv.Listener.Addr().String()},
	}})
	if err != nil {
		return nil, err
	}
	files := []struct {
		flag, name string
		data       []byte
	}{
		{"--ca-cert", "ca.crt", r.installation.CertPEM()},
		{"--ca-key", "ca.key", keyPEM},
		{"--sealing-key", "sealing.key", sealing},
		{"--bindings", "bindings.json", bindings},
		{"--upstream-ca", "upstream-ca.crt", r.upstream.pool.CertPEM()},
	}
	var args []string
	for _, f := range files {
		path := filepath.Join(r.dir, f.name)
		if err := os.WriteFile(path, f.data, 0o600); err != nil {
			return nil, fmt.Errorf("writing the broker's %s: %w", f.name, err)
		}
		args = append(args, f.flag, path)
	}
	return args, nil
}

// brokerEnv is the bench's environment without kubeclip's settings: the broker process runs
// with its flags and defaults only.
func brokerEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KUBECLIP_") {
			env = append(env, kv)
		}
	}
	return env
}

// waitReady polls /readyz until it answers 200, the process exits or brokerStartTimeout passes.
func (r *brokerRig) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, brokerStartTimeout)
	defer cancel()
	c := &http.Client{Timeout: time.Second}
	defer c.CloseIdleConnections()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.opsAddr+"/readyz", nil)
		if resp, err := c.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case err := <-r.exited:
			r.exited <- err
			return fmt.Errorf("the broker exited before it was ready (%w); its log: %s", err, r.logPath)
		case <-ctx.Done():
			return fmt.Errorf("the broker was not ready within %s; its log: %s", brokerStartTimeout, r.logPath)
		case <-tick.C:
		}
	}
}

// mint asks the broker for a placeholder as the plugin does: its key, then the real value
// sealed to it, core NATS requests from the plugin's inbox prefix (pkg/broker/mintclient).
func (r *brokerRig) mint(ctx context.Context) (string, error) {
	minter, err := mintclient.New(mintclient.Options{NATS: r.nc, InboxPrefix: inbox.PaperclipPrefix})
	if err != nil {
		return "", err
	}
	key, err := minter.Key(ctx)
	if err != nil {
		return "", fmt.Errorf("asking the broker's key: %w", err)
	}
	reply, err := minter.Mint(ctx, key, mintclient.Lease{CompanyID: "bench-broker", RunID: "run-bench", LeaseID: "lease-bench"}, brokerKey, brokerValue)
	if err != nil {
		return "", fmt.Errorf("minting a placeholder: %w", err)
	}
	if !broker.LooksLikePlaceholder(reply.Placeholder) {
		return "", errors.New("the mint reply holds no placeholder")
	}
	// The run-watcher's status naming the run's pod, here the loopback address the bench calls
	// from: the broker binds the grant to it (an unbound grant resolves from no address). The
	// warm-up's first call waits for the binding.
	js, err := jetstream.New(r.nc)
	if err != nil {
		return "", err
	}
	pub, err := events.NewPublisher(events.PublisherOptions{JS: js})
	if err != nil {
		return "", err
	}
	if _, err := pub.Publish(ctx, events.RunStatusEvent{RunID: "run-bench", CompanyID: "bench-broker", Phase: events.PhaseRunning, PodName: "pc-bench", PodIP: "127.0.0.1"}); err != nil {
		return "", fmt.Errorf("publishing the status naming the bench's pod address: %w", err)
	}
	return reply.Placeholder, nil
}

// client is an HTTP/1.1 client with keep-alive connections, as a CLI's: via the broker, it
// dials the broker for api.anthropic.com (the pod's hostAliases) and trusts the installation
// CA; direct, it dials the upstream and trusts the upstream's CA. Both verify the certificate
// for api.anthropic.com.
func (r *brokerRig) client(viaBroker bool, idle int) *http.Client {
	addr, roots := r.upstream.srv.Listener.Addr().String(), r.upstream.pool.Pool()
	if viaBroker {
		addr, roots = r.listen, r.installation.Pool()
	}
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
		TLSClientConfig:     &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		MaxIdleConns:        idle,
		MaxIdleConnsPerHost: idle,
		IdleConnTimeout:     5 * time.Minute,
		DisableCompression:  true,
	}}
}

// request is a Messages call with the route's credential: the placeholder via the broker,
// the real value direct.
func (r *brokerRig) request(ctx context.Context, viaBroker bool, body string) *http.Request {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+brokerHost+"/v1/messages", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Anthropic-Version", "2023-06-01")
	if viaBroker {
		req.Header.Set("X-Api-Key", r.placeholder)
	} else {
		req.Header.Set("X-Api-Key", brokerValue)
	}
	return req
}

// brokerMemory is one reading of the broker process's memory.
type brokerMemory struct {
	rss, heapInuse, stacks int64
	// liveHeap is the heap the last collection left live: its next goal over 1 + GOGC/100
	// (heapInuse counts the garbage not yet collected too).
	liveHeap   int64
	goroutines int
}

// memory reads the broker's RSS from /proc and its heap, stacks and goroutines from /metrics.
func (r *brokerRig) memory(ctx context.Context) (brokerMemory, error) {
	var m brokerMemory
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", r.pid))
	if err != nil {
		return m, fmt.Errorf("reading the broker's RSS: %w", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				return m, fmt.Errorf("parsing the broker's VmRSS %q: %w", rest, err)
			}
			m.rss = kib << 10
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+r.opsAddr+"/metrics", nil)
	c := &http.Client{}
	defer c.CloseIdleConnections()
	resp, err := c.Do(req)
	if err != nil {
		return m, fmt.Errorf("scraping the broker's metrics: %w", err)
	}
	defer resp.Body.Close()
	values := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		values[name] = v
	}
	if err := sc.Err(); err != nil {
		return m, fmt.Errorf("reading the broker's metrics: %w", err)
	}
	for _, name := range []string{"go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes", "go_memstats_next_gc_bytes", "go_gc_gogc_percent", "go_goroutines"} {
		if _, ok := values[name]; !ok {
			return m, fmt.Errorf("the broker's metrics lack %s", name)
		}
	}
	if m.rss == 0 {
		return m, errors.New("the broker's /proc status has no VmRSS")
	}
	m.heapInuse, m.stacks = int64(values["go_memstats_heap_inuse_bytes"]), int64(values["go_memstats_stack_inuse_bytes"])
	m.liveHeap = int64(values["go_memstats_next_gc_bytes"] / (1 + values["go_gc_gogc_percent"]/100))
	m.goroutines = int(values["go_goroutines"])
	return m, nil
}

// close ends the held streams, stops the broker (SIGTERM, then SIGKILL after
// brokerStopTimeout), the upstream and NATS, and removes the directory unless the broker failed
// (its log is kept then).
func (r *brokerRig) close() error {
	var errs []error
	if r.upstream != nil {
		r.upstream.releaseStreams()
	}
	if r.cmd != nil {
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-r.exited:
			if err != nil {
				errs = append(errs, fmt.Errorf("the broker exited with %w; its log: %s", err, r.logPath))
			}
		case <-time.After(brokerStopTimeout):
			_ = r.cmd.Process.Kill()
			<-r.exited //nolint:errcheck // "signal: killed", by the Kill above; the error below says why
			errs = append(errs, fmt.Errorf("the broker did not stop within %s of SIGTERM; its log: %s", brokerStopTimeout, r.logPath))
		}
	}
	if r.upstream != nil {
		r.upstream.close()
	}
	if r.nc != nil {
		r.nc.Close()
	}
	if r.nats != nil {
		r.nats.Stop()
	}
	if r.dir != "" && len(errs) == 0 {
		errs = append(errs, os.RemoveAll(r.dir))
	}
	return errors.Join(errs...)
}

// freePorts finds n free loopback ports (listened on, then closed).
func freePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
		defer l.Close()
	}
	return ports, nil
}

// brokerBinaryPath is the broker in --bin (make bench builds it there), else a fresh build
// into a temporary directory (returned for removal).
func (b *bench) brokerBinaryPath(ctx context.Context) (path, tmp string, err error) {
	if dir, err := filepath.Abs(b.s.bin); err == nil {
		path = filepath.Join(dir, brokerBinary)
		if _, err := os.Stat(path); err == nil {
			return path, "", nil
		}
	}
	b.logf("(p): no %s in %s: building it", brokerBinary, b.s.bin)
	if tmp, err = os.MkdirTemp("", "kubeclip-bench-bin-"); err != nil {
		return "", "", err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", tmp+"/", "./cmd/"+brokerBinary)
	cmd.Stdout, cmd.Stderr = b.progress, b.progress
	if err := cmd.Run(); err != nil {
		return "", tmp, fmt.Errorf("building %s (run the bench from the module's root, or make build first): %w", brokerBinary, err)
	}
	return filepath.Join(tmp, brokerBinary), tmp, nil
}
