package compose_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kubeclip/kubeclip/internal/leasetest"
	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/ca"
	"github.com/kubeclip/kubeclip/pkg/broker/mintclient"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// imageUID is the user every kubeclip image runs as (hack/images/images.sh), the only one that
// may read the broker's files when secrets.sh runs as root.
const imageUID = 65532

// brokerFiles are the files of secrets.sh's DIR/broker the credential broker's container reads.
var brokerFiles = []string{"ca.crt", "ca.key", "sealing.key"}

// runSecrets runs hack/compose/secrets.sh DIR and returns all it printed, stdout and stderr.
func runSecrets(t *testing.T, dir string) string {
	t.Helper()
	cmd := exec.Command("bash", filepath.Join(root, "hack/compose/secrets.sh"), dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("hack/compose/secrets.sh: %v\n%s", err, out)
	}
	return string(out)
}

// checkComposeSecrets checks what hack/compose/secrets.sh made in dir (printed is what its
// first run printed): the broker's directory holds an installation CA the broker loads, covering the
// built-in bindings' hosts, and a 32-byte sealing key; as root, the directory and its files
// belong to the images' uid and no one else may read them (as another user, dir itself is
// 0700); nothing secret was printed; and a second run changes nothing.
func checkComposeSecrets(t *testing.T, dir, printed string) {
	t.Helper()
	env := readEnvFile(t, filepath.Join(dir, "secrets.env"))
	brokerDir := env["KUBECLIP_COMPOSE_BROKER_DIR"]
	if brokerDir != filepath.Join(dir, "broker") {
		t.Fatalf("KUBECLIP_COMPOSE_BROKER_DIR=%q, want %s", brokerDir, filepath.Join(dir, "broker"))
	}
	read := func() map[string][]byte {
		files := map[string][]byte{}
		for _, f := range brokerFiles {
			data, err := os.ReadFile(filepath.Join(brokerDir, f))
			if err != nil {
				t.Fatal(err)
			}
			files[f] = data
		}
		for _, f := range []string{"secrets.env", "sandbox-key"} {
			data, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				t.Fatal(err)
			}
			files[f] = data
		}
		return files
	}
	files := read()

	authority, err := ca.Parse(files["ca.crt"], files["ca.key"])
	if err != nil {
		t.Fatalf("the broker does not load secrets.sh's CA: %v", err)
	}
	for _, h := range []string{"api.anthropic.com", "api.openai.com", "generativelanguage.googleapis.com"} {
		if !authority.Permits(h) {
			t.Errorf("the CA does not cover %s, a built-in binding's host (it covers %v)", h, authority.Hosts())
		}
	}
	if n := len(files["sealing.key"]); n != broker.SealingKeyLen {
		t.Errorf("sealing.key is %d bytes, want %d", n, broker.SealingKeyLen)
	}

	// Who may read them.
	mode := func(path string) (os.FileMode, uint32) {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode().Perm(), fi.Sys().(*syscall.Stat_t).Uid
	}
	if os.Geteuid() == 0 {
		paths := []string{brokerDir}
		for _, f := range brokerFiles {
			paths = append(paths, filepath.Join(brokerDir, f))
		}
		for _, p := range paths {
			if perm, uid := mode(p); uid != imageUID || perm&0o077 != 0 {
				t.Errorf("%s: mode %v owned by uid %d, want uid %d's alone", p, perm, uid, imageUID)
			}
		}
	} else if perm, _ := mode(dir); perm != 0o700 {
		t.Errorf("%s: mode %v, want 0700 (its files are readable by the containers' uid, so by anyone who reaches them)", dir, perm)
	}

	// Nothing secret printed, by either run; the second keeps every file as it was.
	printed += runSecrets(t, dir)
	secrets := []string{string(files["ca.key"]), strings.TrimSpace(string(files["sandbox-key"])), "PRIVATE KEY"}
	for k, v := range env {
		if strings.HasPrefix(k, "KUBECLIP_NATS_PASSWORD_") {
			secrets = append(secrets, v)
		}
	}
	for _, s := range secrets {
		if strings.Contains(printed, s) {
			t.Errorf("secrets.sh printed a secret (%d bytes of it)", len(s))
		}
	}
	if bytes.Contains([]byte(printed), files["sealing.key"]) {
		t.Error("secrets.sh printed the sealing key")
	}
	again := read()
	for f, data := range files {
		if !bytes.Equal(again[f], data) {
			t.Errorf("a second secrets.sh changed %s", f)
		}
	}
	t.Logf("secrets.sh: installation CA hosts %v, valid until %s; sealing key %d bytes",
		authority.Hosts(), authority.Certificate().NotAfter.UTC().Format("2006-01-02"), len(files["sealing.key"]))
}

