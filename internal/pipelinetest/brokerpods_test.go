package pipelinetest

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The suite's broker wiring reaches the two workers that render tenant objects as the flags
// they read (internal/app Tenancy), and nothing else; the zero value adds no flag.
func TestBrokerPodsArgs(t *testing.T) {
	b := BrokerPods{Address: "192.0.2.2", Hosts: []string{"api.anthropic.com", "api.openai.com"}, CAFile: "/tmp/ca.crt"}
	want := []string{"--broker-address", "192.0.2.2", "--broker-hosts", "api.anthropic.com,api.openai.com", "--broker-ca-file", "/tmp/ca.crt"}
	for _, tc := range []struct {
		kind string
		b    BrokerPods
		want []string
	}{
		{TenantWorker, b, want},
		{Dispatcher, b, want},
		{RunWatcher, b, nil},
		{ExecWorker, b, nil},
		{TenantWorker, BrokerPods{}, nil},
	} {
		if diff := cmp.Diff(tc.want, tc.b.args(tc.kind)); diff != "" {
			t.Errorf("%s %+v: args (-want +got):\n%s", tc.kind, tc.b, diff)
		}
	}
}
