package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/ca"
	"github.com/kubeclip/kubeclip/pkg/broker/mintclient"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// brokerProcessEnv set to 1 makes the test binary the broker (TestMain): its arguments are the
// broker's.
const brokerProcessEnv = "KUBECLIP_TEST_BROKER_PROCESS"

// brokerProcess is a broker replica running as a process of its own (the test binary
// re-executed as the broker), so it can die as a pod does: SIGKILL, no drain, nothing flushed.
type brokerProcess struct {
	cmd    *exec.Cmd
	stderr *lockedBuffer
	waited chan error // Wait's result, once the process is gone
}

// startBrokerProcess starts a replica with args and waits until its /readyz at opsAddr
// answers. The test's cleanup kills it if it still runs.
func startBrokerProcess(t *testing.T, args []string, opsAddr string) *brokerProcess {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &brokerProcess{cmd: exec.Command(self, args...), stderr: &lockedBuffer{}, waited: make(chan error, 1)}
	// The broker's settings come from args alone: no KUBECLIP_ variable of the test's
	// environment reaches it but its user's password (natstest's, for the broker user).
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "KUBECLIP_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Env = append(p.cmd.Env, brokerProcessEnv+"=1", "KUBECLIP_NATS_PASSWORD=pw-broker")
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting a broker process: %v", err)
	}
	go func() { p.waited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.waited //nolint:errcheck // the process is killed (or gone): its error says only that
		if t.Failed() {
			t.Logf("the broker process's log:\n%s", p.stderr.String())
		}
	})
	ops := &http.Client{Timeout: 2 * time.Second}
	defer ops.CloseIdleConnections()
	eventually(t, "the broker process to be ready", 30*time.Second, func() bool {
		select {
		case err := <-p.waited:
			p.waited <- err
			t.Fatalf("the broker process ended before it was ready: %v\n%s", err, p.stderr.String())
		default:
		}
		resp, err := ops.Get("http://" + opsAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

// kill SIGKILLs the replica and waits until it is gone.
func (p *brokerProcess) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("killing the broker process: %v", err)
	}
	select {
	case err := <-p.waited:
		p.waited <- err
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("the broker process ended with %v, want killed by SIGKILL", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the broker process still runs 10 s after SIGKILL")
	}
}

// heldUpstream stands in for api.anthropic.com and holds each streamed call open: it sends the
// first heldEvents events of upstreamStream, then waits until the test releases the stream
// (named by the request's metadata.user_id) or its caller goes away.
type heldUpstream struct {
	addr    string      // where it listens
	opened  chan string // a stream's name, once its first events are flushed
	mu      sync.Mutex
	release map[string]chan struct{}
	gone    map[string]bool // streams whose caller went away before their release
	keys    []string
	stated  tally // usage the upstream stated in the responses it finished
}

// heldEvents are the events a held stream sends before it waits: message_start (the input
// usage) and the text delta; message_delta (the output usage) and message_stop come after.
const heldEvents = 2

func startHeldUpstream(t *testing.T, dir string, streams ...string) (*heldUpstream, string) {
	t.Helper()
	u := &heldUpstream{opened: make(chan string, len(streams)), release: map[string]chan struct{}{}, gone: map[string]bool{}}
	for _, s := range streams {
		u.release[s] = make(chan struct{})
	}
	events := strings.SplitAfter(upstreamStream, "\n\n")
	srv, caFile := serveAsAnthropic(t, dir, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Stream   bool `json:"stream"`
			Metadata struct {
				UserID string `json:"user_id"`
			} `json:"metadata"`
		}
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &req)
		u.mu.Lock()
		u.keys = append(u.keys, r.Header.Get("X-Api-Key"))
		release := u.release[req.Metadata.UserID]
		u.mu.Unlock()
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, upstreamBody)
			u.finished(bodyUsage)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for i, ev := range events {
			if i == heldEvents && release != nil {
				u.opened <- req.Metadata.UserID
				select {
				case <-release:
				case <-r.Context().Done():
					u.mu.Lock()
					u.gone[req.Metadata.UserID] = true
					u.mu.Unlock()
					return
				}
			}
			_, _ = io.WriteString(w, ev)
			w.(http.Flusher).Flush()
		}
		u.finished(streamUsage)
	}))
	// Released before the server closes (cleanups run last first), so no handler outlives it.
	t.Cleanup(func() {
		u.mu.Lock()
		defer u.mu.Unlock()
		for name, ch := range u.release {
			close(ch)
			delete(u.release, name)
		}
	})
	u.addr = srv.Listener.Addr().String()
	return u, caFile
}

