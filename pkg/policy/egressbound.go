package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// reservedIPv4 is the address space that is not the public internet: where a cluster's pods,
// Services and nodes, the API server, kubeclip's NATS and the cloud's metadata service live.
// A company may open egress only to public addresses unless the operator allows a range
// (Operator.PrivateEgressCIDRs); the public-IPv4 fallback rule carves out the same ranges.
var reservedIPv4 = mustPrefixes(publicIPv4Except...)

// CheckEgress reports the egress a company's config opens inside the installation: an
// egressAllowCidrs entry that overlaps a private or reserved range and lies outside every range
// the operator allows, and an FQDN (egressAllowFqdns, adapters[].allowFqdns) of the cluster's own
// DNS, which an FQDN-aware policy would resolve to a Service; and a paperclipServerNamespace
// (whose pods the tenant may reach on the server's port) that is neither the default nor one the
// operator reserved, so it can never be kubeclip's own, Kubernetes' or another tenant's.
// Errors name each field.
func (o Operator) CheckEgress(cfg Config) error {
	var errs fieldErrors
	if ns := cfg.PaperclipServerNamespace; ns != DefaultPaperclipServerNamespace && !slices.Contains(o.ReservedNamespaces, ns) {
		errs.add("paperclipServerNamespace", fmt.Sprintf("%s is not a namespace the operator reserved for the Paperclip server (--reserved-namespaces)", quoteShort(ns)))
	}
	for i, c := range cfg.EgressAllowCidrs {
		if reason := o.privateCIDR(c); reason != "" {
			errs.add(fmt.Sprintf("egressAllowCidrs[%d]", i), reason)
		}
	}
	for i, f := range cfg.EgressAllowFqdns {
		if reason := clusterFQDN(f); reason != "" {
			errs.add(fmt.Sprintf("egressAllowFqdns[%d]", i), reason)
		}
	}
	for i, a := range cfg.Adapters {
		for j, f := range a.AllowFqdns {
			if reason := clusterFQDN(f); reason != "" {
				errs.add(fmt.Sprintf("adapters[%d].allowFqdns[%d]", i, j), reason)
			}
		}
	}
	return errs.err()
}

// CheckEgressGrant is CheckEgress for a run's grant (executionWorkspaceSettings.networkEgress),
// which the company's workspace settings control as much as its config.
func (o Operator) CheckEgressGrant(g EgressGrant) error {
	var errs fieldErrors
	for _, c := range g.AllowCidrs {
		if reason := o.privateCIDR(c); reason != "" {
			errs.add(EgressGrantPath+".allowCidrs", reason)
		}
	}
	for _, f := range g.AllowFqdns {
		if reason := clusterFQDN(f); reason != "" {
			errs.add(EgressGrantPath+".allowFqdns", reason)
		}
	}
	return errs.err()
}

// privateCIDR says why cidr (already validated) reaches into a reserved range the operator did
// not open, "" when it does not.
func (o Operator) privateCIDR(cidr string) string {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return fmt.Sprintf("%s is not an IPv4 CIDR", quoteShort(cidr))
	}
	for _, allowed := range o.PrivateEgressCIDRs {
		if a, err := netip.ParsePrefix(allowed); err == nil && a.Bits() <= p.Bits() && a.Contains(p.Addr()) {
			return ""
		}
	}
	for _, r := range reservedIPv4 {
		if r.Overlaps(p) {
			return fmt.Sprintf("%s reaches %s, a private or reserved range tenants may not open egress to (the operator can allow ranges with --private-egress-cidrs)", cidr, r)
		}
	}
	return ""
}

// clusterFQDN says why name is the cluster's own DNS or a host-local one, "" when it is not:
// a single label, localhost, and names under .local, .internal (cloud metadata), .svc or any
// <service>.<namespace>.svc.<cluster domain>.
func clusterFQDN(name string) string {
	n := strings.TrimSuffix(strings.ToLower(name), ".")
	switch {
	case !strings.Contains(n, "."), n == "localhost",
		strings.HasSuffix(n, ".localhost"), strings.HasSuffix(n, ".local"), strings.HasSuffix(n, ".internal"),
		strings.HasSuffix(n, ".svc"), strings.Contains(n, ".svc."):
		return fmt.Sprintf("%s names the cluster's or the host's own DNS, which tenants may not open egress to", quoteShort(name))
	}
	return ""
}

