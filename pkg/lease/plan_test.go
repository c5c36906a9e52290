package lease_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubeclip/kubeclip/pkg/broker/ca"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// now is deliberately not on a whole second, so the deadline's rounding shows.
var now = time.Date(2026, 8, 24, 10, 30, 0, 123456789, time.UTC)

// acquire is a valid acquire request with mod applied.
func acquire(mod func(*events.AcquireRequest)) events.AcquireRequest {
	req := events.AcquireRequest{
		RunID:         "0b7c2f2e-5d4e-4c1a-9f57-3c2d1e0a9b8c",
		CompanyID:     "acme",
		EnvironmentID: "env-1",
		AgentID:       "agent-1",
		Config:        json.RawMessage(`{}`),
	}
	if mod != nil {
		mod(&req)
	}
	return req
}

func TestNewRefuses(t *testing.T) {
	tests := []struct {
		name      string
		mod       func(*events.AcquireRequest)
		wantCode  events.Code
		wantField string
	}{
		{
			name:     "missing runId",
			mod:      func(r *events.AcquireRequest) { r.RunID = "" },
			wantCode: events.CodeInvalidRequest, wantField: "runId",
		},
		{
			name:     "runId that is not a subject token",
			mod:      func(r *events.AcquireRequest) { r.RunID = "run.1" },
			wantCode: events.CodeInvalidRequest, wantField: "runId",
		},
		{
			name:     "runId that is a subject token but not a label value",
			mod:      func(r *events.AcquireRequest) { r.RunID = "run:1" },
			wantCode: events.CodeInvalidRequest, wantField: "runId",
		},
		{
			name:     "missing agentId",
			mod:      func(r *events.AcquireRequest) { r.AgentID = "" },
			wantCode: events.CodeInvalidRequest, wantField: "agentId",
		},
		{
			name:     "agentId too long for a label value",
			mod:      func(r *events.AcquireRequest) { r.AgentID = strings.Repeat("a", 70) },
			wantCode: events.CodeInvalidRequest, wantField: "agentId",
		},
		{
			name:     "missing companyId",
			mod:      func(r *events.AcquireRequest) { r.CompanyID = "" },
			wantCode: events.CodeInvalidRequest, wantField: "companyId",
		},
		{
			name:     "companyId that is a subject token but 70 characters",
			mod:      func(r *events.AcquireRequest) { r.CompanyID = strings.Repeat("c", 70) },
			wantCode: events.CodeInvalidRequest, wantField: "companyId",
		},
		{
			name:     "missing environmentId",
			mod:      func(r *events.AcquireRequest) { r.EnvironmentID = "" },
			wantCode: events.CodeInvalidRequest, wantField: "environmentId",
		},
		{
			name:     "missing config",
			mod:      func(r *events.AcquireRequest) { r.Config = nil },
			wantCode: events.CodeInvalidRequest, wantField: "config",
		},
		{
			name:     "config null",
			mod:      func(r *events.AcquireRequest) { r.Config = json.RawMessage(`null`) },
			wantCode: events.CodeInvalidRequest, wantField: "config",
		},
		{
			name:     "config not an object",
			mod:      func(r *events.AcquireRequest) { r.Config = json.RawMessage(`["egressMode"]`) },
			wantCode: events.CodeInvalidRequest, wantField: "config",
		},
		{
			name: "invalid CIDR in egressAllowCidrs",
			mod: func(r *events.AcquireRequest) {
				r.Config = json.RawMessage(`{"egressAllowCidrs":["10.0.0.0/8","300.1.1.1/8"]}`)
			},
			wantCode: events.CodeInvalidConfig, wantField: "config.egressAllowCidrs[1]",
		},
		{
			name:     "first of several invalid fields",
			mod:      func(r *events.AcquireRequest) { r.Config = json.RawMessage(`{"egressMode":"open","backend":"vm"}`) },
			wantCode: events.CodeInvalidConfig, wantField: "config.egressMode",
		},
		{
			name:     "inCluster in config",
			mod:      func(r *events.AcquireRequest) { r.Config = json.RawMessage(`{"inCluster":true}`) },
			wantCode: events.CodeInvalidConfig, wantField: "config.inCluster",
		},
		{
			name:     "kubeconfig in config",
			mod:      func(r *events.AcquireRequest) { r.Config = json.RawMessage(`{"kubeconfig":"apiVersion: v1"}`) },
			wantCode: events.CodeInvalidConfig, wantField: "config.kubeconfig",
		},
		{
			name:     "unknown default adapterType in config",
			mod:      func(r *events.AcquireRequest) { r.Config = json.RawMessage(`{"adapterType":"nope_local"}`) },
			wantCode: events.CodeInvalidConfig, wantField: "config.adapterType",
		},
		{
			name:     "unknown per-run adapterType",
			mod:      func(r *events.AcquireRequest) { r.AdapterType = "nope_local" },
			wantCode: events.CodeUnknownAdapter, wantField: "adapterType",
		},
		{
			name: "per-run adapterType the registry replaces",
			mod: func(r *events.AcquireRequest) {
				r.Config = json.RawMessage(`{"adapterType":"mine","adapters":[{"adapterType":"mine","runtimeImage":"reg.example.com/mine:v1"}]}`)
				r.AdapterType = "claude_local"
			},
			wantCode: events.CodeUnknownAdapter, wantField: "adapterType",
		},
		{
			name: "per-run adapterType without a runtimeImage in the registry",
			mod: func(r *events.AcquireRequest) {
				r.Config = json.RawMessage(`{"adapterType":"mine","adapters":[{"adapterType":"mine","runtimeImage":"reg.example.com/mine:v1"},{"adapterType":"bare"}]}`)
				r.AdapterType = "bare"
			},
			wantCode: events.CodeUnknownAdapter, wantField: "adapterType",
		},
		{
			name:     "requestedExpiresAt not RFC 3339",
			mod:      func(r *events.AcquireRequest) { r.RequestedExpiresAt = "tomorrow" },
			wantCode: events.CodeInvalidRequest, wantField: "requestedExpiresAt",
		},
		{
			name:     "requestedExpiresAt in the past",
			mod:      func(r *events.AcquireRequest) { r.RequestedExpiresAt = "2026-08-24T10:00:00Z" },
			wantCode: events.CodeInvalidRequest, wantField: "requestedExpiresAt",
		},
		{
			name:     "requestedExpiresAt less than 30s away",
			mod:      func(r *events.AcquireRequest) { r.RequestedExpiresAt = "2026-08-24T10:30:29Z" },
			wantCode: events.CodeInvalidRequest, wantField: "requestedExpiresAt",
		},
		{
			name: "namespace longer than a DNS label",
			mod: func(r *events.AcquireRequest) {
				r.CompanyID = strings.Repeat("c", 40)
				r.Config = json.RawMessage(`{"namespacePrefix":"` + strings.Repeat("p", 30) + `"}`)
			},
			wantCode: events.CodeInvalidConfig, wantField: "config.namespacePrefix",
		},
		{
			name: "executionWorkspaceSettings not an object",
			mod: func(r *events.AcquireRequest) {
				r.ExecutionWorkspaceSettings = json.RawMessage(`["networkEgress"]`)
			},
			wantCode: events.CodeInvalidRequest, wantField: "executionWorkspaceSettings",
		},
		{
			name: "networkEgress not an object",
			mod: func(r *events.AcquireRequest) {
				r.ExecutionWorkspaceSettings = json.RawMessage(`{"networkEgress":true}`)
			},
			wantCode: events.CodeInvalidRequest, wantField: "executionWorkspaceSettings.networkEgress",
		},
		{
			name: "invalid CIDR in the egress grant",
			mod: func(r *events.AcquireRequest) {
				r.ExecutionWorkspaceSettings = json.RawMessage(`{"networkEgress":{"allowCidrs":["192.168.1.0/24","1.2.3.4/33"]}}`)
			},
			wantCode: events.CodeInvalidRequest, wantField: "executionWorkspaceSettings.networkEgress.allowCidrs[1]",
		},
		// Issue 8: what a hostile config could reach.
		{
			name: "egress into the cluster's networks",
			mod: func(r *events.AcquireRequest) {
				r.Config = json.RawMessage(`{"egressAllowCidrs":["203.0.113.0/24","10.0.0.0/8"]}`)
			},
			wantCode: events.CodeInvalidConfig, wantField: "config.egressAllowCidrs[1]",
		},
		{
			name: "an egress grant into the cluster's networks",
			mod: func(r *events.AcquireRequest) {
				r.ExecutionWorkspaceSettings = json.RawMessage(`{"networkEgress":{"allowCidrs":["169.254.169.254/32"]}}`)
			},
			wantCode: events.CodeInvalidRequest, wantField: "executionWorkspaceSettings.networkEgress.allowCidrs",
		},
		{
			name: "kube- prefix takes over kube-system",
			mod: func(r *events.AcquireRequest) {
				r.Config = json.RawMessage(`{"namespacePrefix":"kube-","companySlug":"system"}`)
			},
			wantCode: events.CodeNamespaceNotAllowed, wantField: "config.namespacePrefix",
		},
		{
			name:     "a prefix the operator did not allow",
			mod:      func(r *events.AcquireRequest) { r.Config = json.RawMessage(`{"namespacePrefix":"other-"}`) },
			wantCode: events.CodeNamespaceNotAllowed, wantField: "config.namespacePrefix",
		},
		{
			name:     "kubeclip's own namespace",
			mod:      func(r *events.AcquireRequest) { r.Config = json.RawMessage(`{"companySlug":"kubeclip"}`) },
			wantCode: events.CodeNamespaceNotAllowed, wantField: "config.companySlug",
		},
		{
			name: "envKeys naming the worker's NATS password",
			mod: func(r *events.AcquireRequest) {
				r.Config = json.RawMessage(`{"adapters":[{"adapterType":"claude_local","runtimeImage":"reg.example.com/mine:v1","envKeys":["ANTHROPIC_API_KEY","KUBECLIP_NATS_PASSWORD"]}]}`)
			},
			wantCode: events.CodeInvalidConfig, wantField: "config.adapters[0].envKeys[1]",
		},
		{
			name: "envKeys naming any operator variable",
			mod: func(r *events.AcquireRequest) {
				r.Config = json.RawMessage(`{"adapterType":"mine","adapters":[{"adapterType":"mine","runtimeImage":"reg.example.com/mine:v1","envKeys":["AWS_SECRET_ACCESS_KEY"]}]}`)
			},
			wantCode: events.CodeInvalidConfig, wantField: "config.adapters[0].envKeys[0]",
		},
		{
			name: "defaultEnv overriding the loader",
			mod: func(r *events.AcquireRequest) {
				r.Config = json.RawMessage(`{"adapterType":"mine","adapters":[{"adapterType":"mine","runtimeImage":"reg.example.com/mine:v1","defaultEnv":{"LD_PRELOAD":"/tmp/x.so"}}]}`)
			},
			wantCode: events.CodeInvalidConfig, wantField: `config.adapters[0].defaultEnv["LD_PRELOAD"]`,
		},
		{
			name: "adapter image outside the allowlist",
			mod: func(r *events.AcquireRequest) {
				r.Config = json.RawMessage(`{"imageAllowList":["registry.example.com/*"]}`)
			},
			wantCode: events.CodeImageNotAllowed, wantField: "config.imageAllowList",
		},
		// Issue 15 item 9: a company's knobs stay inside the operator's bounds.
		{
			name:     "a runtime class the operator did not allow",
			mod:      func(r *events.AcquireRequest) { r.Config = json.RawMessage(`{"runtimeClassName":"runc"}`) },
			wantCode: events.CodeInvalidConfig, wantField: "config.runtimeClassName",
		},
		{
			name: "a cloud identity annotation the operator did not allow",
			mod: func(r *events.AcquireRequest) {
				r.Config = json.RawMessage(`{"serviceAccountAnnotations":{"eks.amazonaws.com/role-arn":"arn:aws:iam::1:role/other-company"}}`)
			},
			wantCode: events.CodeInvalidConfig, wantField: `config.serviceAccountAnnotations["eks.amazonaws.com/role-arn"]`,
		},
		// Issue 15 item 18: bad input from the hostile-request corpus.
		{
			name: "an invalid image reference",
			mod: func(r *events.AcquireRequest) {
				r.Config = json.RawMessage(`{"adapterType":"mine","adapters":[{"adapterType":"mine","runtimeImage":"UPPER/Case@sha256:zz"}]}`)
			},
			wantCode: events.CodeInvalidConfig, wantField: "config.adapters[0].runtimeImage",
		},
		{
			name: "40,000 egress FQDNs",
			mod: func(r *events.AcquireRequest) {
				fqdns := make([]string, 40000)
				for i := range fqdns {
					fqdns[i] = fmt.Sprintf("h%d.example.com", i)
				}
				cfg, _ := json.Marshal(map[string]any{"egressAllowFqdns": fqdns})
				r.Config = cfg
			},
			wantCode: events.CodeInvalidConfig, wantField: "config.egressAllowFqdns",
		},
		{
			name: "a custom adapter naming another adapter's key",
			mod: func(r *events.AcquireRequest) {
				r.Config = json.RawMessage(`{"adapterType":"mine","adapters":[{"adapterType":"mine","runtimeImage":"reg.example.com/mine:v1","envKeys":["ANTHROPIC_API_KEY","OPENAI_API_KEY"]}]}`)
			},
			wantCode: events.CodeInvalidConfig, wantField: "config.adapters[0].envKeys[0]",
		},
		{
			name: "a built-in adapter naming another built-in's key",
			mod: func(r *events.AcquireRequest) {
				r.Config = json.RawMessage(`{"adapters":[{"adapterType":"claude_local","runtimeImage":"reg.example.com/claude:v1","envKeys":["ANTHROPIC_API_KEY","OPENAI_API_KEY"]}]}`)
			},
			wantCode: events.CodeInvalidConfig, wantField: "config.adapters[0].envKeys[1]",
		},
		{
			name: "an egress grant of 40,000 FQDNs",
			mod: func(r *events.AcquireRequest) {
				fqdns := make([]string, 40000)
				for i := range fqdns {
					fqdns[i] = fmt.Sprintf("h%d.example.com", i)
				}
				ews, _ := json.Marshal(map[string]any{"networkEgress": map[string]any{"allowFqdns": fqdns}})
				r.ExecutionWorkspaceSettings = ews
			},
			wantCode: events.CodeInvalidRequest, wantField: "executionWorkspaceSettings.networkEgress.allowFqdns",
		},
		{
			name: "a deadline that overflows TTLs",
			mod: func(r *events.AcquireRequest) {
				r.Config = json.RawMessage(`{"podActivityDeadlineSec":9007199254740991}`)
			},
			wantCode: events.CodeInvalidConfig, wantField: "config.podActivityDeadlineSec",
		},
		{
			name: "invalid FQDN in the egress grant",
			mod: func(r *events.AcquireRequest) {
				r.ExecutionWorkspaceSettings = json.RawMessage(`{"networkEgress":{"allowFqdns":["bad host"]}}`)
			},
			wantCode: events.CodeInvalidRequest, wantField: "executionWorkspaceSettings.networkEgress.allowFqdns[0]",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := lease.New(acquire(tc.mod), now, testOperator)
			if err == nil {
				t.Fatalf("New() planned image %s in %s, want an error", plan.Image, plan.Namespace)
			}
			te, ok := events.AsTerminal(err)
			if !ok {
				t.Fatalf("New() error %v (%T) is not a TerminalError", err, err)
			}
			if diff := cmp.Diff(tc.wantCode, te.Code); diff != "" {
				t.Errorf("code (-want +got):\n%s\nerror: %v", diff, err)
			}
			if diff := cmp.Diff(tc.wantField, te.Field); diff != "" {
				t.Errorf("field (-want +got):\n%s\nerror: %v", diff, err)
			}
			// The field goes in front of the message once, not twice.
			if strings.Count(te.Error(), tc.wantField+":") > 1 {
				t.Errorf("error %q repeats its field", te.Error())
			}
		})
	}
}

