package execproto

import (
	"bytes"
	"encoding/json"
	"os"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// envPolicyCases is the corpus both enforcers run: this package and the Paperclip plugin
// (plugins/paperclip/src/envpolicy.test.ts), so that the two never disagree on a key.
const envPolicyCases = "../../testdata/envpolicy/cases.json"

type envPolicyCase struct {
	Name  string   `json:"name"`
	Mode  string   `json:"mode"`
	Allow []string `json:"allow"`
	Deny  []string `json:"deny"`
	Env   []string `json:"env"`
	Kept  []string `json:"kept"`
}

func readEnvPolicyCases(t *testing.T) []envPolicyCase {
	t.Helper()
	b, err := os.ReadFile(envPolicyCases)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		About string          `json:"about"`
		Cases []envPolicyCase `json:"cases"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("%s: %v", envPolicyCases, err)
	}
	if len(doc.Cases) == 0 {
		t.Fatalf("%s holds no case", envPolicyCases)
	}
	return doc.Cases
}

// TestEnvPolicyCorpus runs the shared cases: for each policy, exactly the listed keys of the env
// reach the pod, and the dropped ones are reported by name.
func TestEnvPolicyCorpus(t *testing.T) {
	modes := map[string]bool{}
	for _, tc := range readEnvPolicyCases(t) {
		modes[tc.Mode] = true
		t.Run(tc.Name, func(t *testing.T) {
			p, err := NewEnvPolicy(tc.Mode, tc.Allow, tc.Deny)
			if err != nil {
				t.Fatal(err)
			}
			env := map[string]string{}
			for _, k := range tc.Env {
				env[k] = "value of " + k
			}
			kept, dropped := p.Filter(env)
			var gotKept []string
			for k, v := range kept {
				if v != env[k] {
					t.Errorf("%s's value changed", k)
				}
				gotKept = append(gotKept, k)
			}
			slices.Sort(gotKept)
			if diff := cmp.Diff(tc.Kept, gotKept); diff != "" {
				t.Errorf("kept keys (-want +got):\n%s", diff)
			}
			var wantDropped []string
			for _, k := range tc.Env {
				if !slices.Contains(tc.Kept, k) {
					wantDropped = append(wantDropped, k)
				}
			}
			slices.Sort(wantDropped)
			if diff := cmp.Diff(wantDropped, dropped); diff != "" {
				t.Errorf("dropped keys (-want +got):\n%s", diff)
			}
		})
	}
	if !modes[EnvModeDeny] || !modes[EnvModeAllowlist] {
		t.Errorf("the corpus covers modes %v; want both %s and %s", modes, EnvModeDeny, EnvModeAllowlist)
	}
}

func TestEnvPolicyRefuses(t *testing.T) {
	for _, bad := range []struct{ mode, glob string }{{"open", "X"}, {"", "X"}, {EnvModeDeny, ""}, {EnvModeDeny, "A=B"}, {EnvModeAllowlist, "A\x00"}} {
		if _, err := NewEnvPolicy(bad.mode, nil, []string{bad.glob}); err == nil {
			t.Errorf("NewEnvPolicy(%q, deny %q) accepted", bad.mode, bad.glob)
		}
	}
	// Allowlist mode without additions is the built-in list alone: what an agent needs.
	p, err := NewEnvPolicy(EnvModeAllowlist, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if p.Drops("PAPERCLIP_API_KEY") || !p.Drops("DO_NOT_TRACK") {
		t.Errorf("allowlist mode without additions: drops PAPERCLIP_API_KEY %v, DO_NOT_TRACK %v; want false, true", p.Drops("PAPERCLIP_API_KEY"), p.Drops("DO_NOT_TRACK"))
	}
	DefaultEnvPolicy() // the embedded list is valid
}

// pluginEnvPolicy is the plugin's copy of the list: the plugin drops the keys first, the
// exec-worker again, from the same bytes.
const pluginEnvPolicy = "../../plugins/paperclip/src/envpolicy.json"

// TestEnvPolicyListIsThePlugins compares the two copies: the plugin and the exec-worker enforce
// one list.
func TestEnvPolicyListIsThePlugins(t *testing.T) {
	b, err := os.ReadFile(pluginEnvPolicy)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, envPolicyJSON) {
		t.Errorf("%s and pkg/execproto/envpolicy.json differ: they must be byte-identical (copy one over the other)", pluginEnvPolicy)
	}
}
