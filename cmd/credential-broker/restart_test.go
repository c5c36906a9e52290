package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/broker/ca"
	"github.com/kubeclip/kubeclip/pkg/broker/mintclient"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// startBroker runs the broker as its binary does (run with args, the broker user's password in
// its environment), logging to stderr, and waits until its /readyz at opsAddr answers. stop
// ends it and waits for it to return (the test's cleanup stops it too, at most once).
func startBroker(t *testing.T, args []string, opsAddr string, stderr io.Writer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		env := map[string]string{"KUBECLIP_NATS_PASSWORD": "pw-broker"} // natstest's password of the broker user
		done <- run(ctx, args, func(k string) (string, bool) { v, ok := env[k]; return v, ok }, io.Discard, stderr)
	}()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("the broker returned %v", err)
			}
		case <-time.After(40 * time.Second):
			t.Errorf("the broker did not stop 40 s after its context ended")
		}
	}
	t.Cleanup(stop)
	opsClient := &http.Client{Timeout: 2 * time.Second}
	defer opsClient.CloseIdleConnections()
	eventually(t, "the broker to be ready", 20*time.Second, func() bool {
		resp, err := opsClient.Get("http://" + opsAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return stop
}

// TestBrokerDownAndRestarted: with the broker down, an agent's call fails at once (its
// connection is refused: nothing waits, and nothing reaches the upstream), and the placeholder
// minted before works again once the broker is back, the grant being in KUBECLIP_GRANTS and
// not in the replica.
func TestBrokerDownAndRestarted(t *testing.T) {
	srv := natstest.StartWithAuth(t, "../../"+natstest.ShippedAuthConf)
	ctx := t.Context()
	_, js := connectAs(t, srv.ClientURL(), "kubeclip", inbox.WorkersPrefix)
	if err := events.EnsureStreams(ctx, js, events.Options{StoreBytes: 1 << 30}); err != nil {
		t.Fatal(err)
	}
	up, upstreamCA := startAnthropicUpstream(t, t.TempDir())
	f := writeFiles(t, []string{"api.anthropic.com"}, fmt.Sprintf(
		`{"ANTHROPIC_API_KEY": {"hosts": ["api.anthropic.com"], "headers": ["x-api-key"], "errors": "anthropic", "upstreams": {"api.anthropic.com": %q}}}`,
		up.srv.Listener.Addr().String()))
	ports := natstest.FreePorts(t, 2)
	listen, opsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])), net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	args := append(f.args(), "--nats-url", srv.ClientURL(), "--nats-user", "broker", "--listen", listen, "--ops-addr", opsAddr,
		"--upstream-ca", upstreamCA, "--store-bytes", strconv.Itoa(1<<30))
	stop := startBroker(t, args, opsAddr, io.Discard)

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
	bindPod(t, js, "company-a", "run-1", "127.0.0.1") // the run-watcher names the agent's address
	authority, err := ca.Parse(mustRead(t, f.caCert), mustRead(t, f.caKey))
	if err != nil {
		t.Fatal(err)
	}
	// A new connection per call, as a CLI started again would make.
	call := func() (int, error) {
		agent := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: authority.Pool(), MinVersion: tls.VersionTLS12},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, network, listen) // hostAliases: api.anthropic.com → the broker
			},
		}}
		defer agent.CloseIdleConnections()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://api.anthropic.com/v1/messages", strings.NewReader(`{"model":"claude-test","max_tokens":64,"messages":[]}`))
		req.Header.Set("X-Api-Key", reply.Placeholder)
		req.Header.Set("Content-Type", "application/json")
		resp, err := agent.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		_, err = io.ReadAll(resp.Body)
		return resp.StatusCode, err
	}
	if status, err := call(); status != http.StatusOK {
		t.Fatalf("a call before the restart: %d %v", status, err)
	}

	stop()
	seen := len(up.seen())
	began := time.Now()
	status, err := call()
	took := time.Since(began)
	if err == nil {
		t.Fatalf("a call with the broker down was answered %d", status)
	}
	t.Logf("broker down: the call failed after %v: %v", took, err)
	if took > 5*time.Second { // far below the client's 10 s timeout, far above a refused dial
		t.Errorf("a call with the broker down failed after %v, want at once", took)
	}
	if n := len(up.seen()) - seen; n != 0 {
		t.Errorf("the upstream got %d calls while the broker was down", n)
	}

	startBroker(t, args, opsAddr, io.Discard)
	status, err = call()
	if status != http.StatusOK {
		t.Fatalf("the placeholder minted before the restart: %d %v, want 200", status, err)
	}
	if s := up.seen(); len(s) != seen+1 || s[len(s)-1] != realValue {
		t.Errorf("after the restart the upstream saw %d calls (want %d), the last with the real value: %v", len(s), seen+1, len(s) > 0 && s[len(s)-1] == realValue)
	}
}
