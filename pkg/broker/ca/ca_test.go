package ca

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var bound = []string{"api.anthropic.com", "api.openai.com"}

func newCA(t *testing.T) *CA {
	t.Helper()
	c, err := Generate(Options{Hosts: bound})
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	return c
}

// TestGenerateIsNameConstrained pins what makes the CA's key worth little if it leaks: critical
// DNS constraints to the bound hosts, no IP address, server authentication only, no sub-CA.
func TestGenerateIsNameConstrained(t *testing.T) {
	c := newCA(t)
	cert := c.Certificate()
	if diff := cmp.Diff(bound, cert.PermittedDNSDomains); diff != "" {
		t.Errorf("permitted DNS domains (-want +got):\n%s", diff)
	}
	if !cert.PermittedDNSDomainsCritical {
		t.Error("the name constraints are not critical: a client that does not understand them would ignore them")
	}
	if len(cert.ExcludedIPRanges) != 2 {
		t.Errorf("excluded IP ranges = %v, want every IPv4 and IPv6 address", cert.ExcludedIPRanges)
	}
	if !cert.IsCA || !cert.MaxPathLenZero || cert.MaxPathLen != 0 {
		t.Errorf("IsCA %v, MaxPathLen %d (zero %v): want a CA that signs leaves only", cert.IsCA, cert.MaxPathLen, cert.MaxPathLenZero)
	}
	if diff := cmp.Diff([]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, cert.ExtKeyUsage); diff != "" {
		t.Errorf("extended key usage (-want +got):\n%s", diff)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		t.Errorf("public key %T, want ECDSA P-256", cert.PublicKey)
	}
	if got := cert.NotAfter.Sub(cert.NotBefore); got != DefaultValidity+backdate {
		t.Errorf("validity %s, want %s", got, DefaultValidity+backdate)
	}
}

// TestNameConstraintsRefuseForeignLeaves signs leaves with the CA's own key, as an attacker
// holding it would: Go's verifier accepts the bound host's and refuses a foreign host's and an
// IP address's.
func TestNameConstraintsRefuseForeignLeaves(t *testing.T) {
	c := newCA(t)
	now := time.Now()
	roots := c.Pool()
	for _, tc := range []struct {
		name    string
		dns     []string
		ips     []net.IP
		verify  string // the name the client verifies
		wantErr bool
	}{
		{name: "bound host", dns: []string{"api.anthropic.com"}, verify: "api.anthropic.com"},
		{name: "subdomain of a bound host (RFC 5280)", dns: []string{"eu.api.anthropic.com"}, verify: "eu.api.anthropic.com"},
		{name: "foreign host", dns: []string{"attacker.example"}, verify: "attacker.example", wantErr: true},
		{name: "bound host's parent", dns: []string{"anthropic.com"}, verify: "anthropic.com", wantErr: true},
		{name: "look-alike suffix", dns: []string{"evilapi.anthropic.com"}, verify: "evilapi.anthropic.com", wantErr: true},
		{name: "foreign host beside a bound one", dns: []string{"api.anthropic.com", "attacker.example"}, verify: "api.anthropic.com", wantErr: true},
		{name: "IP address", ips: []net.IP{net.ParseIP("10.0.0.1")}, verify: "10.0.0.1", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			leaf, err := c.sign(tc.dns, tc.ips, now, time.Hour)
			if err != nil {
				t.Fatalf("sign: %v", err)
			}
			_, err = leaf.Leaf.Verify(x509.VerifyOptions{DNSName: tc.verify, Roots: roots, CurrentTime: now})
			if !tc.wantErr {
				if err != nil {
					t.Fatalf("Verify: %v, want the leaf accepted", err)
				}
				return
			}
			var invalid x509.CertificateInvalidError
			if !errors.As(err, &invalid) || invalid.Reason != x509.CANotAuthorizedForThisName {
				t.Fatalf("Verify: %v, want CANotAuthorizedForThisName", err)
			}
		})
	}
}

func TestParseRoundTripsAndChecks(t *testing.T) {
	c := newCA(t)
	keyPEM, err := c.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	back, err := Parse(c.CertPEM(), keyPEM)
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	if !back.Certificate().Equal(c.Certificate()) || !back.key.Equal(c.key) {
		t.Fatal("Parse did not give back the CA")
	}
	other := newCA(t)
	otherKey, err := other.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	unconstrained := unconstrainedCA(t)
	for _, tc := range []struct {
		name          string
		cert, key     []byte
		wantErrSubstr string
	}{
		{"another CA's key", c.CertPEM(), otherKey, "does not match"},
		{"no name constraints", unconstrained.CertPEM(), mustKeyPEM(t, unconstrained), "name constraints"},
		{"key where the certificate goes", keyPEM, keyPEM, "CERTIFICATE"},
		{"certificate where the key goes", c.CertPEM(), c.CertPEM(), "PRIVATE KEY"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.cert, tc.key)
			if err == nil || !strings.Contains(err.Error(), tc.wantErrSubstr) {
				t.Fatalf("Parse: %v, want an error about %q", err, tc.wantErrSubstr)
			}
			if bytes.Contains([]byte(err.Error()), []byte("BEGIN")) {
				t.Fatalf("the error quotes PEM: %v", err)
			}
		})
	}
}

