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

// TestGrantBoundToItsPod runs the bound flow as deployed: the broker on its own NATS user with
// the shipped permissions, the run-watcher's status event naming the run's pod IP on the run
// stream (as the kubeclip user publishes it), and agents calling from loopback addresses that
// stand in for pods (127.0.0.3 the run's pod, 127.0.0.2 another tenant's). A placeholder minted
// before the pod was known is bound once the status is seen, one minted after is born bound,
// and from the other address both are refused with wrong_peer, counted.
func TestGrantBoundToItsPod(t *testing.T) {
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
	startBroker(t, args, opsAddr, io.Discard)

	client, _ := connectAs(t, srv.ClientURL(), "paperclip", inbox.PaperclipPrefix)
	minter, err := mintclient.New(mintclient.Options{NATS: client, InboxPrefix: inbox.PaperclipPrefix})
	if err != nil {
		t.Fatal(err)
	}
	brokerKey, err := minter.Key(ctx)
	if err != nil {
		t.Fatalf("the broker's key: %v", err)
	}
	mint := func(lease string) string {
		t.Helper()
		reply, err := minter.Mint(ctx, brokerKey, mintclient.Lease{CompanyID: "company-a", RunID: "run-1", LeaseID: lease}, "ANTHROPIC_API_KEY", realValue)
		if err != nil {
			t.Fatalf("mint: %v", err)
		}
		return reply.Placeholder
	}
	authority, err := ca.Parse(mustRead(t, f.caCert), mustRead(t, f.caKey))
	if err != nil {
		t.Fatal(err)
	}
	// call makes one call from the source address from, on a new connection; oks counts the
	// calls answered 200.
	oks := 0
	call := func(from, placeholder string) (int, string) {
		t.Helper()
		agent := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: authority.Pool(), MinVersion: tls.VersionTLS12},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
				return d.DialContext(ctx, network, listen) // hostAliases: api.anthropic.com → the broker
			},
		}}
		defer agent.CloseIdleConnections()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "https://api.anthropic.com/v1/messages", strings.NewReader(`{"model":"claude-test","max_tokens":64,"messages":[]}`))
		req.Header.Set("X-Api-Key", placeholder)
		req.Header.Set("Content-Type", "application/json")
		resp, err := agent.Do(req)
		if err != nil {
			t.Fatalf("a call from %s: %v", from, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == http.StatusOK {
			oks++
		}
		return resp.StatusCode, string(body)
	}
	const pod, other = "127.0.0.3", "127.0.0.2"
	wrongPeer := `kubeclip_broker_refusals_total{reason="wrong_peer"}`
	ops := &http.Client{Timeout: 2 * time.Second}
	defer ops.CloseIdleConnections()

	// Minted before the pod is known (the dispatcher's run Secret): unbound, from anywhere.
	before := mint("lease-1")
	if status, body := call(other, before); status != http.StatusOK {
		t.Fatalf("an unbound placeholder from %s: %d %s", other, status, body)
	}

	pub, err := events.NewPublisher(events.PublisherOptions{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(ctx, events.RunStatusEvent{RunID: "run-1", CompanyID: "company-a", Phase: events.PhaseRunning, PodName: "pc-lease-1", PodIP: pod}); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	var status int
	var body string
	eventually(t, "the placeholder minted before the status refused from another address", 10*time.Second, func() bool {
		status, body = call(other, before)
		return status == http.StatusForbidden
	})
	t.Logf("status event → grant bound: refused from %s after %v: %d %s", other, time.Since(began), status, body)
	if !strings.Contains(body, "another pod") {
		t.Errorf("the refusal says %s, want the wrong peer's message", body)
	}
	if status, body := call(pod, before); status != http.StatusOK {
		t.Errorf("the bound placeholder from its pod %s: %d %s", pod, status, body)
	}

	// Minted after the status (the plugin's execute): born bound.
	after := mint("lease-2")
	eventually(t, "the placeholder minted after the status to resolve from its pod", 10*time.Second, func() bool {
		status, _ := call(pod, after)
		return status == http.StatusOK
	})
	if status, body := call(other, after); status != http.StatusForbidden {
		t.Errorf("a placeholder minted after its run's status, from %s: %d %s; want 403 wrong_peer", other, status, body)
	}
	if n := scrape(t, ops, opsAddr)[wrongPeer]; n < 2 {
		t.Errorf("%s = %v, want at least 2", wrongPeer, n)
	}
	if s := up.seen(); len(s) != oks {
		t.Errorf("the upstream saw %d calls, want %d (those answered 200): a refused call reached it", len(s), oks)
	}
}
