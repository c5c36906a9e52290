package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The log server answers as the API server expects a kubelet to: over TLS with a certificate
// of the given CA for 127.0.0.1, every line from sinceTime with its timestamp, a follow stream
// held open (and counted) until the client goes, a plain read closed at once.
func TestLogServerServesLinesAndHoldsFollowStreams(t *testing.T) {
	pki, pool := testCA(t)
	s, err := startLogServer(pki)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	base := "https://127.0.0.1:" + s.port() + "/containerLogs/ns/pod/agent?timestamps=true"
	first := s.lines[0].at

	read := func(url string) []string {
		t.Helper()
		resp, err := client.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s %v", url, resp.StatusCode, body, err)
		}
		return strings.Split(strings.TrimSuffix(string(body), "\n"), "\n")
	}
	lines := read(base)
	if len(lines) != len(agentLog) || lines[0] != first.Format(time.RFC3339Nano)+" "+agentLog[0] {
		t.Fatalf("lines = %q, want %d lines starting %q", lines, len(agentLog), first.Format(time.RFC3339Nano)+" "+agentLog[0])
	}
	if got := read(base + "&sinceTime=" + first.Add(time.Second).Format(time.RFC3339)); len(got) != 1 || got[0] != "" {
		t.Errorf("lines since a second after the last = %q, want none", got)
	}

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"&follow=true", nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	for range agentLog {
		if !sc.Scan() {
			t.Fatalf("follow stream ended early: %v", sc.Err())
		}
	}
	if opened, open := s.counts(); opened != 3 || open != 1 {
		t.Errorf("with the follow stream open: opened %d, open %d; want 3, 1", opened, open)
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, open := s.counts(); open == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the follow stream is still counted open 10 s after its client went")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testCA writes a CA's ca.crt and ca.key into a temporary directory, as hack/cluster keeps the
// cluster's, and returns it and a pool trusting the CA.
func testCA(t *testing.T) (string, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for name, block := range map[string]*pem.Block{"ca.crt": {Type: "CERTIFICATE", Bytes: der}, "ca.key": {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return dir, pool
}