// globalIPv6 is the IPv6 space of the public internet (global unicast). Everything outside it
// (loopback, IPv4-mapped and NAT64 addresses, unique-local, link-local, multicast) leads into a
// host, a cluster or a cloud, as the IPv4 ranges of reservedIPv4 do.
var globalIPv6 = netip.MustParsePrefix("2000::/3")

// EgressDenyCIDRs is the address space a tenant pod may never reach through an FQDN: every
// private or reserved IPv4 range except those the operator opened (PrivateEgressCIDRs), and all
// IPv6 outside global unicast. The ranges are disjoint and cover exactly that space, without
// except lists: Cilium denies the excepted addresses of a deny rule too (cilium/cilium#20914).
//
// Why a deny list: a toFQDNs rule allows whatever addresses the name resolves to, and a company
// owns names it can point at 10.0.0.1 or 169.254.169.254. Cilium has no except for FQDN rules,
// but its deny rules take precedence over every allow rule, and a CIDR selector selects the
// addresses an FQDN rule learned (their identities carry the enclosing prefixes' cidr labels).
//
// The broker's address (Operator.Broker) is left out too: it is a ClusterIP or another private
// address, and the tenant policy allows it on port 443 (deny would win over that allow).
func (o Operator) EgressDenyCIDRs() []string {
	var allowed []netip.Prefix
	for _, c := range o.PrivateEgressCIDRs {
		if p, err := netip.ParsePrefix(c); err == nil {
			allowed = append(allowed, p.Masked())
		}
	}
	if p, err := netip.ParsePrefix(o.Broker.addressCIDR()); o.Broker.Enabled() && err == nil {
		allowed = append(allowed, p)
	}
	var out []string
	for _, r := range reservedIPv4 {
		for _, p := range subtractPrefixes(r, allowed) {
			out = append(out, p.String())
		}
	}
	for _, p := range subtractPrefixes(netip.MustParsePrefix("::/0"), append([]netip.Prefix{globalIPv6}, allowed...)) {
		out = append(out, p.String())
	}
	return out
}

// subtractPrefixes returns the prefixes that cover p except the addresses of holes: p itself
// when no hole overlaps it, nothing when a hole covers it, else the pieces of its two halves.
func subtractPrefixes(p netip.Prefix, holes []netip.Prefix) []netip.Prefix {
	p = p.Masked()
	overlaps := false
	for _, h := range holes {
		if h.Addr().Is4() != p.Addr().Is4() {
			continue
		}
		if h.Bits() <= p.Bits() && h.Contains(p.Addr()) {
			return nil
		}
		overlaps = overlaps || h.Overlaps(p)
	}
	if !overlaps {
		return []netip.Prefix{p}
	}
	bits := p.Bits()
	upper := p.Addr().AsSlice()
	upper[bits/8] |= 0x80 >> (bits % 8)
	hi, _ := netip.AddrFromSlice(upper)
	return append(subtractPrefixes(netip.PrefixFrom(p.Addr(), bits+1), holes),
		subtractPrefixes(netip.PrefixFrom(hi, bits+1), holes)...)
}

// checkPrivateEgressCIDRs validates the operator's ranges.
func checkPrivateEgressCIDRs(cidrs []string) []error {
	var errs []error
	for _, c := range cidrs {
		if msg := checkIPv4CIDR(c); msg != "" {
			errs = append(errs, fmt.Errorf("private egress range: %s", msg))
		}
	}
	return errs
}

func mustPrefixes(cidrs ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(cidrs))
	for i, c := range cidrs {
		out[i] = netip.MustParsePrefix(c)
	}
	return out
}
