package sandboxd_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

var (
	bindMaster = []byte("test master key")
	// bindSeed is the warm test server's bind seed; it binds to testSeed, the lease seed the
	// harness's h.tls client is keyed by.
	bindSeed = execspec.DeriveBindSeed(bindMaster, "tenant-test", "warm-1")
	// otherLease is another lease's seed.
	otherLease = execspec.DeriveSeed(bindMaster, "tenant-test", "run-other")
)

// startUnbound runs an unbound server keyed by bindSeed; its h.tls client (pinned to testSeed)
// works once it is bound to testSeed.
func startUnbound(tb testing.TB, mod func(*sandboxd.Options)) *harness {
	tb.Helper()
	return startServer(tb, func(o *sandboxd.Options) {
		o.Seed, o.Unbound = bindSeed, true
		if mod != nil {
			mod(o)
		}
	})
}

// keyed returns a client over TCP pinned to pin's key, carrying token.
func (h *harness) keyed(tb testing.TB, pin []byte, token string) *sandboxd.Client {
	tb.Helper()
	return newClient(tb, sandboxd.ClientOptions{Dial: sandboxd.DialTCP(h.addr), TLS: sandboxd.ClientTLSConfig(pin), Token: token})
}

// rawBind posts body to /v1/bind over TCP pinned to pin's key with token, or over the unix
// socket when pin is nil, and returns the answer.
func (h *harness) rawBind(tb testing.TB, pin []byte, token, body string) (bindAnswer, error) {
	tb.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	url := "http://sandboxd/v1/bind"
	if pin == nil {
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) { return sandboxd.DialUnix(h.socket)(ctx) }
	} else {
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) { return sandboxd.DialTCP(h.addr)(ctx) }
		tr.TLSClientConfig = sandboxd.ClientTLSConfig(pin)
		url = "https://sandboxd/v1/bind"
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(tb.Context(), http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return bindAnswer{}, err
	}
	defer resp.Body.Close()
	a := bindAnswer{Status: resp.StatusCode}
	if resp.StatusCode == http.StatusNoContent {
		return a, nil
	}
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &a); err != nil {
		tb.Fatalf("answer %d %q is not JSON: %v", resp.StatusCode, b, err)
	}
	return a, nil
}

// bindAnswer is an answer to POST /v1/bind: 204, or an error's code and message.
type bindAnswer struct {
	Status  int `json:"-"`
	Code    string
	Message string
}

func bindBody(seed []byte, env map[string]string) string {
	b, _ := json.Marshal(map[string]any{"seed": hex.EncodeToString(seed), "env": env})
	return string(b)
}

// every calls each route of the API through c and returns each one's error by name.
func every(ctx context.Context, c *sandboxd.Client) map[string]error {
	errs := map[string]error{}
	_, errs["start"] = c.Start(ctx, sandboxd.Spec{ID: "x", Command: "true"})
	if s, err := c.Output(ctx, "x", 1); err == nil {
		_ = s.Close()
	} else {
		errs["output"] = err
	}
	_, errs["stdin"] = c.WriteStdin(ctx, "x", 0, []byte("y"), true)
	errs["signal"] = c.Signal(ctx, "x", "SIGTERM")
	errs["resize"] = c.Resize(ctx, "x", execspec.TTY{Rows: 24, Cols: 80})
	errs["delete"] = c.Delete(ctx, "x")
	_, errs["info"] = c.Info(ctx)
	return errs
}

// requireUnbound checks that h serves nothing but a bind: every route answers not_bound, on TCP
// with the bind key and token and on the socket, and a client of the lease fails its handshake.
func requireUnbound(t *testing.T, h *harness) {
	t.Helper()
	clients := map[string]*sandboxd.Client{"tls": h.keyed(t, bindSeed, sandboxd.ClientToken(bindSeed)), "socket": h.unix}
	for name, c := range clients {
		for route, err := range every(t.Context(), c) {
			if !errors.Is(err, sandboxd.ErrNotBound) {
				t.Errorf("%s, %s before bind: %v, want ErrNotBound", name, route, err)
			}
		}
	}
	if _, err := h.tls.Info(t.Context()); !errors.Is(err, sandboxd.ErrServerKeyMismatch) {
		t.Errorf("a client of the lease before bind: %v, want ErrServerKeyMismatch", err)
	}
}

