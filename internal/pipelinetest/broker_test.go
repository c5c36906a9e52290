package pipelinetest

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/ca"
)

// TestNewBrokerWritesAnInstallation: the files the broker's flags name are what it reads: a CA
// whose key matches and whose name constraints are the bindings' hosts only, a sealing key of
// the right length, the bindings as given, the upstreams' CA; the keys readable by the owner
// only.
func TestNewBrokerWritesAnInstallation(t *testing.T) {
	bindings := map[string]BrokerBinding{
		"ANTHROPIC_API_KEY": {Hosts: []string{"api.anthropic.com"}, Headers: []string{"x-api-key"}, Errors: "anthropic", Upstreams: map[string]string{"api.anthropic.com": "127.0.0.1:9"}},
		"OPENAI_API_KEY":    {Hosts: []string{"api.openai.com"}, Headers: []string{"authorization"}, Errors: "openai"},
	}
	b, err := NewBroker(BrokerOptions{Address: "10.0.0.1", Bindings: bindings, UpstreamCA: []byte("upstream pem")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(b.Dir) })
	if diff := cmp.Diff([]string{"api.anthropic.com", "api.openai.com"}, b.Hosts); diff != "" {
		t.Errorf("hosts (-want +got):\n%s", diff)
	}
	if b.Address != "10.0.0.1" || b.Port != 443 {
		t.Errorf("listens on %s:%d, want 10.0.0.1:443", b.Address, b.Port)
	}
	read := func(path string) []byte {
		t.Helper()
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	authority, err := ca.Parse(read(b.CAFile), read(b.caKeyFile))
	if err != nil {
		t.Fatalf("the CA files: %v", err)
	}
	for host, want := range map[string]bool{"api.anthropic.com": true, "api.openai.com": true, "example.com": false} {
		if got := authority.Permits(host); got != want {
			t.Errorf("the CA permits %s: %t, want %t", host, got, want)
		}
	}
	if _, err := broker.LoadSealingKey(b.sealingKeyFile); err != nil {
		t.Errorf("the sealing key: %v", err)
	}
	var got map[string]BrokerBinding
	if err := json.Unmarshal(read(b.bindingsFile), &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(bindings, got); diff != "" {
		t.Errorf("bindings file (-want +got):\n%s", diff)
	}
	if string(read(b.upstreamCAFile)) != "upstream pem" {
		t.Errorf("the upstream CA file differs")
	}
	for _, f := range []string{b.caKeyFile, b.sealingKeyFile} {
		st, err := os.Stat(f)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", f, st.Mode().Perm())
		}
	}
}

func TestNewBrokerRefuses(t *testing.T) {
	one := map[string]BrokerBinding{"K": {Hosts: []string{"api.anthropic.com"}, Headers: []string{"x-api-key"}, Errors: "anthropic"}}
	for name, o := range map[string]BrokerOptions{
		"no address":  {Bindings: one},
		"a host name": {Address: "node-1", Bindings: one},
		"no bindings": {Address: "10.0.0.1"},
	} {
		if b, err := NewBroker(o); err == nil {
			os.RemoveAll(b.Dir)
			t.Errorf("%s: NewBroker accepted %+v", name, o)
		}
	}
}