func (u *heldUpstream) finished(stated tally) {
	u.mu.Lock()
	defer u.mu.Unlock()
	addUsage(&u.stated, stated)
}

// releaseStream lets a held stream send the rest of its events.
func (u *heldUpstream) releaseStream(name string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if ch, ok := u.release[name]; ok {
		close(ch)
		delete(u.release, name)
	}
}

func (u *heldUpstream) wentAway(name string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.gone[name]
}

func (u *heldUpstream) statedUsage() tally {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.stated
}

func (u *heldUpstream) seen() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]string(nil), u.keys...)
}

// TestBrokerReplicaKilledMidStream: two broker replicas on one NATS, one grant minted once, a
// streamed Messages call open through each, held by the upstream past its first events. Replica
// 1, a process of its own, is SIGKILLed. Its agent's stream is cut with an error (a truncated
// body read as a success would hand the agent half an answer), and the upstream sees the call
// abandoned. Replica 2's stream is untouched: it completes with every event in order and is
// metered once; the same placeholder works through replica 2 afterwards, without a new mint;
// the grant in KUBECLIP_GRANTS is as it was, and replica 2 refused nothing. Replica 1's usage of
// the cut stream is lost with it: usage is taken when a call ends and held in memory until
// published.
func TestBrokerReplicaKilledMidStream(t *testing.T) {
	start := time.Now()
	srv := natstest.StartWithAuth(t, "../../"+natstest.ShippedAuthConf)
	ctx := t.Context()
	_, js := connectAs(t, srv.ClientURL(), "kubeclip", inbox.WorkersPrefix)
	if err := events.EnsureStreams(ctx, js, events.Options{StoreBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	up, upstreamCA := startHeldUpstream(t, t.TempDir(), "stream-1", "stream-2")
	f := writeFiles(t, []string{"api.anthropic.com"}, fmt.Sprintf(
		`{"ANTHROPIC_API_KEY": {"hosts": ["api.anthropic.com"], "headers": ["x-api-key"], "errors": "anthropic", "upstreams": {"api.anthropic.com": %q}}}`,
		up.addr))
	ports := natstest.FreePorts(t, 4)
	addr := func(i int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[i])) }
	listen1, ops1, listen2, ops2 := addr(0), addr(1), addr(2), addr(3)
	args := func(listen, opsAddr string) []string {
		return append(f.args(), "--nats-url", srv.ClientURL(), "--nats-user", "broker", "--listen", listen, "--ops-addr", opsAddr,
			"--upstream-ca", upstreamCA, "--store-bytes", strconv.Itoa(1<<30))
	}
	replica1 := startBrokerProcess(t, args(listen1, ops1), ops1)
	var stderr2 lockedBuffer
	startBroker(t, args(listen2, ops2), ops2, &stderr2)
	ready := time.Since(start)

	// One grant, minted once (by whichever replica's mint service answers).
	client, _ := connectAs(t, srv.ClientURL(), "paperclip", inbox.PaperclipPrefix)
	minter, err := mintclient.New(mintclient.Options{NATS: client, InboxPrefix: inbox.PaperclipPrefix})
	if err != nil {
		t.Fatal(err)
	}
	brokerKey, err := minter.Key(ctx)
	if err != nil {
		t.Fatalf("the broker's key: %v", err)
	}
	reply, err := minter.Mint(ctx, brokerKey, mintclient.Lease{CompanyID: "company-a", RunID: "run-1", LeaseID: "lease-1"}, "ANTHROPIC_API_KEY", realValue)
	if err != nil {
		t.Fatalf("mint: %v", err)
	}
	_, brokerJS := connectAs(t, srv.ClientURL(), "broker", inbox.BrokerPrefix)
	kv, err := brokerJS.KeyValue(ctx, broker.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	bindPod(t, js, "company-a", "run-1", "127.0.0.1") // the run-watcher names the agents' address
	// grant is the one grant's key and its entry (the run's remembered peer is no grant).
	grant := func() (string, jetstream.KeyValueEntry) {
		t.Helper()
		all, err := kv.Keys(ctx)
		var keys []string
		for _, k := range all {
			if !strings.HasPrefix(k, "_b64_=peer.") {
				keys = append(keys, k)
			}
		}
		if err != nil || len(keys) != 1 {
			t.Fatalf("the grants bucket holds %v (%v), want the one grant", all, err)
		}
		e, err := kv.Get(ctx, keys[0])
		if err != nil {
			t.Fatalf("reading the grant: %v", err)
		}
		return keys[0], e
	}
	eventually(t, "the grant bound to the agents' address", 10*time.Second, func() bool {
		_, e := grant()
		return strings.Contains(string(e.Value()), `"peer":"127.0.0.1"`)
	})
	grantKey, grantEntry := grant()
	grantRev := grantEntry.Revision()

	authority, err := ca.Parse(mustRead(t, f.caCert), mustRead(t, f.caKey))
	if err != nil {
		t.Fatal(err)
	}
	// agentOf is an agent whose api.anthropic.com resolves to one replica (its pod's hosts
	// file), over HTTP/1.1 as the Node CLIs call. No client timeout: a cut must show as the
	// connection's error, not as a deadline.
	agentOf := func(listen string) *http.Client {
		c := &http.Client{Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: authority.Pool(), MinVersion: tls.VersionTLS12},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, listen)
			},
		}}
		t.Cleanup(c.CloseIdleConnections)
		return c
	}
	agent1, agent2 := agentOf(listen1), agentOf(listen2)
	callCtx, cancelCalls := context.WithTimeout(ctx, 60*time.Second)
	defer cancelCalls()
	post := func(agent *http.Client, body string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(callCtx, http.MethodPost, "https://api.anthropic.com/v1/messages", strings.NewReader(body))
		req.Header.Set("X-Api-Key", reply.Placeholder)
		req.Header.Set("Content-Type", "application/json")
		return agent.Do(req)
	}
	// openStream opens a held stream through a replica and reads its first events. The
	// grant reaches each replica's cache through its watch: until then the call is refused
	// before it is forwarded, and tried again.
	openStream := func(agent *http.Client, name string) *bufio.Reader {
		t.Helper()
		var resp *http.Response
		eventually(t, name+" to open", 10*time.Second, func() bool {
			var err error
			resp, err = post(agent, `{"model":"claude-test","stream":true,"max_tokens":64,"messages":[],"metadata":{"user_id":"`+name+`"}}`)
			if err != nil {
				t.Fatalf("opening %s: %v", name, err)
			}
			if resp.StatusCode != http.StatusOK {
				resp.Body.Close()
				return false
			}
			return true
		})
		t.Cleanup(func() { resp.Body.Close() })
		select {
		case got := <-up.opened:
			if got != name {
				t.Fatalf("the upstream opened %s, want %s", got, name)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s did not reach the upstream", name)
		}
		r := bufio.NewReader(resp.Body)
		first, err := readEvents(r, heldEvents)
		if want := strings.Join(strings.SplitAfter(upstreamStream, "\n\n")[:heldEvents], ""); err != nil || first != want {
			t.Fatalf("%s's first events: %q (%v), want %q", name, first, err, want)
		}
		return r
	}
	stream1 := openStream(agent1, "stream-1")
	stream2 := openStream(agent2, "stream-2")

	// Replica 2's usage as `kubeclip runs follow` reads it, and its refusals before the kill.
	_, cliJS := connectAs(t, srv.ClientURL(), "cli", inbox.CLIPrefix)
	usage := followUsage(t, cliJS, "company-a", "run-1")
	opsClient := &http.Client{Timeout: 2 * time.Second}
	defer opsClient.CloseIdleConnections()
	refusals := func() map[string]float64 {
		out := map[string]float64{}
		for series, v := range scrape(t, opsClient, ops2) {
			if strings.HasPrefix(series, "kubeclip_broker_refusals_total") {
				out[series] = v
			}
		}
		return out
	}
	refusedBefore := refusals()

	// The kill, while both streams wait on the upstream.
	killed := time.Now()
	replica1.kill(t)
	cut := make(chan error, 1)
	go func() { _, err := io.ReadAll(stream1); cut <- err }()
	var cutErr error
	select {
	case cutErr = <-cut:
	case <-time.After(10 * time.Second):
		t.Fatal("replica 1's agent still reads its stream 10 s after the replica was killed")
	}
	cutAfter := time.Since(killed)
	switch {
	case cutErr == nil:
		t.Fatal("replica 1's agent read its stream to a clean end: a cut stream looked complete")
	case errors.Is(cutErr, context.DeadlineExceeded) || errors.Is(cutErr, context.Canceled):
		t.Fatalf("replica 1's stream ended by the test's deadline (%v), not by the cut", cutErr)
	}
	eventually(t, "the upstream to see replica 1's call abandoned", 10*time.Second, func() bool { return up.wentAway("stream-1") })
	upstreamGoneAfter := time.Since(killed)

	// Replica 2's stream goes on: the rest of its events, in order, and a clean end.
	up.releaseStream("stream-2")
	rest, err := io.ReadAll(stream2)
	if err != nil {
		t.Fatalf("replica 2's stream after replica 1 was killed: %v", err)
	}
	if got, want := string(rest), strings.Join(strings.SplitAfter(upstreamStream, "\n\n")[heldEvents:], ""); got != want {
		t.Fatalf("replica 2's stream ended with %q, want the upstream's remaining events %q", got, want)
	}
	usage.waitSum(t, "replica 2's stream's usage", func() tally { return streamUsage })

	// The same placeholder through replica 2, with no new mint.
	resp, err := post(agent2, `{"model":"claude-test","max_tokens":64,"messages":[]}`)
	if err != nil {
		t.Fatalf("a call through replica 2 after the kill: %v", err)
	}
	after, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(after) != upstreamBody {
		t.Fatalf("a call through replica 2 after the kill: %d %s", resp.StatusCode, after)
	}
	want := streamUsage
	addUsage(&want, bodyUsage)
	usage.waitSum(t, "replica 2's usage", func() tally { return want })
	// Metered once: one more flush adds nothing, and every event is replica 2's one meter.
	time.Sleep(2 * time.Second) // two flushes at the default 1 s (--usage-flush)
	if got := usage.sum(); got != want {
		t.Errorf("the run's usage events add up to %+v, want replica 2's two calls %+v", got, want)
	}
	evs := usage.all()
	for i, e := range evs {
		if e.ev.Meter != evs[0].ev.Meter || e.ev.Seq != uint64(i+1) {
			t.Errorf("usage event %d: meter %s seq %d, want meter %s seq %d", i, e.ev.Meter, e.ev.Seq, evs[0].ev.Meter, i+1)
		}
	}
	if up.statedUsage() != want {
		t.Errorf("the upstream finished responses stating %+v, want %+v (replica 2's two calls)", up.statedUsage(), want)
	}

	// Replica 2's grant cache: the grant is as it was, and replica 2 refused nothing.
	if key, e := grant(); key != grantKey || e.Revision() != grantRev {
		t.Errorf("the grant is %s at revision %d after the kill, was %s at %d", key, e.Revision(), grantKey, grantRev)
	}
	refusedAfter := refusals()
	for series, v := range refusedAfter {
		if v != refusedBefore[series] {
			t.Errorf("replica 2's %s went from %v to %v after replica 1 was killed", series, refusedBefore[series], v)
		}
	}
	for i, k := range up.seen() {
		if k != realValue {
			t.Errorf("the upstream's call %d did not carry the real value", i)
		}
	}
	if logs := stderr2.String() + replica1.stderr.String(); strings.Contains(logs, realValue) || strings.Contains(logs, reply.Placeholder) {
		t.Errorf("a broker's log holds the real value or the placeholder")
	}
	t.Logf("replicas_ready\tcut_after_kill\tupstream_saw_abandon\tupstream_calls\tusage_events\tcalls\tinput\toutput\tcache_read\tcache_write\ttotal")
	t.Logf("%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s", ready.Round(time.Millisecond), cutAfter.Round(time.Microsecond), upstreamGoneAfter.Round(time.Millisecond),
		len(up.seen()), len(evs), want.Calls, want.InputTokens, want.OutputTokens, want.CacheReadTokens, want.CacheWriteTokens, time.Since(start).Round(time.Millisecond))
	t.Logf("replica 1's agent saw: %v", cutErr)
}

// readEvents reads n SSE events (each ending in a blank line) and returns them as read.
func readEvents(r *bufio.Reader, n int) (string, error) {
	var b strings.Builder
	for n > 0 {
		line, err := r.ReadString('\n')
		b.WriteString(line)
		if err != nil {
			return b.String(), err
		}
		if line == "\n" {
			n--
		}
	}
	return b.String(), nil
}