// TestUnbound: before bind, every route is refused on TCP and on the socket, the bind is served
// only on TCP with the bind token, and a client pinned to the lease's key fails the handshake.
func TestUnbound(t *testing.T) {
	h := startUnbound(t, nil)
	requireUnbound(t, h)
	if a, err := h.rawBind(t, nil, "", bindBody(testSeed, nil)); err != nil || a.Status != http.StatusConflict || a.Code != sandboxd.CodeNotBound {
		t.Errorf("a bind over the socket: %+v %v, want 409 not_bound", a, err)
	}
	requireUnbound(t, h)
}

// TestBindRefusesWrongToken: a bind keyed by another pod's bind seed (its token, over a
// connection to this pod) is refused 401 and leaves the daemon unbound.
func TestBindRefusesWrongToken(t *testing.T) {
	h := startUnbound(t, nil)
	otherPod := execspec.DeriveBindSeed(bindMaster, "tenant-test", "warm-2")
	for name, token := range map[string]string{"another pod's": sandboxd.ClientToken(otherPod), "none": "", "the lease's": sandboxd.ClientToken(testSeed)} {
		a, err := h.rawBind(t, bindSeed, token, bindBody(testSeed, nil))
		if err != nil || a.Status != http.StatusUnauthorized || a.Code != sandboxd.CodeUnauthorized {
			t.Errorf("bind with %s token: %+v %v, want 401 unauthorized", name, a, err)
		}
	}
	if err := sandboxd.Bind(t.Context(), sandboxd.DialTCP(h.addr), otherPod, testSeed, nil); !errors.Is(err, sandboxd.ErrBoundElsewhere) {
		t.Errorf("Bind with another pod's bind seed: %v, want ErrBoundElsewhere", err)
	}
	requireUnbound(t, h)
}

