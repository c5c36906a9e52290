package policy_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

// TestEgressStaysOutsideTheInstallation: a company's egress CIDRs and FQDNs could open its pods
// a way to kubeclip's NATS, the API server, other tenants' pods or the cloud's metadata service.
// Only public ranges, or private ones the operator opened, are accepted.
func TestEgressStaysOutsideTheInstallation(t *testing.T) {
	corp := policy.DefaultOperator()
	corp.PrivateEgressCIDRs = []string{"10.20.0.0/16"}
	def := policy.DefaultOperator()
	paperclipSystem := policy.DefaultOperator()
	paperclipSystem.ReservedNamespaces = []string{"paperclip-system"}
	tests := []struct {
		name   string
		op     policy.Operator
		config string
		want   []string // refused fields
	}{
		{"public ranges", def, `{"egressAllowCidrs":["203.0.113.0/24","8.8.8.8/32"],"egressAllowFqdns":["api.example.com"]}`, nil},
		{"everything", def, `{"egressAllowCidrs":["0.0.0.0/0"]}`, []string{"egressAllowCidrs[0]"}},
		{"a public range holding a private one", def, `{"egressAllowCidrs":["8.0.0.0/6"]}`, []string{"egressAllowCidrs[0]"}},
		{"the pod network", def, `{"egressAllowCidrs":["8.8.8.8/32","10.244.0.0/16"]}`, []string{"egressAllowCidrs[1]"}},
		{"cloud metadata", def, `{"egressAllowCidrs":["169.254.169.254/32"]}`, []string{"egressAllowCidrs[0]"}},
		{"loopback", def, `{"egressAllowCidrs":["127.0.0.1/32"]}`, []string{"egressAllowCidrs[0]"}},
		{"the operator's range", corp, `{"egressAllowCidrs":["10.20.0.0/16","10.20.3.0/24"]}`, nil},
		{"wider than the operator's range", corp, `{"egressAllowCidrs":["10.0.0.0/8","10.21.0.0/16"]}`, []string{"egressAllowCidrs[0]", "egressAllowCidrs[1]"}},
		{"cluster DNS", def, `{"egressAllowFqdns":["nats.kubeclip.svc.cluster.local","kubernetes.default.svc","*.svc.corp.example"]}`,
			[]string{"egressAllowFqdns[0]", "egressAllowFqdns[1]", "egressAllowFqdns[2]"}},
		{"host names", def, `{"egressAllowFqdns":["localhost","metadata.google.internal","printer.local"]}`,
			[]string{"egressAllowFqdns[0]", "egressAllowFqdns[1]", "egressAllowFqdns[2]"}},
		{"an adapter's FQDNs", def, `{"adapterType":"a","adapters":[{"adapterType":"a","runtimeImage":"r/a:1","allowFqdns":["api.example.com","nats.kubeclip.svc"]}]}`,
			[]string{"adapters[0].allowFqdns[1]"}},
		{"the Paperclip server's namespace", paperclipSystem, `{"paperclipServerNamespace":"paperclip-system"}`, nil},
		{"a Paperclip server namespace the operator did not reserve", def, `{"paperclipServerNamespace":"paperclip-system"}`, []string{"paperclipServerNamespace"}},
		{"a Paperclip server among the workers", def, `{"paperclipServerNamespace":"kubeclip","paperclipServerPodLabels":{"app.kubernetes.io/name":"nats"}}`,
			[]string{"paperclipServerNamespace"}},
		{"a Paperclip server among the tenants", def, `{"paperclipServerNamespace":"paperclip-other"}`, []string{"paperclipServerNamespace"}},
		{"a Paperclip server in kube-system", def, `{"paperclipServerNamespace":"kube-system"}`, []string{"paperclipServerNamespace"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := policy.ParseConfig([]byte(tc.config))
			if err != nil {
				t.Fatalf("ParseConfig: %v", err)
			}
			if diff := cmp.Diff(tc.want, refusedFields(t, tc.op.CheckEgress(cfg))); diff != "" {
				t.Errorf("refused fields (-want +got):\n%s", diff)
			}
		})
	}
}

func TestEgressGrantStaysOutsideTheInstallation(t *testing.T) {
	grant, err := policy.ParseEgressGrant([]byte(`{"networkEgress":{"allowCidrs":["203.0.113.0/24","172.16.0.0/12"],"allowFqdns":["github.com","kubernetes.default.svc"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{policy.EgressGrantPath + ".allowCidrs", policy.EgressGrantPath + ".allowFqdns"}
	if diff := cmp.Diff(want, refusedFields(t, policy.Operator{}.CheckEgressGrant(grant))); diff != "" {
		t.Errorf("refused fields (-want +got):\n%s", diff)
	}
}

func TestOperatorPrivateEgressCIDRsAreValidated(t *testing.T) {
	op := policy.DefaultOperator()
	op.PrivateEgressCIDRs = []string{"10.20.0.0/33"}
	if err := op.Validate(); err == nil {
		t.Error("Validate accepted a /33")
	}
}

func refusedFields(t *testing.T, err error) []string {
	t.Helper()
	if err == nil {
		return nil
	}
	var fields []string
	for _, fe := range fieldErrorsOf(t, err) {
		fields = append(fields, fe.Field)
	}
	return fields
}

func fieldErrorsOf(t *testing.T, err error) []policy.FieldError {
	t.Helper()
	var ve *policy.ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("%v is not a *ValidationError", err)
	}
	return ve.Errors
}
