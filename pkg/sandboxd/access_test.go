package sandboxd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// TestTLSPinning: a client pinned to another lease's key fails the handshake; the request (and
// the command in it) never reaches the server.
func TestTLSPinning(t *testing.T) {
	h := startServer(t, nil)
	other := execspec.DeriveSeed([]byte("test master key"), "tenant-test", "another-run")
	c := newClient(t, sandboxd.ClientOptions{Dial: sandboxd.DialTCP(h.addr), TLS: sandboxd.ClientTLSConfig(other), Token: sandboxd.ClientToken(testSeed)})
	marker := newID()
	_, err := c.Start(t.Context(), sandboxd.Spec{ID: marker, Command: "true"})
	if !errors.Is(err, sandboxd.ErrServerKeyMismatch) {
		t.Fatalf("start through a client pinned to another key: %v, want ErrServerKeyMismatch", err)
	}
	if _, err := h.unix.Output(t.Context(), marker, 1); !errors.Is(err, sandboxd.ErrNotFound) {
		t.Errorf("the exec exists after the failed handshake: %v", err)
	}
	if info, err := h.unix.Info(t.Context()); err != nil || info.Execs != 0 {
		t.Errorf("info %+v, %v: want no exec", info, err)
	}
}

func TestWrongToken(t *testing.T) {
	h := startServer(t, nil)
	for _, token := range []string{"", sandboxd.ClientToken(execspec.DeriveSeed([]byte("x"), "a", "b"))} {
		c := newClient(t, sandboxd.ClientOptions{Dial: sandboxd.DialTCP(h.addr), TLS: sandboxd.ClientTLSConfig(testSeed), Token: token})
		_, err := c.Info(t.Context())
		var ae *sandboxd.APIError
		if !errors.Is(err, sandboxd.ErrUnauthorized) || !errors.As(err, &ae) || ae.Status != http.StatusUnauthorized {
			t.Errorf("token %q: %v, want a 401 ErrUnauthorized", token, err)
		}
	}
}

// TestUnixSocket: the socket serves without TLS and without a token.
func TestUnixSocket(t *testing.T) {
	h := startServer(t, nil)
	got := run(t, h.unix, sandboxd.Spec{Command: "echo", Args: []string{"over the socket"}}, nil)
	if diff := cmp.Diff(result{Stdout: "over the socket\n", ExitCode: intp(0)}, got); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	fi, err := os.Stat(h.socket)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket mode %v (%v), want 0600", fi.Mode(), err)
	}
}

// TestProxy: the HTTP API through Proxy over an arbitrary byte stream, as through the Kubernetes
// exec API; the proxy ends when the client closes its connection.
func TestProxy(t *testing.T) {
	h := startServer(t, nil)
	proxied := make(chan error, 4)
	c := newClient(t, sandboxd.ClientOptions{Dial: func(ctx context.Context) (net.Conn, error) {
		client, remote := net.Pipe() // remote plays the exec's stdin and stdout
		// The stream outlives the dial: the proxy ends when the client closes it.
		go func() {
			proxied <- sandboxd.Proxy(context.WithoutCancel(ctx), h.socket, remote, remote)
			_ = remote.Close()
		}()
		return client, nil
	}})
	got := run(t, c, sandboxd.Spec{Command: "sh", Args: sh("cat; echo done >&2"), Stdin: true}, []byte("through the proxy"))
	if diff := cmp.Diff(result{Stdout: "through the proxy", Stderr: "done\n", ExitCode: intp(0)}, got); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	c.Close()
	if err := <-proxied; err != nil {
		t.Errorf("Proxy: %v", err)
	}
}

