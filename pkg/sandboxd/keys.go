package sandboxd

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// ErrServerKeyMismatch is the handshake error of a client whose pinned key is not the server's:
// the connection reached another pod (a reused IP, a stale address) and no request was sent.
var ErrServerKeyMismatch = errors.New("sandboxd: server key does not match the lease's key")

func derive(seed []byte, label string) []byte {
	m := hmac.New(sha256.New, seed)
	m.Write([]byte(label))
	return m.Sum(nil)
}

// ServerKey is the daemon's ed25519 key: ed25519.NewKeyFromSeed(HMAC-SHA256(seed, "server")).
func ServerKey(seed []byte) ed25519.PrivateKey {
	return ed25519.NewKeyFromSeed(derive(seed, "server"))
}

// ServerPublicKey is the public half of ServerKey, the key a client pins.
func ServerPublicKey(seed []byte) ed25519.PublicKey {
	return ServerKey(seed).Public().(ed25519.PublicKey)
}

// ClientToken is the bearer token a client presents: hex(HMAC-SHA256(seed, "client")).
func ClientToken(seed []byte) string {
	return hex.EncodeToString(derive(seed, "client"))
}

// Validity of the self-signed certificate. Clients pin the key and ignore the dates, so they are
// fixed (RFC 5280's "no well-defined expiration"): the certificate is then a pure function of the
// seed and no clock can make a handshake fail.
var (
	certNotBefore = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	certNotAfter  = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
)

// ServerTLSConfig returns the daemon's TLS 1.3 configuration: a self-signed certificate for
// ServerKey(seed), made in memory.
func ServerTLSConfig(seed []byte) (*tls.Config, error) {
	cert, err := serverCertificate(seed)
	if err != nil {
		return nil, err
	}
	return serverTLSConfig(func() *tls.Certificate { return cert }), nil
}

// serverTLSConfig presents, in each handshake, the certificate current returns then: a warm
// pod's daemon changes its key once, when it is bound.
func serverTLSConfig(current func() *tls.Certificate) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return current(), nil },
		// HTTP/1.1 only: the API streams one response per connection at a time and the
		// exec-worker keeps a few connections alive per lease.
		NextProtos: []string{"http/1.1"},
	}
}

// serverCertificate is the self-signed certificate for ServerKey(seed).
func serverCertificate(seed []byte) (*tls.Certificate, error) {
	key := ServerKey(seed)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "sandboxd"},
		NotBefore:             certNotBefore,
		NotAfter:              certNotAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              []string{"sandboxd"},
	}
	der, err := x509.CreateCertificate(nil, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("creating the sandboxd certificate: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// ClientTLSConfig returns a client TLS 1.3 configuration that accepts only the server key of the
// lease with this seed.
func ClientTLSConfig(seed []byte) *tls.Config {
	return PinnedTLSConfig(ServerPublicKey(seed))
}

// PinnedTLSConfig returns a client TLS 1.3 configuration that accepts only a server whose leaf
// certificate carries pub. Chains, names and dates are not checked (InsecureSkipVerify): the
// certificate is self-signed, and TLS 1.3's CertificateVerify proves the server holds the
// private key of the leaf it sent, which VerifyConnection compares with the pin. A mismatch
// fails the handshake with ErrServerKeyMismatch before any request byte is written.
func PinnedTLSConfig(pub ed25519.PublicKey) *tls.Config {
	want := bytes.Clone(pub)
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true, //nolint:gosec // the server key is pinned in VerifyConnection
		ServerName:         "sandboxd",
		NextProtos:         []string{"http/1.1"},
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return ErrServerKeyMismatch
			}
			got, ok := cs.PeerCertificates[0].PublicKey.(ed25519.PublicKey)
			if !ok || !bytes.Equal(got, want) {
				return ErrServerKeyMismatch
			}
			return nil
		},
	}
}