// checkBrokerNATSUser asks NATS's monitoring (connz, with the authorized user) who the
// connections from the broker's container are: every one must be the broker's own user.
func checkBrokerNATSUser(t *testing.T, natsIP, brokerIP string) {
	t.Helper()
	body, err := get(fmt.Sprintf("http://%s:8222/connz?auth=1&limit=1024", natsIP))
	if err != nil {
		t.Fatalf("NATS connz: %v", err)
	}
	var connz struct {
		Connections []struct {
			IP             string `json:"ip"`
			Name           string `json:"name"`
			AuthorizedUser string `json:"authorized_user"`
		} `json:"connections"`
	}
	if err := json.Unmarshal([]byte(body), &connz); err != nil {
		t.Fatalf("NATS connz: %v", err)
	}
	var users []string
	for _, c := range connz.Connections {
		if c.IP != brokerIP {
			continue
		}
		users = append(users, c.AuthorizedUser)
		if c.AuthorizedUser != "broker" {
			t.Errorf("the credential broker's connection %q is NATS user %q, want broker", c.Name, c.AuthorizedUser)
		}
	}
	if len(users) == 0 {
		t.Errorf("NATS has no connection from the credential broker's address %s", brokerIP)
	}
	t.Logf("credential-broker's NATS connections: %d, users %v", len(users), users)
}