// syncBuffer is a log sink for a server's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestBind: once bound, the daemon is the lease's: its key and token work, its commands see the
// bind's environment over the daemon's (and never the seed), the bind key and token open
// nothing, no second bind is taken, and the log says "bound" without a seed or a value.
func TestBind(t *testing.T) {
	var logs syncBuffer
	h := startUnbound(t, func(o *sandboxd.Options) {
		o.Logger = zerolog.New(io.MultiWriter(&logs, zerolog.NewTestWriter(t)))
	})
	env := map[string]string{"BOUNDVAR": "bound-secret-value", "BASEVAR": "overridden"}
	if err := sandboxd.Bind(t.Context(), sandboxd.DialTCP(h.addr), bindSeed, testSeed, env); err != nil {
		t.Fatalf("Bind: %v", err)
	}

	script := `echo "$BOUNDVAR $BASEVAR ${KUBECLIP_SANDBOXD_SEED-unset}"`
	for name, c := range map[string]*sandboxd.Client{"tls": h.tls, "socket": h.unix} {
		got := run(t, c, sandboxd.Spec{Command: "sh", Args: sh(script)}, nil)
		if diff := cmp.Diff(result{Stdout: "bound-secret-value overridden unset\n", ExitCode: intp(0)}, got); diff != "" {
			t.Errorf("%s: a command after bind (-want +got):\n%s", name, diff)
		}
	}
	if got := run(t, h.tls, sandboxd.Spec{Command: "sh", Args: sh(script), Env: map[string]string{"BOUNDVAR": "per-exec"}}, nil); got.Stdout != "per-exec overridden unset\n" {
		t.Errorf("a start's env over the bind's: %q", got.Stdout)
	}

	if _, err := h.keyed(t, bindSeed, sandboxd.ClientToken(bindSeed)).Info(t.Context()); !errors.Is(err, sandboxd.ErrServerKeyMismatch) {
		t.Errorf("pinned to the bind key after bind: %v, want ErrServerKeyMismatch", err)
	}
	if _, err := h.keyed(t, testSeed, sandboxd.ClientToken(bindSeed)).Info(t.Context()); !errors.Is(err, sandboxd.ErrUnauthorized) {
		t.Errorf("the bind token after bind: %v, want ErrUnauthorized", err)
	}
	if _, err := h.keyed(t, otherLease, sandboxd.ClientToken(otherLease)).Info(t.Context()); !errors.Is(err, sandboxd.ErrServerKeyMismatch) {
		t.Errorf("pinned to another lease's key: %v, want ErrServerKeyMismatch", err)
	}
	for _, tc := range []struct {
		name  string
		pin   []byte
		token string
		seed  []byte
	}{
		{"tls, the lease's token, its seed", testSeed, sandboxd.ClientToken(testSeed), testSeed},
		{"tls, the lease's token, another seed", testSeed, sandboxd.ClientToken(testSeed), otherLease},
		{"socket", nil, "", otherLease},
	} {
		if a, err := h.rawBind(t, tc.pin, tc.token, bindBody(tc.seed, nil)); err != nil || a.Status != http.StatusConflict || a.Code != sandboxd.CodeAlreadyBound {
			t.Errorf("a second bind (%s): %+v %v, want 409 already_bound", tc.name, a, err)
		}
	}

	if err := sandboxd.Bind(t.Context(), sandboxd.DialTCP(h.addr), bindSeed, testSeed, env); err != nil {
		t.Errorf("Bind again to the same lease (a retry after a lost answer): %v, want nil", err)
	}
	err := sandboxd.Bind(t.Context(), sandboxd.DialTCP(h.addr), bindSeed, otherLease, env)
	if !errors.Is(err, sandboxd.ErrBoundElsewhere) {
		t.Errorf("Bind to another lease: %v, want ErrBoundElsewhere", err)
	}

	if got := run(t, h.tls, sandboxd.Spec{Command: "echo", Args: []string{"still"}}, nil); got.Stdout != "still\n" {
		t.Errorf("the lease after the refused binds: %q", got.Stdout)
	}
	out := logs.String()
	if n := strings.Count(out, `"message":"bound"`); n != 1 {
		t.Errorf("%d \"bound\" log lines, want 1:\n%s", n, out)
	}
	for _, secret := range []string{hex.EncodeToString(testSeed), hex.EncodeToString(bindSeed), "bound-secret-value", sandboxd.ClientToken(testSeed), sandboxd.ClientToken(bindSeed)} {
		if strings.Contains(out, secret) {
			t.Errorf("the log holds %q", secret)
		}
	}
}

// TestBindBadBodies: a malformed bind is refused naming its field and leaves the daemon unbound.
func TestBindBadBodies(t *testing.T) {
	h := startUnbound(t, nil)
	seedHex := hex.EncodeToString(testSeed)
	for _, tc := range []struct {
		name, body string
		wantStatus int
		wantCode   string
		wantField  string
	}{
		{"seed not hex", `{"seed":"` + strings.Repeat("zz", 32) + `"}`, 400, sandboxd.CodeInvalidRequest, "seed:"},
		{"seed too short", `{"seed":"` + seedHex[:62] + `"}`, 400, sandboxd.CodeInvalidRequest, "seed:"},
		{"no seed", `{"env":{"A":"b"}}`, 400, sandboxd.CodeInvalidRequest, "seed:"},
		{"the bind seed", bindBody(bindSeed, nil), 400, sandboxd.CodeInvalidRequest, "seed:"},
		{"unknown key", `{"seed":"` + seedHex + `","image":"x"}`, 400, sandboxd.CodeInvalidRequest, `"image"`},
		{"env key with =", `{"seed":"` + seedHex + `","env":{"A=B":"c"}}`, 400, sandboxd.CodeInvalidRequest, "env:"},
		{"empty env key", `{"seed":"` + seedHex + `","env":{"":"c"}}`, 400, sandboxd.CodeInvalidRequest, "env:"},
		{"NUL in an env value", `{"seed":"` + seedHex + `","env":{"A":"x\u0000y"}}`, 400, sandboxd.CodeInvalidRequest, "env.A:"},
		{"the seed variable", `{"seed":"` + seedHex + `","env":{"` + execspec.SeedEnv + `":"x"}}`, 400, sandboxd.CodeInvalidRequest, "env:"},
		{"two objects", bindBody(testSeed, nil) + bindBody(testSeed, nil), 400, sandboxd.CodeInvalidRequest, "more than one JSON value"},
		{"too large", `{"seed":"` + seedHex + `","env":{"A":"` + strings.Repeat("x", 5<<20) + `"}}`, 413, sandboxd.CodeTooLarge, "too large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := h.rawBind(t, bindSeed, sandboxd.ClientToken(bindSeed), tc.body)
			if err != nil || a.Status != tc.wantStatus || a.Code != tc.wantCode || !strings.Contains(a.Message, tc.wantField) {
				t.Errorf("answer %+v %v, want %d %s naming %s", a, err, tc.wantStatus, tc.wantCode, tc.wantField)
			}
			if strings.Contains(a.Message, seedHex[:16]) || strings.Contains(a.Message, "zz") {
				t.Errorf("the answer %q holds the seed", a.Message)
			}
		})
	}
	requireUnbound(t, h)
}

