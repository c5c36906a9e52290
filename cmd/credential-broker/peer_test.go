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

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/broker/ca"
	"github.com/kubeclip/kubeclip/pkg/broker/mintclient"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// bindPod publishes what the run-watcher publishes once Kubernetes gave the run's pod its
// address: a Running status naming it (through js, the kubeclip user's). The broker binds the
// run's grants to it; until then they resolve from no address, and a call waits a moment for it
// (--bind-wait).
func bindPod(t *testing.T, js jetstream.JetStream, company, run, podIP string) time.Time {
	t.Helper()
	pub, err := events.NewPublisher(events.PublisherOptions{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	if _, err := pub.Publish(t.Context(), events.RunStatusEvent{RunID: run, CompanyID: company, Phase: events.PhaseRunning, PodName: "pc-" + run, PodIP: podIP}); err != nil {
		t.Fatalf("publishing the status naming the pod's IP: %v", err)
	}
	return at
}

// answer is one call's answer: status, body, and when it came.
type answer struct {
	status int
	body   string
	err    error
	at     time.Time
}

// TestGrantBoundToItsPod runs the bound flow as deployed: the broker on its own NATS user with
// the shipped permissions, the run-watcher's status event naming the run's pod IP on the run
// stream (as the kubeclip user publishes it), and agents calling from loopback addresses that
// stand in for pods (127.0.0.3 the run's pod, 127.0.0.2 another tenant's).
//
// A placeholder minted before the pod was known resolves from no address until the binding: a
// copy of it used from another address in that window waits for the binding and is then refused
// wrong_peer, while its own pod's call made in the same window waits and succeeds once the
// binding arrives. One minted after is born bound. A grant whose pod is never reported is
// refused unbound once --bind-wait is over. Every refusal is counted, and none reached the
// upstream.
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
	const bindWait = 3 * time.Second
	args := append(f.args(), "--nats-url", srv.ClientURL(), "--nats-user", "broker", "--listen", listen, "--ops-addr", opsAddr,
		"--upstream-ca", upstreamCA, "--store-bytes", strconv.Itoa(1<<30), "--bind-wait", bindWait.String())
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
	mint := func(run, lease string) string {
		t.Helper()
		reply, err := minter.Mint(ctx, brokerKey, mintclient.Lease{CompanyID: "company-a", RunID: run, LeaseID: lease}, "ANTHROPIC_API_KEY", realValue)
		if err != nil {
			t.Fatalf("mint: %v", err)
		}
		return reply.Placeholder
	}
	authority, err := ca.Parse(mustRead(t, f.caCert), mustRead(t, f.caKey))
	if err != nil {
		t.Fatal(err)
	}
	// send makes one call from the source address from, on a new connection.
	send := func(from, placeholder string) answer {
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
			return answer{err: fmt.Errorf("a call from %s: %w", from, err), at: time.Now()}
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return answer{status: resp.StatusCode, body: string(body), at: time.Now()}
	}
	// call is send in the background.
	call := func(from, placeholder string) <-chan answer {
		ch := make(chan answer, 1)
		go func() { ch <- send(from, placeholder) }()
		return ch
	}
	oks := 0
	get := func(what string, ch <-chan answer) answer {
		t.Helper()
		a := <-ch
		if a.err != nil {
			t.Fatalf("%s: %v", what, a.err)
		}
		if a.status == http.StatusOK {
			oks++
		}
		return a
	}
	const pod, other = "127.0.0.3", "127.0.0.2"
	ops := &http.Client{Timeout: 2 * time.Second}
	defer ops.CloseIdleConnections()

	// Minted before the pod is known (the dispatcher's run Secret): a copy used from another
	// address, and the pod's own call, both before the run-watcher names the pod.
	before := mint("run-1", "lease-1")
	began := time.Now()
	stolen, own := call(other, before), call(pod, before)
	const pause = 300 * time.Millisecond
	time.Sleep(pause) // both calls are at the broker, waiting for the binding
	select {
	case a := <-stolen:
		t.Fatalf("the call from %s with a placeholder not yet bound was answered before its pod was known: %d %s", other, a.status, a.body)
	case a := <-own:
		t.Fatalf("the pod's call was answered before its pod was known: %d %s", a.status, a.body)
	default:
	}
	published := bindPod(t, js, "company-a", "run-1", pod)
	ownA, stolenA := get("the pod's call", own), get("the stolen placeholder's call", stolen)
	t.Logf("calls_made_before_binding\tpause\t%v\tstatus_published_to_pod_answered\t%v\tstatus_published_to_other_refused\t%v\tpod_call_total\t%v",
		pause, ownA.at.Sub(published).Round(time.Millisecond), stolenA.at.Sub(published).Round(time.Millisecond), ownA.at.Sub(began).Round(time.Millisecond))
	if ownA.status != http.StatusOK {
		t.Errorf("the pod's call made before the binding: %d %s; want 200 once the binding arrived", ownA.status, ownA.body)
	}
	if stolenA.status != http.StatusForbidden || !strings.Contains(stolenA.body, "another pod") {
		t.Errorf("the call from %s with the placeholder copied out before the binding: %d %s; want 403 wrong_peer", other, stolenA.status, stolenA.body)
	}

	// Minted after the status (the plugin's execute): born bound.
	after := mint("run-1", "lease-2")
	if a := get("the pod's call with a placeholder minted after the binding", call(pod, after)); a.status != http.StatusOK {
		t.Errorf("a placeholder minted after its run's status, from its pod: %d %s", a.status, a.body)
	}
	if a := get("another address's call", call(other, after)); a.status != http.StatusForbidden {
		t.Errorf("a placeholder minted after its run's status, from %s: %d %s; want 403 wrong_peer", other, a.status, a.body)
	}

	// A run whose pod is never reported: refused, from its would-be pod too, after the wait.
	never := mint("run-2", "lease-3")
	start := time.Now()
	a := get("a call with a placeholder never bound", call(pod, never))
	t.Logf("never_bound_refused_after\t%v\tbind_wait\t%v", a.at.Sub(start).Round(time.Millisecond), bindWait)
	if a.status != http.StatusServiceUnavailable || !strings.Contains(a.body, "not known to kubeclip yet") || !strings.Contains(a.body, `"type":"error"`) {
		t.Errorf("a placeholder whose pod was never reported: %d %s; want 503 unbound in Anthropic's error shape", a.status, a.body)
	}
	if took := a.at.Sub(start); took < bindWait {
		t.Errorf("refused unbound after %v, before --bind-wait %v", took, bindWait)
	}

	got := scrape(t, ops, opsAddr)
	for reason, least := range map[string]float64{"wrong_peer": 2, "unbound": 1} {
		name := `kubeclip_broker_refusals_total{reason="` + reason + `"}`
		if got[name] < least {
			t.Errorf("%s = %v, want at least %v", name, got[name], least)
		}
	}
	if s := up.seen(); len(s) != oks {
		t.Errorf("the upstream saw %d calls, want %d (those answered 200): a refused call reached it", len(s), oks)
	}
}
