package execproto

import (
	"bytes"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestEnvPolicy(t *testing.T) {
	for _, tc := range []struct {
		name        string
		mode        string
		allow, deny []string
		env         []string
		wantDropped []string
	}{
		{
			name: "built-in list",
			mode: EnvModeDeny,
			env: []string{"PAPERCLIP_AGENT_JWT_SECRET", "PAPERCLIP_TOOL_ACTION_SIGNING_SECRET", "BETTER_AUTH_SECRET", "DATABASE_URL",
				"AWS_SECRET_ACCESS_KEY", "PGPASSWORD", "PAPERCLIP_API_KEY", "PAPERCLIP_API_URL", "PAPERCLIP_RUN_ID", "HOME", "ANTHROPIC_API_KEY", "my_secret"},
			wantDropped: []string{"AWS_SECRET_ACCESS_KEY", "BETTER_AUTH_SECRET", "DATABASE_URL", "PAPERCLIP_AGENT_JWT_SECRET",
				"PAPERCLIP_TOOL_ACTION_SIGNING_SECRET", "PGPASSWORD"},
		},
		{name: "the operator's deny wins", mode: EnvModeDeny, deny: []string{"*_SECRET"}, allow: []string{"AWS_REGION", "MY_SECRET"},
			env: []string{"AWS_REGION", "AWS_ACCESS_KEY_ID", "MY_SECRET", "X_SECRET", "LANG"}, wantDropped: []string{"AWS_ACCESS_KEY_ID", "AWS_REGION", "MY_SECRET", "X_SECRET"}},
		{name: "allowlist", mode: EnvModeAllowlist, allow: []string{"ANTHROPIC_API_KEY", "LANG"},
			env: []string{"ANTHROPIC_API_KEY", "LANG", "PAPERCLIP_API_KEY", "HOME", "DATABASE_URL"}, wantDropped: []string{"DATABASE_URL", "HOME", "PAPERCLIP_API_KEY"}},
		{name: "globs on both sides", mode: EnvModeDeny, deny: []string{"*TOKEN*"},
			env: []string{"TOKEN", "A_TOKEN_B", "TOKE", "TOKENS"}, wantDropped: []string{"A_TOKEN_B", "TOKEN", "TOKENS"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewEnvPolicy(tc.mode, tc.allow, tc.deny)
			if err != nil {
				t.Fatal(err)
			}
			env := map[string]string{}
			for _, k := range tc.env {
				env[k] = "v"
			}
			kept, dropped := p.Filter(env)
			if diff := cmp.Diff(tc.wantDropped, dropped); diff != "" {
				t.Errorf("dropped (-want +got):\n%s", diff)
			}
			if len(kept)+len(dropped) != len(env) || len(env) != len(tc.env) {
				t.Errorf("kept %d + dropped %d of %d", len(kept), len(dropped), len(env))
			}
		})
	}
	if _, err := NewEnvPolicy(EnvModeAllowlist, nil, nil); err == nil {
		t.Error("an allowlist without an allow glob accepted")
	}
	for _, bad := range []struct{ mode, glob string }{{"open", "X"}, {EnvModeDeny, ""}, {EnvModeDeny, "A=B"}} {
		if _, err := NewEnvPolicy(bad.mode, nil, []string{bad.glob}); err == nil {
			t.Errorf("NewEnvPolicy(%q, deny %q) accepted", bad.mode, bad.glob)
		}
	}
	DefaultEnvPolicy() // the embedded list is valid
}

func TestGlobMatch(t *testing.T) {
	for _, tc := range []struct {
		g, s string
		want bool
	}{
		{"A", "A", true}, {"A", "a", false}, {"A", "AB", false}, {"*", "", true}, {"*_SECRET", "_SECRET", true},
		{"*_SECRET", "X_SECRETS", false}, {"*_SECRET_*", "A_SECRET_B", true}, {"*_SECRET_*", "A_SECRET", false},
		{"A*A", "A", false}, {"A*A", "AA", true}, {"*AB*AB", "ABAB", true}, {"*AB*AB", "ABA", false},
	} {
		if got := globMatch(tc.g, tc.s); got != tc.want {
			t.Errorf("globMatch(%q, %q) = %v, want %v", tc.g, tc.s, got, tc.want)
		}
	}
}

// pluginEnvDeny is the plugin's copy of the list: the plugin drops the keys first, the
// exec-worker again, from the same bytes.
const pluginEnvDeny = "../../plugins/paperclip/src/envdeny.json"

// TestEnvDenyListIsThePlugins compares the two copies: the plugin and the exec-worker enforce
// one list.
func TestEnvDenyListIsThePlugins(t *testing.T) {
	b, err := os.ReadFile(pluginEnvDeny)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(b, envDenyJSON) {
		t.Errorf("%s and pkg/execproto/envdeny.json differ: they must be byte-identical (copy one over the other)", pluginEnvDeny)
	}
}