// checkBrokerServes mints a grant as Paperclip's plugin will (a core NATS request as the
// paperclip user) and calls the broker's published TLS port as a brokered pod calls a bound
// host: the leaf it presents for api.anthropic.com chains to secrets.sh's CA and names that
// host; it has none for a host nothing binds; the minted placeholder sent to a host its key is
// not bound to is refused as wrong_host (so the broker's cache holds the grant, opened with the
// sealing key it was minted under), and the same id with another secret as unknown, each in the
// called API's error shape and counted in kubeclip_broker_refusals_total. No call reaches an
// upstream: every one is refused before forwarding.
func checkBrokerServes(t *testing.T, nc *nats.Conn, brokerDir, brokerPort, brokerIP string) {
	t.Helper()
	certPEM, err := os.ReadFile(filepath.Join(brokerDir, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	authority, err := ca.Parse(certPEM, mustRead(t, filepath.Join(brokerDir, "ca.key")))
	if err != nil {
		t.Fatal(err)
	}
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", brokerPort)
	}

	// The leaf for a bound host, and none for another.
	conn, err := tls.Dial("tcp", brokerPort, &tls.Config{ServerName: "api.anthropic.com", RootCAs: authority.Pool(), MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatalf("TLS to the broker as api.anthropic.com, trusting secrets.sh's CA: %v", err)
	}
	leaf := conn.ConnectionState().PeerCertificates[0]
	conn.Close()
	if err := leaf.VerifyHostname("api.anthropic.com"); err != nil {
		t.Errorf("the broker's leaf: %v", err)
	}
	if conn, err := tls.Dial("tcp", brokerPort, &tls.Config{ServerName: "example.com", RootCAs: authority.Pool(), MinVersion: tls.VersionTLS12}); err == nil {
		conn.Close()
		t.Error("the broker completed a TLS handshake as example.com, which nothing binds")
	}

	// A grant, minted as the plugin does: the broker's key, then the value sealed to it.
	minter, err := mintclient.New(mintclient.Options{NATS: nc, InboxPrefix: inbox.PaperclipPrefix, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	mintStart := time.Now()
	key, err := minter.Key(t.Context())
	if err != nil {
		t.Fatalf("the broker's key: %v", err)
	}
	ref := mintclient.Lease{CompanyID: "co-compose", RunID: leasetest.NewID("run-"), LeaseID: leasetest.NewID("pc-")}
	reply, err := minter.Mint(t.Context(), key, ref, "ANTHROPIC_API_KEY", "sk-ant-compose-"+randomText(t, 24))
	if err != nil {
		t.Fatalf("mint: %v", err)
	}
	mintTook := time.Since(mintStart)
	if _, err := broker.ParsePlaceholder(reply.Placeholder); err != nil {
		t.Fatalf("the mint's placeholder: %v", err)
	}

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext:     dial,
		TLSClientConfig: &tls.Config{RootCAs: authority.Pool(), MinVersion: tls.VersionTLS12},
	}}
	defer client.CloseIdleConnections()
	call := func(url, header, value string) (int, string) {
		t.Helper()
		r, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		r.Header.Set(header, value)
		r.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(r)
		if err != nil {
			t.Fatalf("POST %s: %v", url, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(body)
	}
	// To OpenAI: the Anthropic key is not bound there (answered in OpenAI's shape).
	status, body := call("https://api.openai.com/v1/chat/completions", "Authorization", "Bearer "+reply.Placeholder)
	var openAI struct {
		Error struct{ Code string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &openAI); status != http.StatusForbidden || err != nil || openAI.Error.Code != "kubeclip_"+string(broker.ReasonWrongHost) {
		t.Errorf("the placeholder at api.openai.com: %d %s, want 403 with code kubeclip_%s", status, body, broker.ReasonWrongHost)
	}
	// To Anthropic with the grant's id and another secret (answered in Anthropic's shape).
	forged := reply.Placeholder[:len(reply.Placeholder)-base64.RawURLEncoding.EncodedLen(32)] + base64.RawURLEncoding.EncodeToString(randomBytes(t, 32))
	status, body = call("https://api.anthropic.com/v1/messages", "x-api-key", forged)
	var anthropic struct {
		Type  string                `json:"type"`
		Error struct{ Type string } `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &anthropic); status != http.StatusUnauthorized || err != nil || anthropic.Type != "error" || anthropic.Error.Type != "authentication_error" {
		t.Errorf("a forged placeholder at api.anthropic.com: %d %s, want 401 authentication_error", status, body)
	}
	if strings.Contains(body, forged) || strings.Contains(body, reply.Placeholder) {
		t.Error("the refusal quotes the placeholder")
	}

	metrics, err := get(fmt.Sprintf("http://%s:8080/metrics", brokerIP))
	if err != nil {
		t.Fatalf("the broker's /metrics: %v", err)
	}
	counts := map[string]float64{}
	for _, series := range []string{
		`kubeclip_broker_mints_total{result="ok"}`,
		`kubeclip_broker_refusals_total{reason="wrong_host"}`,
		`kubeclip_broker_refusals_total{reason="unknown"}`,
		`kubeclip_broker_refusals_total{reason="missing"}`,
	} {
		counts[series] = sample(t, metrics, series)
	}
	for series, want := range map[string]float64{
		`kubeclip_broker_mints_total{result="ok"}`:            1,
		`kubeclip_broker_refusals_total{reason="wrong_host"}`: 1,
		`kubeclip_broker_refusals_total{reason="unknown"}`:    1,
		`kubeclip_broker_refusals_total{reason="missing"}`:    0,
	} {
		if counts[series] != want {
			t.Errorf("%s = %v, want %v", series, counts[series], want)
		}
	}
	t.Logf("credential-broker through compose: mint %.1f ms; leaf for %v from CA %q; mints_ok wrong_host unknown: %v %v %v",
		float64(mintTook.Microseconds())/1000, leaf.DNSNames, leaf.Issuer.CommonName,
		counts[`kubeclip_broker_mints_total{result="ok"}`], counts[`kubeclip_broker_refusals_total{reason="wrong_host"}`], counts[`kubeclip_broker_refusals_total{reason="unknown"}`])
}

// sample is the value of one series in a Prometheus text exposition; the test fails when the
// series is absent.
func sample(t *testing.T, exposition, series string) float64 {
	t.Helper()
	for sc := bufio.NewScanner(strings.NewReader(exposition)); sc.Scan(); {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s: %v", series, err)
			}
			return f
		}
	}
	t.Fatalf("/metrics has no series %s", series)
	return 0
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func randomText(t *testing.T, n int) string {
	return base64.RawURLEncoding.EncodeToString(randomBytes(t, n))
}
