package policy_test

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

// Issue 15 item 16: a toFQDNs rule allows whatever the name resolves to, so a company-owned
// name resolving to a private address (the node, the cloud's metadata service, a corporate
// network) was reachable on 443. The tenant's CiliumNetworkPolicy denies every private or
// reserved range outright (Cilium's deny rules win over any allow, FQDN-learned addresses
// included); ranges the operator opened with --private-egress-cidrs stay reachable.
func TestCiliumEgressDeniesPrivateRanges(t *testing.T) {
	cfg := mustConfig(t, `{"egressMode": "cilium", "egressAllowFqdns": ["git.acme.example"], "egressAllowCidrs": ["10.20.0.0/16"]}`)
	op := policy.DefaultOperator()
	op.PrivateEgressCIDRs = []string{"10.20.0.0/16"}
	ten, err := policy.RenderTenant(cfg, testCompanyID, op, mustAdapter(t, cfg, "claude_local"))
	if err != nil {
		t.Fatal(err)
	}
	denied := ciliumDeniedPrefixes(t, ten.EgressFQDN.Object)
	covered := func(addr string) bool {
		a := netip.MustParseAddr(addr)
		return slices.ContainsFunc(denied, func(p netip.Prefix) bool { return p.Contains(a) })
	}
	for _, addr := range []string{
		"10.0.0.1", "10.21.255.255", "172.16.0.1", "192.168.1.1", "169.254.169.254", "127.0.0.1",
		"100.64.0.1", "0.0.0.1", "224.0.0.1", "fd00:ec2::254", "::1", "fe80::1", "::ffff:10.0.0.1", "64:ff9b::a00:1",
	} {
		if !covered(addr) {
			t.Errorf("egress to %s is not denied", addr)
		}
	}
	for _, addr := range []string{"10.20.0.1", "10.20.255.254", "140.82.112.3", "2606:4700::1111"} {
		if covered(addr) {
			t.Errorf("egress to %s is denied; it is public or a range the operator opened", addr)
		}
	}
}

// ciliumDeniedPrefixes reads spec.egressDeny[*].toCIDRSet[*] (no except lists: the denied
// ranges are laid out whole).
func ciliumDeniedPrefixes(t *testing.T, obj map[string]any) []netip.Prefix {
	t.Helper()
	spec, _ := obj["spec"].(map[string]any)
	var out []netip.Prefix
	for _, rule := range asSlice(spec["egressDeny"]) {
		r, _ := rule.(map[string]any)
		if len(r) != 1 {
			t.Errorf("deny rule %v: want toCIDRSet alone", r)
		}
		for _, c := range asSlice(r["toCIDRSet"]) {
			m, _ := c.(map[string]any)
			if _, ok := m["except"]; ok {
				t.Errorf("deny CIDR %v has an except list (cilium/cilium#20914: excepted addresses are denied too)", m)
			}
			s, _ := m["cidr"].(string)
			p, err := netip.ParsePrefix(s)
			if err != nil {
				t.Fatalf("deny CIDR %q: %v", s, err)
			}
			out = append(out, p)
		}
	}
	return out
}
