// Package ca is kubeclip's installation CA: the certificate authority every brokered pod
// trusts, so the credential broker can terminate the TLS of a bound host (api.anthropic.com)
// under that host's own name. The CA is name-constrained to the bound hosts: its key, leaked,
// can impersonate those hosts and nothing else, to any client that honours X.509 name
// constraints (Go, OpenSSL, BoringSSL, Node's). Leaves are minted in memory per SNI host, on
// demand, and live a day (Issuer).
package ca

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"slices"
	"strings"
	"time"
)

// DefaultValidity is how long a generated CA lives. The CA is mounted into every brokered pod
// and rotating it means rolling every pod, so it is long; what limits the harm of its key is
// the name constraint, not its age.
const DefaultValidity = 5 * 365 * 24 * time.Hour

// backdate is how far before its creation a certificate is valid from: a pod whose clock is a
// little behind the broker's must not reject a leaf minted a moment ago.
const backdate = 5 * time.Minute

// CA is the installation CA: its certificate, always name-constrained to Hosts, and its key.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// Options configure Generate.
type Options struct {
	// Hosts are the bound hosts, the only DNS names (and their subdomains, as RFC 5280's
	// constraints go) the CA may certify. Required.
	Hosts []string
	// Validity is the CA's life (0: DefaultValidity).
	Validity time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// Generate makes a new installation CA: an ECDSA P-256 key and a self-signed certificate whose
// critical name constraints permit the hosts' DNS names only and exclude every IP address, and
// whose extended key usage is server authentication only (a leaf it signs cannot sign code or
// authenticate a client to anyone who checks the chain's usages).
func Generate(o Options) (*CA, error) {
	hosts, err := canonicalHosts("ca.Options.Hosts", o.Hosts)
	if err != nil {
		return nil, err
	}
	if o.Validity == 0 {
		o.Validity = DefaultValidity
	}
	if o.Validity < 0 {
		return nil, fmt.Errorf("ca.Options.Validity must be positive, got %s", o.Validity)
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating the installation CA's key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	t := now()
	tmpl := &x509.Certificate{
		SerialNumber:                serial,
		Subject:                     pkix.Name{Organization: []string{"kubeclip"}, CommonName: "kubeclip installation CA (credential broker)"},
		NotBefore:                   t.Add(-backdate),
		NotAfter:                    t.Add(o.Validity),
		IsCA:                        true,
		BasicConstraintsValid:       true,
		MaxPathLenZero:              true, // it signs leaves, never another CA
		KeyUsage:                    x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		ExtKeyUsage:                 []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		PermittedDNSDomainsCritical: true,
		PermittedDNSDomains:         hosts,
		ExcludedIPRanges:            allIPs(),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("signing the installation CA's certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing the installation CA's certificate: %w", err)
	}
	return &CA{cert: cert, key: key}, nil
}

// allIPs are every IPv4 and IPv6 address: a CA for host names has no business certifying an
// address, and a client that dials an IP must not accept one of its leaves.
func allIPs() []*net.IPNet {
	return []*net.IPNet{
		{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
		{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)},
	}
}

// Parse loads a CA from its PEM certificate and PEM PKCS #8 key (as CertPEM and KeyPEM wrote
// them), and checks that it is one Generate could have made: a CA certificate with critical DNS
// name constraints, an ECDSA P-256 key, and a key that is the certificate's.
func Parse(certPEM, keyPEM []byte) (*CA, error) {
	cb, _ := pem.Decode(certPEM)
	if cb == nil || cb.Type != "CERTIFICATE" {
		return nil, errors.New("installation CA certificate: no PEM CERTIFICATE block")
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("installation CA certificate: %w", err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil || kb.Type != "PRIVATE KEY" {
		return nil, errors.New("installation CA key: no PEM PRIVATE KEY (PKCS #8) block")
	}
	parsed, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, errors.New("installation CA key: not a PKCS #8 private key") // the parser's error may quote key bytes
	}
	key, ok := parsed.(*ecdsa.PrivateKey)
	switch {
	case !ok || key.Curve != elliptic.P256():
		return nil, errors.New("installation CA key: must be an ECDSA P-256 key")
	case !cert.IsCA || !cert.BasicConstraintsValid:
		return nil, errors.New("installation CA certificate: is not a CA certificate (basic constraints)")
	case !cert.PermittedDNSDomainsCritical || len(cert.PermittedDNSDomains) == 0:
		return nil, errors.New("installation CA certificate: must have critical permitted DNS name constraints (the bound hosts)")
	case !key.PublicKey.Equal(cert.PublicKey):
		return nil, errors.New("installation CA key: does not match the certificate's public key")
	}
	return &CA{cert: cert, key: key}, nil
}

// Certificate is the CA's certificate.
func (c *CA) Certificate() *x509.Certificate { return c.cert }

// Hosts are the DNS names the CA is constrained to.
func (c *CA) Hosts() []string { return slices.Clone(c.cert.PermittedDNSDomains) }

// CertPEM is the CA's certificate in PEM: the bundle brokered pods trust.
func (c *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.cert.Raw})
}

// KeyPEM is the CA's key, PKCS #8 in PEM, for the broker's own Secret only.
func (c *CA) KeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(c.key)
	if err != nil {
		return nil, fmt.Errorf("encoding the installation CA's key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// Pool is a certificate pool holding only the CA: what a brokered client trusts.
func (c *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.cert)
	return p
}

// Permits reports whether host (canonical, CanonicalHost) is within the CA's name
// constraints.
func (c *CA) Permits(host string) bool {
	for _, d := range c.cert.PermittedDNSDomains {
		if host == d || strings.HasSuffix(host, "."+d) {
			return true
		}
	}
	return false
}

// sign mints a leaf certificate for the DNS names and IP addresses given, with a fresh P-256
// key, valid from now - backdate to now + life. It checks nothing: Issuer decides which names
// it asks for, and a test asks for names the constraints must make worthless.
func (c *CA) sign(dnsNames []string, ips []net.IP, now time.Time, life time.Duration) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating a leaf key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    now.Add(-backdate),
		NotAfter:     now.Add(life),
		DNSNames:     dnsNames,
		IPAddresses:  ips,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.cert, &key.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("signing a leaf for %v: %w", dnsNames, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing a leaf for %v: %w", dnsNames, err)
	}
	return &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

func newSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("drawing a certificate serial: %w", err)
	}
	return n, nil
}

