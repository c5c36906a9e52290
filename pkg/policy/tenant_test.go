package policy_test

import (
	"errors"
	"regexp"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

const testCompanyID = "3f2b6c1e-7a4d-4e5f-9a8b-0c1d2e3f4a5b"

func mustConfig(t *testing.T, raw string) policy.Config {
	t.Helper()
	cfg, err := policy.ParseConfig([]byte(raw))
	if err != nil {
		t.Fatalf("ParseConfig(%s): %v", raw, err)
	}
	return cfg
}

func mustAdapter(t *testing.T, cfg policy.Config, typ string) policy.AdapterDefaults {
	t.Helper()
	a, err := cfg.Adapter(typ)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func mustTenant(t *testing.T, cfg policy.Config, adapters ...policy.AdapterDefaults) policy.Tenant {
	t.Helper()
	ten, err := policy.RenderTenant(cfg, testCompanyID, testOperator(), adapters...)
	if err != nil {
		t.Fatalf("RenderTenant: %v", err)
	}
	return ten
}

// testOperator allows what the golden configs use: the EKS identity annotation and a private
// range the cilium golden opens (so its deny rule shows the split around it).
func testOperator() policy.Operator {
	op := policy.DefaultOperator()
	op.ServiceAccountAnnotationKeys = []string{"eks.amazonaws.com/role-arn"}
	op.PrivateEgressCIDRs = []string{"10.20.0.0/16"}
	return op
}

func TestTenantGolden(t *testing.T) {
	std := mustConfig(t, `{"serviceAccountAnnotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/paperclip-agent"}}`)
	ten := mustTenant(t, std, mustAdapter(t, std, "claude_local"))
	objs, err := ten.Objects()
	if err != nil {
		t.Fatal(err)
	}
	files := []string{
		"tenant/namespace.yaml", "tenant/serviceaccount.yaml",
		// The workers' per-tenant RBAC.
		"tenant/rolebinding-kubeclip-dispatcher.yaml", "tenant/rolebinding-kubeclip-run-watcher.yaml", "tenant/rolebinding-kubeclip-exec-worker.yaml",
		"tenant/resourcequota.yaml", "tenant/limitrange.yaml", "tenant/networkpolicy-deny-all.yaml",
		"tenant/networkpolicy-sandboxd-ingress.yaml",
		// Default config: no CIDRs, adapter FQDNs -> the public-IPv4 80/443 fallback.
		"tenant/networkpolicy-egress-allow-fallback.yaml",
	}
	if len(objs) != len(files) {
		t.Fatalf("Objects() returned %d objects, want %d", len(objs), len(files))
	}
	wantKinds := []string{"Namespace", "ServiceAccount", "RoleBinding", "RoleBinding", "RoleBinding", "ResourceQuota", "LimitRange", "NetworkPolicy", "NetworkPolicy", "NetworkPolicy"}
	for i, o := range objs {
		if o.GetKind() != wantKinds[i] || o.GetAPIVersion() == "" {
			t.Errorf("object %d is %s %s, want kind %s (apply order)", i, o.GetAPIVersion(), o.GetKind(), wantKinds[i])
		}
		if o.GetLabels()["paperclip.io/managed-by"] != "kubeclip" {
			t.Errorf("%s %s lacks the managed-by label", o.GetKind(), o.GetName())
		}
		checkGolden(t, files[i], o.Object)
	}

	withCIDRs := mustConfig(t, `{
		"egressAllowCidrs": ["10.20.0.0/16", "203.0.113.7/32"],
		"egressAllowFqdns": ["github.com"],
		"paperclipServerNamespace": "paperclip-system",
		"paperclipServerPodLabels": {"app.kubernetes.io/name": "paperclip", "app.kubernetes.io/component": "server"}}`)
	ten = mustTenant(t, withCIDRs, mustAdapter(t, withCIDRs, "claude_local"))
	checkGoldenUnstructured(t, "tenant/networkpolicy-egress-allow-cidrs.yaml", ten.EgressAllow)

	// No FQDNs at all (a registry adapter without any) and no CIDRs: DNS and the server only.
	noFQDNs := mustConfig(t, `{"adapterType": "bare", "adapters": [{"adapterType": "bare", "runtimeImage": "kubeclip.local/agent-stub:dev"}]}`)
	ten = mustTenant(t, noFQDNs, mustAdapter(t, noFQDNs, "bare"))
	checkGoldenUnstructured(t, "tenant/networkpolicy-egress-allow-dns-and-server-only.yaml", ten.EgressAllow)

	cilium := mustConfig(t, `{
		"egressMode": "cilium",
		"egressAllowCidrs": ["10.20.0.0/16"],
		"egressAllowFqdns": ["github.com", "*.githubusercontent.com", "api.openai.com"],
		"paperclipServerNamespace": "paperclip-system",
		"paperclipServerPodLabels": {"app.kubernetes.io/name": "paperclip"}}`)
	ten = mustTenant(t, cilium, mustAdapter(t, cilium, "cursor_local"))
	if ten.EgressAllow != nil {
		t.Errorf("cilium mode rendered a NetworkPolicy egress allow")
	}
	objs, err = ten.Objects()
	if err != nil {
		t.Fatal(err)
	}
	last := objs[len(objs)-1]
	if last.GetAPIVersion() != "cilium.io/v2" || last.GetKind() != "CiliumNetworkPolicy" {
		t.Fatalf("last object is %s %s", last.GetAPIVersion(), last.GetKind())
	}
	checkGolden(t, "tenant/ciliumnetworkpolicy-egress-fqdn.yaml", last.Object)
}

func TestTenantEgressFQDNs(t *testing.T) {
	cfg := mustConfig(t, `{"egressMode": "cilium", "egressAllowFqdns": ["api.openai.com", "github.com"]}`)
	ten := mustTenant(t, cfg, mustAdapter(t, cfg, "claude_local"), mustAdapter(t, cfg, "cursor_local"))
	egress := ten.EgressFQDN.Object["spec"].(map[string]any)["egress"].([]any)
	var got []string
	for _, f := range egress[1].(map[string]any)["toFQDNs"].([]any) {
		got = append(got, f.(map[string]any)["matchName"].(string))
	}
	// Adapters' FQDNs first, then the config's, each once.
	if diff := cmp.Diff([]string{"api.anthropic.com", "api.openai.com", "github.com"}, got); diff != "" {
		t.Errorf("toFQDNs (-want +got):\n%s", diff)
	}
}

func TestRenderTenantErrors(t *testing.T) {
	bad := policy.DefaultConfig()
	bad.EgressMode = "calico"
	if _, err := policy.RenderTenant(bad, testCompanyID, policy.DefaultOperator()); !errors.As(err, new(*policy.ValidationError)) {
		t.Errorf("invalid config: err = %v, want *ValidationError", err)
	}
	_, err := policy.RenderTenant(policy.DefaultConfig(), "acme corp", policy.DefaultOperator())
	var verr *policy.ValidationError
	if !errors.As(err, &verr) || verr.Errors[0].Field != "companyId" {
		t.Errorf("bad company id: err = %v, want a companyId field error", err)
	}
}

func TestTenantHash(t *testing.T) {
	std := policy.DefaultConfig()
	claude := mustAdapter(t, std, "claude_local")
	h1 := mustTenant(t, std, claude).Hash()
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(h1) {
		t.Fatalf("Hash = %q, want 64 hex digits", h1)
	}
	for range 20 { // map iteration order must not leak into the hash
		if h := mustTenant(t, std, claude).Hash(); h != h1 {
			t.Fatalf("same input, different hash: %s vs %s", h, h1)
		}
	}

	tests := []struct {
		name   string
		tenant func() policy.Tenant
	}{
		{"egress mode cilium", func() policy.Tenant {
			c := std
			c.EgressMode = policy.EgressCilium
			return mustTenant(t, c, claude)
		}},
		{"quota changed", func() policy.Tenant {
			ten := mustTenant(t, std, claude)
			ten.ResourceQuota.Spec.Hard["pods"] = resource.MustParse("21")
			return ten
		}},
		{"CIDR added", func() policy.Tenant {
			c := std
			c.EgressAllowCidrs = []string{"10.0.0.0/8"}
			return mustTenant(t, c, claude)
		}},
		{"server namespace", func() policy.Tenant {
			c := std
			c.PaperclipServerNamespace = "paperclip-system"
			return mustTenant(t, c, claude)
		}},
		{"annotation", func() policy.Tenant {
			c := std
			c.ServiceAccountAnnotations = map[string]string{"eks.amazonaws.com/role-arn": "b"}
			return mustTenant(t, c, claude)
		}},
		{"quota from the operator", func() policy.Tenant {
			op := testOperator()
			op.TenantQuota = policy.DefaultTenantQuota()
			op.TenantQuota[corev1.ResourcePods] = resource.MustParse("5")
			ten, err := policy.RenderTenant(std, testCompanyID, op, claude)
			if err != nil {
				t.Fatal(err)
			}
			return ten
		}},
		{"other company", func() policy.Tenant {
			ten, err := policy.RenderTenant(std, "other-company", policy.DefaultOperator(), claude)
			if err != nil {
				t.Fatal(err)
			}
			return ten
		}},
	}
	seen := map[string]string{h1: "default"}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.tenant().Hash()
			if prev, dup := seen[h]; dup {
				t.Errorf("hash equals that of %q", prev)
			}
			seen[h] = tc.name
		})
	}
}

func TestTenantStale(t *testing.T) {
	std := mustTenant(t, policy.DefaultConfig())
	cfg := policy.DefaultConfig()
	cfg.EgressMode = policy.EgressCilium
	cil := mustTenant(t, cfg)
	ns := "paperclip-" + testCompanyID
	tests := []struct {
		name   string
		tenant policy.Tenant
		want   []policy.ObjectRef
	}{
		{"standard deletes the CiliumNetworkPolicy", std, []policy.ObjectRef{{GVK: policy.CiliumNetworkPolicyGVK, GVR: policy.CiliumNetworkPolicyGVR, Namespace: ns, Name: "paperclip-egress-fqdn"}}},
		{"cilium deletes the egress NetworkPolicy", cil, []policy.ObjectRef{{GVK: policy.NetworkPolicyGVK, GVR: policy.NetworkPolicyGVR, Namespace: ns, Name: "paperclip-egress-allow"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.tenant.Stale()); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
