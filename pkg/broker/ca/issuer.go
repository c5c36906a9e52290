package ca

import (
	"crypto/tls"
	"fmt"
	"slices"
	"sync"
	"time"
)

// DefaultLeafLifetime is how long a leaf lives: a day, so a leaf (and its key, which lives only
// in the broker's memory) is worth little for long even if it leaks.
const DefaultLeafLifetime = 24 * time.Hour

// UnboundHostError is GetCertificate's refusal of a host the broker does not serve: the TLS
// handshake fails, so the client never sends a request (nor a placeholder) to it.
type UnboundHostError struct {
	// Host is the server name the client asked for ("" when it sent none).
	Host string
}

func (e *UnboundHostError) Error() string {
	if e.Host == "" {
		return "kubeclip broker: the client sent no server name (SNI); only bound hosts are served"
	}
	return fmt.Sprintf("kubeclip broker: %q is not a bound host", e.Host)
}

// Issuer mints and caches the leaves the broker presents, one per bound host. Its
// GetCertificate is a tls.Config's.
type Issuer struct {
	ca    *CA
	hosts []string
	life  time.Duration
	now   func() time.Time

	mu     sync.Mutex
	leaves map[string]*tls.Certificate
}

// IssuerOptions configure NewIssuer.
type IssuerOptions struct {
	// CA signs the leaves. Required.
	CA *CA
	// Hosts are the hosts the broker serves; each must be within the CA's constraints (a leaf
	// for another would not verify anyway). Required.
	Hosts []string
	// LeafLifetime is a leaf's life (0: DefaultLeafLifetime).
	LeafLifetime time.Duration
	// Now is the clock (nil: time.Now).
	Now func() time.Time
}

// NewIssuer checks o and returns an Issuer with no leaf minted yet.
func NewIssuer(o IssuerOptions) (*Issuer, error) {
	if o.CA == nil {
		return nil, fmt.Errorf("ca.IssuerOptions.CA is required")
	}
	hosts, err := canonicalHosts("ca.IssuerOptions.Hosts", o.Hosts)
	if err != nil {
		return nil, err
	}
	for _, h := range hosts {
		if !o.CA.Permits(h) {
			return nil, fmt.Errorf("ca.IssuerOptions.Hosts: %q is outside the installation CA's name constraints %v: regenerate the CA with it", h, o.CA.Hosts())
		}
	}
	if o.LeafLifetime == 0 {
		o.LeafLifetime = DefaultLeafLifetime
	}
	if o.LeafLifetime < 0 {
		return nil, fmt.Errorf("ca.IssuerOptions.LeafLifetime must be positive, got %s", o.LeafLifetime)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Issuer{ca: o.CA, hosts: hosts, life: o.LeafLifetime, now: o.Now, leaves: map[string]*tls.Certificate{}}, nil
}

// GetCertificate is tls.Config.GetCertificate: the leaf for the client's server name, minted
// on first use and again once less than half its life is left (so a long-lived connection
// that began with it still has hours of validity, and no client ever sees an expired one). A
// name that is not a bound host fails the handshake (*UnboundHostError).
func (i *Issuer) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	host, err := CanonicalHost(hello.ServerName)
	if err != nil || !slices.Contains(i.hosts, host) {
		return nil, &UnboundHostError{Host: hello.ServerName}
	}
	i.mu.Lock()
	defer i.mu.Unlock() // minting takes ~0.1 ms; one host's first handshakes wait for one mint
	now := i.now()
	if leaf, ok := i.leaves[host]; ok && now.Before(leaf.Leaf.NotAfter.Add(-i.life/2)) {
		return leaf, nil
	}
	leaf, err := i.ca.sign([]string{host}, nil, now, i.life)
	if err != nil {
		return nil, err
	}
	i.leaves[host] = leaf
	return leaf, nil
}

// Hosts are the hosts the issuer serves, canonical.
func (i *Issuer) Hosts() []string { return slices.Clone(i.hosts) }