// testOperator allows a second prefix and reserves kubeclip's namespace, as the workers' flags
// would.
var testOperator = policy.Operator{
	NamespacePrefixes:       []string{"paperclip-", "t-"},
	ReservedNamespaces:      []string{"paperclip-kubeclip"},
	MaxNamespacesPerCompany: 3,
}

func TestNewPlans(t *testing.T) {
	tests := []struct {
		name          string
		mod           func(*events.AcquireRequest)
		wantNamespace string
		wantAdapter   string
		wantImage     string
		wantDeadline  *policy.LeaseDeadline
		wantGrant     policy.EgressGrant
	}{
		{
			name:          "defaults",
			wantNamespace: "paperclip-acme",
			wantAdapter:   "claude_local",
			wantImage:     "ghcr.io/paperclipai/agent-runtime-claude:v1",
			// The default backend (sandbox-cr) is exec-capable: its pod's activity deadline is
			// the lease's real expiry, counted from now's second.
			wantDeadline: &policy.LeaseDeadline{ActiveDeadlineSeconds: 3600, HardStopAt: time.Date(2026, 8, 24, 11, 30, 0, 0, time.UTC)},
			wantGrant:    policy.EgressGrant{AllowFqdns: []string{}, AllowCidrs: []string{}},
		},
		{
			name:          "a job lease has no expiry of its own",
			mod:           func(r *events.AcquireRequest) { r.Config = json.RawMessage(`{"backend":"job"}`) },
			wantNamespace: "paperclip-acme",
			wantAdapter:   "claude_local",
			wantImage:     "ghcr.io/paperclipai/agent-runtime-claude:v1",
			wantGrant:     policy.EgressGrant{AllowFqdns: []string{}, AllowCidrs: []string{}},
		},
		{
			name: "per-run adapter, registry mirror and a bounded lease",
			mod: func(r *events.AcquireRequest) {
				r.CompanyID = "Acme_Corp"
				r.AdapterType = " codex_local "
				r.RequestedExpiresAt = "2026-08-24T11:30:00Z"
				r.Config = json.RawMessage(`{"namespacePrefix":"t-","imageRegistry":"registry.example.com/mirror/"}`)
			},
			wantNamespace: "t-acme-corp-e45676e9",
			wantAdapter:   "codex_local",
			wantImage:     "registry.example.com/mirror/agent-runtime-codex:v1",
			// 3599.877 s until the requested expiry: whole seconds, counted from now's second.
			wantDeadline: &policy.LeaseDeadline{ActiveDeadlineSeconds: 3599, HardStopAt: time.Date(2026, 8, 24, 11, 29, 59, 0, time.UTC)},
			wantGrant:    policy.EgressGrant{AllowFqdns: []string{}, AllowCidrs: []string{}},
		},
		{
			name: "companySlug and a lease capped at 24h",
			mod: func(r *events.AcquireRequest) {
				r.RequestedExpiresAt = "2026-08-30T00:00:00+02:00"
				r.Config = json.RawMessage(`{"companySlug":"widgets"}`)
			},
			wantNamespace: "paperclip-widgets",
			wantAdapter:   "claude_local",
			wantImage:     "ghcr.io/paperclipai/agent-runtime-claude:v1",
			wantDeadline:  &policy.LeaseDeadline{ActiveDeadlineSeconds: policy.MaxActiveDeadlineSec, HardStopAt: time.Date(2026, 8, 25, 10, 30, 0, 0, time.UTC)},
			wantGrant:     policy.EgressGrant{AllowFqdns: []string{}, AllowCidrs: []string{}},
		},
		{
			name: "registry adapter and an egress grant",
			mod: func(r *events.AcquireRequest) {
				r.Config = json.RawMessage(`{"adapterType":"mine","adapters":[{"adapterType":"mine","runtimeImage":"reg.example.com/mine:v2"}]}`)
				r.ExecutionWorkspaceSettings = json.RawMessage(`{"networkEgress":{"allowFqdns":[" Example.COM ","example.com"],"allowCidrs":["203.0.113.0/24"]},"other":1}`)
			},
			wantNamespace: "paperclip-acme",
			wantAdapter:   "mine",
			wantImage:     "reg.example.com/mine:v2",
			wantDeadline:  &policy.LeaseDeadline{ActiveDeadlineSeconds: 3600, HardStopAt: time.Date(2026, 8, 24, 11, 30, 0, 0, time.UTC)},
			wantGrant:     policy.EgressGrant{AllowFqdns: []string{"example.com"}, AllowCidrs: []string{"203.0.113.0/24"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := acquire(tc.mod)
			plan, err := lease.New(req, now, testOperator)
			if err != nil {
				t.Fatalf("New() error: %v", err)
			}
			if diff := cmp.Diff(tc.wantNamespace, plan.Namespace); diff != "" {
				t.Errorf("namespace (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantAdapter, plan.AdapterType); diff != "" {
				t.Errorf("adapter type (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantAdapter, plan.Adapter.AdapterType); diff != "" {
				t.Errorf("adapter defaults' type (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantImage, plan.Image); diff != "" {
				t.Errorf("image (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantDeadline, plan.Deadline); diff != "" {
				t.Errorf("deadline (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantGrant, plan.Grant); diff != "" {
				t.Errorf("egress grant (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(req, plan.Request); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}

			var wantExpires *time.Time
			var wantSecs *int64
			if tc.wantDeadline != nil {
				wantExpires = &tc.wantDeadline.HardStopAt
				wantSecs = &tc.wantDeadline.ActiveDeadlineSeconds
			}
			if diff := cmp.Diff(wantExpires, plan.ExpiresAt()); diff != "" {
				t.Errorf("ExpiresAt() (-want +got):\n%s", diff)
			}
			spec := plan.RunSpec("pc-01jabcdefghjkmnpqrstvwxyz0")
			if err := spec.Validate(); err != nil {
				t.Errorf("RunSpec().Validate() error: %v", err)
			}
			wantSpec := policy.RunSpec{
				RunID: req.RunID, CompanyID: req.CompanyID, AgentID: req.AgentID, IssueID: req.IssueID,
				AdapterType: tc.wantAdapter, Namespace: tc.wantNamespace, WorkloadName: "pc-01jabcdefghjkmnpqrstvwxyz0",
				Image: tc.wantImage, ImagePullPolicy: corev1.PullAlways, Config: plan.Config, ActiveDeadlineSeconds: wantSecs,
			}
			if diff := cmp.Diff(wantSpec, spec); diff != "" {
				t.Errorf("RunSpec() (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTenantEgressCoversDefaultAndRunAdapters pins that a per-run adapter override adds its
// FQDNs to the tenant policy after the config's default adapter's, so the applied policy does
// not flap between adapters.
func TestTenantEgressCoversDefaultAndRunAdapters(t *testing.T) {
	tests := []struct {
		name        string
		config      string
		adapterType string
		wantFQDNs   []string
	}{
		{
			name:      "default adapter only",
			config:    `{"egressMode":"cilium","egressAllowFqdns":["git.example.com"]}`,
			wantFQDNs: []string{"api.anthropic.com", "git.example.com"},
		},
		{
			name:        "per-run override adds its FQDNs after the default's",
			config:      `{"egressMode":"cilium","egressAllowFqdns":["git.example.com"]}`,
			adapterType: "gemini_local",
			wantFQDNs:   []string{"api.anthropic.com", "generativelanguage.googleapis.com", "git.example.com"},
		},
		{
			name:        "override sharing FQDNs with the default lists each once",
			config:      `{"egressMode":"cilium","egressAllowFqdns":["api.openai.com","*.example.com"]}`,
			adapterType: "cursor_local",
			wantFQDNs:   []string{"api.anthropic.com", "api.openai.com", "*.example.com"},
		},
		{
			name:        "override naming the default adapter",
			config:      `{"egressMode":"cilium","adapterType":"codex_local"}`,
			adapterType: "codex_local",
			wantFQDNs:   []string{"api.openai.com"},
		},
		{
			name: "registry adapters",
			config: `{"egressMode":"cilium","adapterType":"a","adapters":[` +
				`{"adapterType":"a","runtimeImage":"r/a:1","allowFqdns":["a.example.com"]},` +
				`{"adapterType":"b","runtimeImage":"r/b:1","allowFqdns":["b.example.com"]}]}`,
			adapterType: "b",
			wantFQDNs:   []string{"a.example.com", "b.example.com"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := lease.New(acquire(func(r *events.AcquireRequest) {
				r.Config = json.RawMessage(tc.config)
				r.AdapterType = tc.adapterType
			}), now, policy.DefaultOperator())
			if err != nil {
				t.Fatalf("New() error: %v", err)
			}
			tenant, err := plan.Tenant()
			if err != nil {
				t.Fatalf("Tenant() error: %v", err)
			}
			if tenant.EgressFQDN == nil {
				t.Fatal("Tenant() rendered no CiliumNetworkPolicy in cilium mode")
			}
			if diff := cmp.Diff(tc.wantFQDNs, ciliumFQDNs(t, tenant.EgressFQDN.Object)); diff != "" {
				t.Errorf("toFQDNs (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTenantStandardModeFallsBackToPublicHTTPS checks the standard-mode side of the same
// decision: FQDNs cannot be named in a NetworkPolicy, so a run whose adapter needs any gets
// public HTTPS.
func TestTenantStandardModeFallsBackToPublicHTTPS(t *testing.T) {
	plan, err := lease.New(acquire(func(r *events.AcquireRequest) { r.AdapterType = "codex_local" }), now, policy.DefaultOperator())
	if err != nil {
		t.Fatalf("New() error: %v", err)
	}
	tenant, err := plan.Tenant()
	if err != nil {
		t.Fatalf("Tenant() error: %v", err)
	}
	if tenant.EgressAllow == nil || tenant.EgressFQDN != nil {
		t.Fatalf("standard mode rendered EgressAllow=%v EgressFQDN=%v, want only EgressAllow", tenant.EgressAllow != nil, tenant.EgressFQDN != nil)
	}
	var cidrs []string
	for _, rule := range tenant.EgressAllow.Spec.Egress {
		for _, peer := range rule.To {
			if peer.IPBlock != nil {
				cidrs = append(cidrs, peer.IPBlock.CIDR)
			}
		}
	}
	if diff := cmp.Diff([]string{"0.0.0.0/0"}, cidrs); diff != "" {
		t.Errorf("IP blocks (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(plan.Namespace, tenant.Namespace.Name); diff != "" {
		t.Errorf("tenant namespace (-want +got):\n%s", diff)
	}
}

// ciliumFQDNs lists the matchName and matchPattern entries of a CiliumNetworkPolicy's toFQDNs
// rules, in order.
func ciliumFQDNs(t *testing.T, obj map[string]any) []string {
	t.Helper()
	spec, _ := obj["spec"].(map[string]any)
	egress, _ := spec["egress"].([]any)
	var out []string
	for _, r := range egress {
		rule, _ := r.(map[string]any)
		fqdns, _ := rule["toFQDNs"].([]any)
		for _, f := range fqdns {
			m, _ := f.(map[string]any)
			for _, k := range []string{"matchName", "matchPattern"} {
				if s, ok := m[k].(string); ok {
					out = append(out, s)
				}
			}
		}
	}
	return out
}

// TestPlanWiresEveryRunToTheBroker: the operator's broker wiring reaches every run's spec (so
// the dispatcher's pods carry it, warm ones included) and the tenant (its CA ConfigMap), for
// every company alike; without it neither has any.
func TestPlanWiresEveryRunToTheBroker(t *testing.T) {
	authority, err := ca.Generate(ca.Options{Hosts: []string{"api.openai.com"}})
	if err != nil {
		t.Fatal(err)
	}
	op := policy.DefaultOperator()
	op.Broker = policy.Broker{Address: "10.96.0.42", Hosts: []string{"api.openai.com"}, CACert: string(authority.CertPEM())}
	for _, tc := range []struct {
		name string
		op   policy.Operator
		want policy.Broker
	}{
		{"wired", op, op.Broker},
		{"not wired", policy.DefaultOperator(), policy.Broker{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := lease.New(acquire(func(r *events.AcquireRequest) { r.AdapterType = "codex_local" }), now, tc.op)
			if err != nil {
				t.Fatalf("New() error: %v", err)
			}
			if diff := cmp.Diff(tc.want, plan.RunSpec("pc-1").Broker); diff != "" {
				t.Errorf("RunSpec().Broker (-want +got):\n%s", diff)
			}
			tenant, err := plan.Tenant()
			if err != nil {
				t.Fatal(err)
			}
			if got := tenant.BrokerCA != nil; got != tc.want.Enabled() {
				t.Errorf("tenant holds the broker's CA: %v, want %v", got, tc.want.Enabled())
			}
		})
	}
}