// TestBindRace: binds of different leases at once: exactly one wins, every other gets
// ErrBoundElsewhere, and the winner's lease is served. The binds' first connections are all
// open before any is handed back, so their requests arrive together; rounds on fresh daemons
// make a bind that checked the state apart from switching it fail here.
func TestBindRace(t *testing.T) {
	const binders, rounds = 8, 10
	for round := range rounds {
		h := startUnbound(t, nil)
		seeds := make([][]byte, binders)
		errs := make([]error, binders)
		var dialed, wg sync.WaitGroup
		dialed.Add(binders)
		for i := range binders {
			seeds[i] = execspec.DeriveSeed(bindMaster, "tenant-test", fmt.Sprintf("run-%d-%d", round, i))
			first := true
			dial := func(ctx context.Context) (net.Conn, error) {
				conn, err := sandboxd.DialTCP(h.addr)(ctx)
				if first { // the probe's connection is not held back
					first = false
					dialed.Done()
					dialed.Wait()
				}
				return conn, err
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = sandboxd.Bind(t.Context(), dial, bindSeed, seeds[i], map[string]string{"LEASE": strconv.Itoa(i)})
			}()
		}
		wg.Wait()
		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner < 0:
				winner = i
			case err == nil:
				t.Errorf("round %d: binds %d and %d both won", round, winner, i)
			case !errors.Is(err, sandboxd.ErrBoundElsewhere):
				t.Errorf("round %d: bind %d: %v, want nil or ErrBoundElsewhere", round, i, err)
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: no bind won", round)
		}
		c := h.keyed(t, seeds[winner], sandboxd.ClientToken(seeds[winner]))
		if got := run(t, c, sandboxd.Spec{Command: "sh", Args: sh(`echo "$LEASE"`)}, nil); got.Stdout != strconv.Itoa(winner)+"\n" {
			t.Errorf("round %d: the winner's command printed %q, want its LEASE %d", round, got.Stdout, winner)
		}
	}
}

