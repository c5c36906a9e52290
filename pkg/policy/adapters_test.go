package policy_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

func TestBuiltinAdapters(t *testing.T) {
	// adapter-defaults.ts, exactly.
	want := map[string]policy.AdapterDefaults{
		"claude_local": {AdapterType: "claude_local", RuntimeImage: "ghcr.io/paperclipai/agent-runtime-claude:v1",
			EnvKeys: []string{"ANTHROPIC_API_KEY"}, AllowFqdns: []string{"api.anthropic.com"}, ProbeCommand: []string{"claude", "--version"}},
		"codex_local": {AdapterType: "codex_local", RuntimeImage: "ghcr.io/paperclipai/agent-runtime-codex:v1",
			EnvKeys: []string{"OPENAI_API_KEY"}, AllowFqdns: []string{"api.openai.com"}, ProbeCommand: []string{"codex", "--version"}},
		"gemini_local": {AdapterType: "gemini_local", RuntimeImage: "ghcr.io/paperclipai/agent-runtime-gemini:v1",
			EnvKeys: []string{"GOOGLE_API_KEY", "GEMINI_API_KEY"}, AllowFqdns: []string{"generativelanguage.googleapis.com"}, ProbeCommand: []string{"gemini", "--version"}},
		"cursor_local": {AdapterType: "cursor_local", RuntimeImage: "ghcr.io/paperclipai/agent-runtime-cursor:v1",
			EnvKeys: []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY"}, AllowFqdns: []string{"api.anthropic.com", "api.openai.com"}, ProbeCommand: []string{"cursor-agent", "--version"}},
		"opencode_local": {AdapterType: "opencode_local", RuntimeImage: "ghcr.io/paperclipai/agent-runtime-opencode:v1",
			EnvKeys: []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENROUTER_API_KEY"}, AllowFqdns: []string{"api.anthropic.com", "api.openai.com", "openrouter.ai"}, ProbeCommand: []string{"opencode", "--version"}},
		"pi_local": {AdapterType: "pi_local", RuntimeImage: "ghcr.io/paperclipai/agent-runtime-pi:v1",
			EnvKeys: []string{"ANTHROPIC_API_KEY"}, AllowFqdns: []string{"api.anthropic.com"}, ProbeCommand: []string{"pi", "--version"}},
	}
	if diff := cmp.Diff([]string{"claude_local", "codex_local", "cursor_local", "gemini_local", "opencode_local", "pi_local"}, policy.BuiltinAdapterTypes()); diff != "" {
		t.Errorf("BuiltinAdapterTypes (-want +got):\n%s", diff)
	}
	for typ, w := range want {
		t.Run(typ, func(t *testing.T) {
			got, err := policy.GetAdapterDefaults(typ, nil)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(w, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestGetAdapterDefaultsRegistry(t *testing.T) {
	registry := []policy.AdapterEntry{
		{AdapterType: "custom", Enabled: true, RuntimeImage: "ghcr.io/acme/custom:v1", DefaultEnv: map[string]string{"MODE": "x"}},
		{AdapterType: "imageless", Enabled: true},
		{AdapterType: "disabled", Enabled: false, RuntimeImage: "ghcr.io/acme/disabled:v1"},
	}
	tests := []struct {
		name     string
		typ      string
		registry []policy.AdapterEntry
		want     policy.AdapterDefaults
		wantErr  string
	}{
		{name: "registry entry, missing arrays become empty", typ: "custom", registry: registry,
			want: policy.AdapterDefaults{AdapterType: "custom", RuntimeImage: "ghcr.io/acme/custom:v1", EnvKeys: []string{}, AllowFqdns: []string{}, ProbeCommand: []string{}, DefaultEnv: map[string]string{"MODE": "x"}}},
		{name: "registry replaces the built-ins", typ: "claude_local", registry: registry,
			wantErr: `Adapter "claude_local" is not in the configured adapter registry`},
		{name: "entry without runtimeImage", typ: "imageless", registry: registry,
			wantErr: `Adapter "imageless" is missing required runtime field: runtimeImage`},
		{name: "enabled is not consulted (parity)", typ: "disabled", registry: registry,
			want: policy.AdapterDefaults{AdapterType: "disabled", RuntimeImage: "ghcr.io/acme/disabled:v1", EnvKeys: []string{}, AllowFqdns: []string{}, ProbeCommand: []string{}}},
		{name: "empty registry means built-ins", typ: "codex_local", registry: []policy.AdapterEntry{},
			want: policy.AdapterDefaults{AdapterType: "codex_local", RuntimeImage: "ghcr.io/paperclipai/agent-runtime-codex:v1", EnvKeys: []string{"OPENAI_API_KEY"}, AllowFqdns: []string{"api.openai.com"}, ProbeCommand: []string{"codex", "--version"}}},
		{name: "unknown built-in", typ: "claude_k8s", wantErr: "Unknown adapter type: claude_k8s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := policy.GetAdapterDefaults(tc.typ, tc.registry)
			if tc.wantErr != "" {
				var aerr *policy.AdapterError
				if !errors.As(err, &aerr) || !errors.Is(err, policy.ErrUnknownAdapter) {
					t.Fatalf("error = %v, want an *AdapterError matching ErrUnknownAdapter", err)
				}
				if err.Error() != tc.wantErr || aerr.AdapterType != tc.typ {
					t.Errorf("error = %q (type %q), want %q", err, aerr.AdapterType, tc.wantErr)
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

func TestResolveRunAdapterType(t *testing.T) {
	builtin := policy.DefaultConfig()
	custom := policy.DefaultConfig()
	custom.AdapterType = "custom"
	custom.Adapters = []policy.AdapterEntry{{AdapterType: "custom", Enabled: true, RuntimeImage: "x:1"}, {AdapterType: "other", Enabled: true, RuntimeImage: "y:1"}}
	tests := []struct {
		name    string
		run     string
		cfg     policy.Config
		want    string
		wantErr bool
	}{
		{name: "empty run uses config", run: "", cfg: builtin, want: "claude_local"},
		{name: "blank run uses config", run: "  \t", cfg: builtin, want: "claude_local"},
		{name: "run override", run: "codex_local", cfg: builtin, want: "codex_local"},
		{name: "run override trimmed", run: " gemini_local\n", cfg: builtin, want: "gemini_local"},
		{name: "unknown run type", run: "nope", cfg: builtin, wantErr: true},
		{name: "registry type", run: "other", cfg: custom, want: "other"},
		{name: "registry default", run: "", cfg: custom, want: "custom"},
		{name: "built-in not in registry", run: "claude_local", cfg: custom, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := policy.ResolveRunAdapterType(tc.run, tc.cfg)
			if tc.wantErr {
				if !errors.Is(err, policy.ErrUnknownAdapter) {
					t.Fatalf("error = %v, want ErrUnknownAdapter", err)
				}
				if policy.ErrUnknownAdapter.Error() != policy.CodeUnknownAdapter {
					t.Errorf("sentinel text %q, want the failed-event code", policy.ErrUnknownAdapter)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("ResolveRunAdapterType(%q) = %q, %v; want %q", tc.run, got, err, tc.want)
			}
		})
	}
}

func TestBuildAdapterEnv(t *testing.T) {
	env := map[string]string{"ANTHROPIC_API_KEY": "sk-ant", "OPENAI_API_KEY": "", "UNRELATED": "x"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	tests := []struct {
		name        string
		defaults    policy.AdapterDefaults
		want        map[string]string
		wantMissing []string
	}{
		{
			name:        "secret wins over defaultEnv; empty and missing keys are left out",
			defaults:    policy.AdapterDefaults{EnvKeys: []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENROUTER_API_KEY"}, DefaultEnv: map[string]string{"ANTHROPIC_API_KEY": "default", "MODE": "fast"}},
			want:        map[string]string{"ANTHROPIC_API_KEY": "sk-ant", "MODE": "fast"},
			wantMissing: []string{"OPENAI_API_KEY", "OPENROUTER_API_KEY"},
		},
		{
			name:     "defaultEnv covers a missing key",
			defaults: policy.AdapterDefaults{EnvKeys: []string{"OPENAI_API_KEY"}, DefaultEnv: map[string]string{"OPENAI_API_KEY": "fallback"}},
			want:     map[string]string{"OPENAI_API_KEY": "fallback"},
		},
		{
			name:     "nothing",
			defaults: policy.AdapterDefaults{},
			want:     map[string]string{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := policy.BuildAdapterEnv(tc.defaults, lookup)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("BuildAdapterEnv (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantMissing, policy.MissingAdapterEnv(tc.defaults, lookup)); diff != "" {
				t.Errorf("MissingAdapterEnv (-want +got):\n%s", diff)
			}
			// The defaults are not modified.
			if tc.defaults.DefaultEnv != nil && tc.defaults.DefaultEnv["ANTHROPIC_API_KEY"] == "sk-ant" {
				t.Errorf("BuildAdapterEnv wrote into defaults.DefaultEnv")
			}
		})
	}
}