// unconstrainedCA is a CA Generate would never make: no name constraints.
func unconstrainedCA(t *testing.T) *CA {
	t.Helper()
	c := newCA(t)
	tmpl := *c.cert
	tmpl.PermittedDNSDomains, tmpl.PermittedDNSDomainsCritical, tmpl.ExcludedIPRanges = nil, false, nil
	der, err := x509.CreateCertificate(nil, &tmpl, &tmpl, &c.key.PublicKey, c.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{cert: cert, key: c.key}
}

func mustKeyPEM(t *testing.T, c *CA) []byte {
	t.Helper()
	k, err := c.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestCanonicalHost(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		wantErr  bool
	}{
		{in: "API.Anthropic.com.", want: "api.anthropic.com"},
		{in: "localhost", want: "localhost"},
		{in: "", wantErr: true},
		{in: "10.0.0.1", wantErr: true},
		{in: "::1", wantErr: true},
		{in: "*.anthropic.com", wantErr: true},
		{in: "api..anthropic.com", wantErr: true},
		{in: "-api.anthropic.com", wantErr: true},
		{in: "api.anthropic.com:443", wantErr: true},
		{in: "api_x.anthropic.com", wantErr: true},
		{in: strings.Repeat("a", 64) + ".com", wantErr: true},
	} {
		got, err := CanonicalHost(tc.in)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("CanonicalHost(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestNewIssuerRefusesHostsOutsideTheCA(t *testing.T) {
	_, err := NewIssuer(IssuerOptions{CA: newCA(t), Hosts: []string{"api.anthropic.com", "generativelanguage.googleapis.com"}})
	if err == nil || !strings.Contains(err.Error(), "generativelanguage.googleapis.com") {
		t.Fatalf("NewIssuer: %v, want an error naming the host outside the constraints", err)
	}
}

// TestIssuerOverTLS runs real handshakes over loopback against a server whose certificates come
// from the issuer, with a client that trusts only the installation CA: a bound host's handshake
// verifies, an unbound host's and a nameless one's fail, and the leaf is cached, lives a day and
// is renewed once half its life is gone.
func TestIssuerOverTLS(t *testing.T) {
	c := newCA(t)
	now := time.Now()
	var clock atomic.Int64 // the server's handshakes read it on their goroutine
	clock.Store(now.UnixNano())
	iss, err := NewIssuer(IssuerOptions{CA: c, Hosts: []string{"api.anthropic.com"}, Now: func() time.Time { return time.Unix(0, clock.Load()) }})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{GetCertificate: iss.GetCertificate, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			_ = conn.(*tls.Conn).HandshakeContext(t.Context()) // the client reports what happened
			_ = conn.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })

	handshake := func(name string) (*x509.Certificate, error) {
		conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{ServerName: name, RootCAs: c.Pool(), MinVersion: tls.VersionTLS12})
		if err != nil {
			return nil, err
		}
		defer func() { _ = conn.Close() }()
		return conn.ConnectionState().PeerCertificates[0], nil
	}
	first, err := handshake("api.anthropic.com")
	if err != nil {
		t.Fatalf("handshake for the bound host: %v", err)
	}
	if got := first.NotAfter.Sub(first.NotBefore); got != DefaultLeafLifetime+backdate {
		t.Errorf("leaf validity %s, want %s", got, DefaultLeafLifetime+backdate)
	}
	if diff := cmp.Diff([]string{"api.anthropic.com"}, first.DNSNames); diff != "" {
		t.Errorf("leaf DNS names (-want +got):\n%s", diff)
	}
	for _, name := range []string{"api.openai.com", "attacker.example"} {
		if _, err := handshake(name); err == nil {
			t.Errorf("handshake for %s succeeded, want it refused", name)
		}
	}
	if _, err := iss.GetCertificate(&tls.ClientHelloInfo{ServerName: ""}); !errors.As(err, new(*UnboundHostError)) {
		t.Errorf("GetCertificate without a server name: %v, want *UnboundHostError", err)
	}

	again, err := handshake("api.anthropic.com")
	if err != nil {
		t.Fatal(err)
	}
	if !again.Equal(first) {
		t.Error("a second handshake got a new leaf; want the cached one")
	}
	later := now.Add(DefaultLeafLifetime/2 + time.Minute)
	clock.Store(later.UnixNano())
	renewed, err := iss.GetCertificate(&tls.ClientHelloInfo{ServerName: "API.anthropic.com"})
	if err != nil {
		t.Fatal(err)
	}
	if renewed.Leaf.Equal(first) || !renewed.Leaf.NotAfter.Equal(later.Add(DefaultLeafLifetime).Truncate(time.Second)) {
		t.Errorf("after half a life: leaf until %s, want a new one until %s", renewed.Leaf.NotAfter, later.Add(DefaultLeafLifetime))
	}
}