// TestBindLosesToAnEarlierSwitch: a bind admitted while the daemon was unbound, whose body
// arrives only after another bind switched the daemon, is refused already_bound: a bind switches
// from the identity it was admitted under, never over another lease's. The held bind's handler
// is known to be running once it asks for the body (100 Continue).
func TestBindLosesToAnEarlierSwitch(t *testing.T) {
	h := startUnbound(t, nil)
	conn, err := sandboxd.DialTCP(h.addr)(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	held := tls.Client(conn, sandboxd.ClientTLSConfig(bindSeed))
	defer held.Close()
	body := bindBody(otherLease, nil)
	if _, err := fmt.Fprintf(held, "POST /v1/bind HTTP/1.1\r\nHost: sandboxd\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n", sandboxd.ClientToken(bindSeed), len(body)); err != nil {
		t.Fatal(err)
	}
	answers := bufio.NewReader(held)
	if resp, err := http.ReadResponse(answers, nil); err != nil || resp.StatusCode != http.StatusContinue {
		t.Fatalf("the held bind's first answer: %v, %v; want 100 Continue", resp, err)
	}

	if err := sandboxd.Bind(t.Context(), sandboxd.DialTCP(h.addr), bindSeed, testSeed, nil); err != nil {
		t.Fatalf("the second bind: %v", err)
	}
	if _, err := io.WriteString(held, body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(answers, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a bindAnswer
	_ = json.NewDecoder(resp.Body).Decode(&a)
	if resp.StatusCode != http.StatusConflict || a.Code != sandboxd.CodeAlreadyBound {
		t.Errorf("the held bind: %d %s, want 409 already_bound", resp.StatusCode, a.Code)
	}
	if got := run(t, h.tls, sandboxd.Spec{Command: "echo", Args: []string{"mine"}}, nil); got.Stdout != "mine\n" {
		t.Errorf("the second bind's lease after the held one: %q", got.Stdout)
	}
}

// TestBindErrorsHoldNoSecrets: Bind's errors name what went wrong, never a seed, a token or an
// env value.
func TestBindErrorsHoldNoSecrets(t *testing.T) {
	h := startUnbound(t, nil)
	const value = "env-value-never-shown"
	secrets := []string{value, hex.EncodeToString(testSeed), hex.EncodeToString(bindSeed), hex.EncodeToString(otherLease),
		sandboxd.ClientToken(testSeed), sandboxd.ClientToken(bindSeed), sandboxd.ClientToken(otherLease)}
	for _, tc := range []struct {
		name       string
		lease      []byte
		env        map[string]string
		wantErr    error
		wantInText string
	}{
		{"a bad env name", testSeed, map[string]string{"A=B": value}, sandboxd.ErrInvalidRequest, `"A=B"`},
		{"the seed variable", testSeed, map[string]string{execspec.SeedEnv: value}, sandboxd.ErrInvalidRequest, execspec.SeedEnv},
		{"a NUL in a value", testSeed, map[string]string{"A": value + "\x00"}, sandboxd.ErrInvalidRequest, "env.A"},
		{"bound", testSeed, map[string]string{"A": value}, nil, ""},
		{"bound elsewhere", otherLease, map[string]string{"A": value}, sandboxd.ErrBoundElsewhere, "another lease"},
	} {
		err := sandboxd.Bind(t.Context(), sandboxd.DialTCP(h.addr), bindSeed, tc.lease, tc.env)
		if !errors.Is(err, tc.wantErr) || (err != nil && !strings.Contains(err.Error(), tc.wantInText)) {
			t.Errorf("%s: %v, want %v naming %s", tc.name, err, tc.wantErr, tc.wantInText)
		}
		for _, secret := range secrets {
			if err != nil && strings.Contains(err.Error(), secret) {
				t.Errorf("%s: the error %q holds %q", tc.name, err, secret)
			}
		}
	}
}

// BenchmarkBind measures Bind over loopback: "first" binds an unbound daemon (one handshake with
// the bind key, the lease's certificate made, the switch); "retry" is a repeated Bind of a daemon
// already bound to the lease (a failed handshake, then the probe's handshake and info).
func BenchmarkBind(b *testing.B) {
	quiet := func(o *sandboxd.Options) { o.Logger = zerolog.Nop() }
	env := map[string]string{"PAPERCLIP_RUN": "run-1", "PATH": "/usr/local/bin:/usr/bin:/bin"}
	b.Run("first", func(b *testing.B) {
		ctx := b.Context()
		for b.Loop() {
			b.StopTimer()
			h := startUnbound(b, quiet)
			b.StartTimer()
			if err := sandboxd.Bind(ctx, sandboxd.DialTCP(h.addr), bindSeed, testSeed, env); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			h.stop()
			b.StartTimer()
		}
	})
	b.Run("retry", func(b *testing.B) {
		ctx := b.Context()
		h := startUnbound(b, quiet)
		if err := sandboxd.Bind(ctx, sandboxd.DialTCP(h.addr), bindSeed, testSeed, env); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if err := sandboxd.Bind(ctx, sandboxd.DialTCP(h.addr), bindSeed, testSeed, env); err != nil {
				b.Fatal(err)
			}
		}
	})
}
