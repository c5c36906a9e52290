package policy_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

func TestParseEgressGrant(t *testing.T) {
	const p = "executionWorkspaceSettings.networkEgress"
	tests := []struct {
		name    string
		raw     string
		want    policy.EgressGrant
		wantErr []policy.FieldError
	}{
		{name: "absent", raw: ``, want: policy.EgressGrant{AllowFqdns: []string{}, AllowCidrs: []string{}}},
		{name: "null", raw: `null`, want: policy.EgressGrant{AllowFqdns: []string{}, AllowCidrs: []string{}}},
		{name: "no networkEgress", raw: `{"other": 1}`, want: policy.EgressGrant{AllowFqdns: []string{}, AllowCidrs: []string{}}},
		{name: "null networkEgress", raw: `{"networkEgress": null}`, want: policy.EgressGrant{AllowFqdns: []string{}, AllowCidrs: []string{}}},
		{
			name: "trimmed, lower-cased, deduplicated, empty dropped",
			raw:  `{"networkEgress": {"allowFqdns": [" GitHub.com ", "github.com", "", "*.npmjs.org"], "allowCidrs": ["10.0.0.0/8", " 10.0.0.0/8", "  "], "future": true}}`,
			want: policy.EgressGrant{AllowFqdns: []string{"github.com", "*.npmjs.org"}, AllowCidrs: []string{"10.0.0.0/8"}},
		},
		{name: "bad CIDR named by index", raw: `{"networkEgress": {"allowCidrs": ["10.0.0.0/8", "10.0.0.0/33"]}}`,
			wantErr: []policy.FieldError{{p + ".allowCidrs[1]", `invalid IPv4 CIDR "10.0.0.0/33": prefix length 33 is out of range 0-32`}}},
		{name: "bad FQDN", raw: `{"networkEgress": {"allowFqdns": ["http://github.com"]}}`,
			wantErr: []policy.FieldError{{p + ".allowFqdns[0]", `invalid DNS name "http://github.com"` + msgDNSNameRule}}},
		{name: "non-string entry", raw: `{"networkEgress": {"allowFqdns": ["github.com", 7]}}`,
			wantErr: []policy.FieldError{{p + ".allowFqdns[1]", "expected a string, got number"}}},
		{name: "list not array", raw: `{"networkEgress": {"allowCidrs": "10.0.0.0/8"}}`,
			wantErr: []policy.FieldError{{p + ".allowCidrs", "expected an array of strings, got string"}}},
		{name: "networkEgress not object", raw: `{"networkEgress": ["github.com"]}`,
			wantErr: []policy.FieldError{{p, "expected an object, got array"}}},
		{name: "settings not object", raw: `"x"`,
			wantErr: []policy.FieldError{{"executionWorkspaceSettings", "expected an object, got string"}}},
		// Found by FuzzParseEgressGrant: a refused key was named relative to the settings.
		{name: "duplicate key", raw: `{"networkEgress": {"allowFqdns": [], "allowFqdns": ["x"]}}`,
			wantErr: []policy.FieldError{{p + ".allowFqdns", "duplicate key"}}},
		{name: "invalid JSON", raw: `{`,
			wantErr: []policy.FieldError{{"executionWorkspaceSettings", "invalid JSON: unexpected end of input"}}},
		{name: "all problems reported", raw: `{"networkEgress": {"allowFqdns": ["a b"], "allowCidrs": ["1.2.3.4/8"]}}`,
			wantErr: []policy.FieldError{
				{p + ".allowFqdns[0]", `invalid DNS name "a b"` + msgDNSNameRule},
				{p + ".allowCidrs[0]", `invalid IPv4 CIDR "1.2.3.4/8": bits are set beyond the /8 prefix (did you mean 1.0.0.0/8 or 1.2.3.4/32?)`},
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := policy.ParseEgressGrant([]byte(tc.raw))
			if tc.wantErr != nil {
				var verr *policy.ValidationError
				if !errors.As(err, &verr) {
					t.Fatalf("error = %v, want *ValidationError", err)
				}
				if diff := cmp.Diff(tc.wantErr, verr.Errors); diff != "" {
					t.Errorf("(-want +got):\n%s", diff)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestEgressGrantEnv(t *testing.T) {
	got := policy.EgressGrantEnv(policy.EgressGrant{AllowFqdns: []string{"a.com", "b.com"}, AllowCidrs: []string{}})
	want := map[string]string{
		"PAPERCLIP_NETWORK_EGRESS_POLICY":      "kubernetes-default-deny",
		"PAPERCLIP_NETWORK_EGRESS_GRANT_PATH":  "executionWorkspaceSettings.networkEgress",
		"PAPERCLIP_NETWORK_EGRESS_ALLOW_FQDNS": "a.com,b.com",
		"PAPERCLIP_NETWORK_EGRESS_ALLOW_CIDRS": "",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestRenderScopedEgress(t *testing.T) {
	owner := policy.OwnerReference("batch/v1", "Job", testWorkload, testUID)
	cilium := policy.DefaultConfig()
	cilium.EgressMode = policy.EgressCilium
	both := policy.EgressGrant{AllowFqdns: []string{"github.com", "*.npmjs.org"}, AllowCidrs: []string{"140.82.112.0/20"}}
	fqdnsOnly := policy.EgressGrant{AllowFqdns: []string{"github.com"}, AllowCidrs: []string{}}
	tests := []struct {
		name   string
		cfg    policy.Config
		grant  policy.EgressGrant
		golden string
	}{
		{"standard with CIDRs", policy.DefaultConfig(), both, "run/scoped-egress-standard.yaml"},
		{"standard FQDNs only falls back to public IPv4", policy.DefaultConfig(), fqdnsOnly, "run/scoped-egress-standard-fqdns-only.yaml"},
		{"cilium", cilium, both, "run/scoped-egress-cilium.yaml"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u, err := policy.RenderScopedEgress(testRunSpec(tc.cfg), tc.grant, owner)
			if err != nil {
				t.Fatal(err)
			}
			if u.GetName() != testWorkload+"-egress" {
				t.Errorf("name = %q", u.GetName())
			}
			checkGolden(t, tc.golden, u.Object)
		})
	}

	u, err := policy.RenderScopedEgress(testRunSpec(policy.DefaultConfig()), policy.EgressGrant{}, owner)
	if u != nil || err != nil {
		t.Errorf("empty grant rendered %v, %v; want nil, nil", u, err)
	}
	if _, err := policy.RenderScopedEgress(testRunSpec(policy.DefaultConfig()), both, policy.OwnerReference("batch/v1", "Job", testWorkload, "")); err == nil {
		t.Errorf("an owner without uid was accepted")
	}
}

// The CiliumNetworkPolicies kubeclip renders fit Cilium's CRD schema (as the test cluster
// installs it); in particular a wildcard FQDN goes to matchPattern, whose pattern allows '*'
// where matchName's does not.
func TestCiliumPoliciesMatchCRDSchema(t *testing.T) {
	schema := loadCRDSchemas(t, "cilium.io_ciliumnetworkpolicies.yaml")["v2"]
	cfg := mustConfig(t, `{"egressMode": "cilium", "egressAllowCidrs": ["10.20.0.0/16"], "egressAllowFqdns": ["*.githubusercontent.com", "github.com"],
		"paperclipServerPodLabels": {"app.kubernetes.io/name": "paperclip"}}`)
	tenant := mustTenant(t, cfg, mustAdapter(t, cfg, "claude_local"))
	scoped, err := policy.RenderScopedEgress(testRunSpec(cfg), policy.EgressGrant{AllowFqdns: []string{"*.npmjs.org"}, AllowCidrs: []string{"140.82.112.0/20"}},
		policy.OwnerReference("batch/v1", "Job", testWorkload, testUID))
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range []map[string]any{tenant.EgressFQDN.Object, scoped.Object} {
		var problems []string
		checkSchema("", u, schema, &problems)
		if len(problems) > 0 {
			t.Errorf("%s does not match the CRD schema:\n%v", u["metadata"].(map[string]any)["name"], problems)
		}
	}
	// The walker catches a wildcard in matchName, which upstream rendered.
	var problems []string
	checkSchema("", map[string]any{"spec": map[string]any{"egress": []any{map[string]any{"toFQDNs": []any{map[string]any{"matchName": "*.x.com"}}}}}}, schema, &problems)
	if len(problems) == 0 {
		t.Errorf("schema walker accepted matchName *.x.com")
	}
}