// CanonicalHost is host as the broker compares it: lower case, without one trailing dot. It
// must be a DNS name of letters, digits and '-' in dot-separated labels of 1 to 63 bytes, at
// most 253 bytes in all, neither an IP address nor a wildcard; the error says which rule it
// breaks.
func CanonicalHost(host string) (string, error) {
	h := strings.TrimSuffix(strings.ToLower(host), ".")
	switch {
	case h == "":
		return "", errors.New("must not be empty")
	case len(h) > 253:
		return "", fmt.Errorf("must be at most 253 bytes, got %d", len(h))
	case net.ParseIP(h) != nil:
		return "", fmt.Errorf("%q is an IP address; a bound host is a DNS name", host)
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return "", fmt.Errorf("%q: every dot-separated label must be 1 to 63 bytes", host)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return "", fmt.Errorf("%q: a label must not start or end with '-'", host)
		}
		for i := 0; i < len(label); i++ {
			if c := label[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return "", fmt.Errorf("%q: must contain only letters, digits, '-' and '.'", host)
			}
		}
	}
	return h, nil
}

// canonicalHosts checks and canonicalizes a non-empty host list, without repeats; the error
// names field.
func canonicalHosts(field string, hosts []string) ([]string, error) {
	if len(hosts) == 0 {
		return nil, fmt.Errorf("%s must name at least one host", field)
	}
	out := make([]string, 0, len(hosts))
	for _, h := range hosts {
		c, err := CanonicalHost(h)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out, nil
}
