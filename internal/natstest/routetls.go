package natstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/internal/embeddednats"
)

// RouteName is the common name of a route certificate: the production overlay's nats.conf
// admits a route peer only with a certificate of its installation's CA that names it
// (cluster authorization user "CN=kubeclip-nats-route", tls verify_and_map), as
// hack/deploy/route-tls.sh makes it.
const RouteName = "kubeclip-nats-route"

// RouteTLSMount is where the production overlay mounts the Secret kubeclip-nats-routes: the
// directory its nats.conf reads the route CA, certificate and key from. A test that loads that
// file puts a RouteTLS's Dir in its place.
const RouteTLSMount = "/etc/nats-routes/"

// RouteTLS is a route CA and the one certificate every node of a cluster presents, as files in
// the layout of the Secret kubeclip-nats-routes (ca.crt, tls.crt, tls.key).
type RouteTLS struct {
	Dir, CA, Cert, Key string

	// The CA, kept so that Issue can sign another certificate (the script does not keep it).
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

// NewRouteTLS writes a new CA and a certificate it signs into dir: common name RouteName, for
// loopback (127.0.0.1 and localhost), usable by a server and a client (a route is both). Each
// call makes a new CA, so a second RouteTLS is one the first's cluster does not trust.
func NewRouteTLS(t testing.TB, dir string) RouteTLS {
	t.Helper()
	return newRouteTLS(t, dir, nil)
}

// ForgeRouteTLS is NewRouteTLS with a CA that bears the subject of the CA certificate at caFile
// but has a key of its own: a peer's TLS offers its certificate to a server that asks for one of
// that CA (as it would not offer NewRouteTLS's), and the server must judge it by its signature.
func ForgeRouteTLS(t testing.TB, dir, caFile string) RouteTLS {
	t.Helper()
	data, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("natstest: %s holds no PEM certificate", caFile)
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("natstest: parsing %s: %v", caFile, err)
	}
	return newRouteTLS(t, dir, ca.RawSubject)
}

// Issue writes into dir a certificate and key that r's CA signs for commonName, as NewRouteTLS
// makes its own otherwise (loopback, server and client use), beside a copy of the CA's
// certificate: a peer the cluster's CA vouches for under another name.
func (r RouteTLS) Issue(t testing.TB, dir, commonName string) RouteTLS {
	t.Helper()
	if r.caKey == nil {
		t.Fatal("natstest: Issue needs a RouteTLS made by NewRouteTLS or ForgeRouteTLS")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	now := time.Now()
	key := newKey(t)
	leaf := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: commonName},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP(embeddednats.DefaultHost)},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, r.caCert, &key.PublicKey, r.caKey)
	if err != nil {
		t.Fatalf("natstest: making a route certificate: %v", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	out := RouteTLS{
		Dir: dir, CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key"),
		caCert: r.caCert, caKey: r.caKey,
	}
	for path, block := range map[string]*pem.Block{
		out.CA: {Type: "CERTIFICATE", Bytes: r.caCert.Raw}, out.Cert: {Type: "CERTIFICATE", Bytes: leafDER}, out.Key: {Type: "PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatalf("natstest: %v", err)
		}
	}
	return out
}

// newRouteTLS makes a RouteTLS whose CA has the subject caSubject (DER), or a name of its own.
func newRouteTLS(t testing.TB, dir string, caSubject []byte) RouteTLS {
	t.Helper()
	now := time.Now()
	caKey := newKey(t)
	ca := &x509.Certificate{
		SerialNumber: serial(t), Subject: pkix.Name{CommonName: "natstest route CA"}, RawSubject: caSubject,
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatalf("natstest: making the route CA: %v", err)
	}
	if ca, err = x509.ParseCertificate(caDER); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	return RouteTLS{caCert: ca, caKey: caKey}.Issue(t, dir, RouteName)
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("natstest: generating a key: %v", err)
	}
	return key
}

func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatalf("natstest: %v", err)
	}
	return n
}