// TestStrictRequests: bodies are decoded strictly and bounded; queries are checked.
func TestStrictRequests(t *testing.T) {
	h := startServer(t, nil)
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return sandboxd.DialUnix(h.socket)(ctx)
	}}}
	t.Cleanup(hc.CloseIdleConnections)
	exited := newID()
	run(t, h.unix, sandboxd.Spec{ID: exited, Command: "true"}, nil)
	for _, tc := range []struct {
		name, method, path, body string
		wantStatus               int
		wantCode                 string
	}{
		{"unknown field", "POST", "/v1/execs", `{"id":"a","command":"true","shell":true}`, 400, sandboxd.CodeInvalidRequest},
		{"two objects", "POST", "/v1/execs", `{"id":"a","command":"true"}{"id":"b","command":"true"}`, 400, sandboxd.CodeInvalidRequest},
		{"not JSON", "POST", "/v1/execs", `id=a`, 400, sandboxd.CodeInvalidRequest},
		{"bad id", "POST", "/v1/execs", `{"id":"../etc","command":"true"}`, 400, sandboxd.CodeInvalidRequest},
		{"id too long", "POST", "/v1/execs", `{"id":"` + strings.Repeat("a", 65) + `","command":"true"}`, 400, sandboxd.CodeInvalidRequest},
		{"relative cwd", "POST", "/v1/execs", `{"id":"a","command":"true","cwd":"tmp"}`, 400, sandboxd.CodeInvalidRequest},
		{"negative timeout", "POST", "/v1/execs", `{"id":"a","command":"true","timeoutMs":-1}`, 400, sandboxd.CodeInvalidRequest},
		{"NUL in env", "POST", "/v1/execs", `{"id":"a","command":"true","env":{"A":"x\u0000y"}}`, 400, sandboxd.CodeInvalidRequest},
		{"spec too large", "POST", "/v1/execs", `{"id":"a","command":"true","args":["` + strings.Repeat("x", 5<<20) + `"]}`, 413, sandboxd.CodeTooLarge},
		{"unknown signal", "POST", "/v1/execs/" + exited + "/signal", `{"signal":"SIGNOPE"}`, 400, sandboxd.CodeInvalidRequest},
		{"signal with extra field", "POST", "/v1/execs/" + exited + "/signal", `{"signal":"SIGTERM","pid":1}`, 400, sandboxd.CodeInvalidRequest},
		{"tty without stdin", "POST", "/v1/execs", `{"id":"a","command":"sh","tty":{"rows":24,"cols":80}}`, 400, sandboxd.CodeInvalidRequest},
		{"tty of 0 rows", "POST", "/v1/execs", `{"id":"a","command":"sh","stdin":true,"tty":{"rows":0,"cols":80}}`, 400, sandboxd.CodeInvalidRequest},
		{"resize beyond the bound", "POST", "/v1/execs/" + exited + "/resize", `{"rows":24,"cols":1001}`, 400, sandboxd.CodeInvalidRequest},
		{"resize with extra field", "POST", "/v1/execs/" + exited + "/resize", `{"rows":24,"cols":80,"x":1}`, 400, sandboxd.CodeInvalidRequest},
		{"resize without a terminal", "POST", "/v1/execs/" + exited + "/resize", `{"rows":24,"cols":80}`, 400, sandboxd.CodeInvalidRequest},
		{"stdin without offset", "POST", "/v1/execs/" + exited + "/stdin", ``, 400, sandboxd.CodeInvalidRequest},
		{"output from 0", "GET", "/v1/execs/" + exited + "/output?from=0", ``, 400, sandboxd.CodeInvalidRequest},
		{"output beyond the journal", "GET", "/v1/execs/" + exited + "/output?from=3", ``, 400, sandboxd.CodeInvalidRequest},
		{"unknown exec", "GET", "/v1/execs/nope/output", ``, 404, sandboxd.CodeNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), tc.method, "http://sandboxd"+tc.path, strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body struct{ Code, Message string }
			b, _ := io.ReadAll(resp.Body)
			if err := json.NewDecoder(bytes.NewReader(b)).Decode(&body); err != nil {
				t.Fatalf("answer %q is not JSON: %v", b, err)
			}
			if resp.StatusCode != tc.wantStatus || body.Code != tc.wantCode {
				t.Errorf("answer %d %s (%s), want %d %s", resp.StatusCode, body.Code, body.Message, tc.wantStatus, tc.wantCode)
			}
		})
	}
}
