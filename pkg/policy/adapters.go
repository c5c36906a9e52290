package policy

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// BootstrapTokenKey is the per-run Secret key kubeclip sets itself; adapter env must not set it.
const BootstrapTokenKey = "BOOTSTRAP_TOKEN"

// AdapterEntry is one entry of the `adapters` registry (adapter-registry.ts; the operator emits
// the same shape as PAPERCLIP_ADAPTERS).
type AdapterEntry struct {
	AdapterType string `json:"adapterType"`
	// Enabled is carried for parity; like upstream, resolution does not consult it.
	Enabled      bool              `json:"enabled"`
	RuntimeImage string            `json:"runtimeImage,omitempty"`
	EnvKeys      []string          `json:"envKeys,omitempty"`
	AllowFqdns   []string          `json:"allowFqdns,omitempty"`
	ProbeCommand []string          `json:"probeCommand,omitempty"`
	DefaultEnv   map[string]string `json:"defaultEnv,omitempty"`
}

// AdapterDefaults is what a run of one adapter type needs: its image, the host env keys
// forwarded into the run's Secret, the FQDNs it must reach, and its probe command.
type AdapterDefaults struct {
	AdapterType  string            `json:"adapterType"`
	RuntimeImage string            `json:"runtimeImage"`
	EnvKeys      []string          `json:"envKeys"`
	AllowFqdns   []string          `json:"allowFqdns"`
	ProbeCommand []string          `json:"probeCommand"`
	DefaultEnv   map[string]string `json:"defaultEnv"`
}

// builtinAdapters is adapter-defaults.ts's registry, exactly.
var builtinAdapters = map[string]AdapterDefaults{
	"claude_local": {
		RuntimeImage: "ghcr.io/paperclipai/agent-runtime-claude:v1",
		EnvKeys:      []string{"ANTHROPIC_API_KEY"},
		AllowFqdns:   []string{"api.anthropic.com"},
		ProbeCommand: []string{"claude", "--version"},
	},
	"codex_local": {
		RuntimeImage: "ghcr.io/paperclipai/agent-runtime-codex:v1",
		EnvKeys:      []string{"OPENAI_API_KEY"},
		AllowFqdns:   []string{"api.openai.com"},
		ProbeCommand: []string{"codex", "--version"},
	},
	"gemini_local": {
		RuntimeImage: "ghcr.io/paperclipai/agent-runtime-gemini:v1",
		EnvKeys:      []string{"GOOGLE_API_KEY", "GEMINI_API_KEY"},
		AllowFqdns:   []string{"generativelanguage.googleapis.com"},
		ProbeCommand: []string{"gemini", "--version"},
	},
	"cursor_local": {
		RuntimeImage: "ghcr.io/paperclipai/agent-runtime-cursor:v1",
		EnvKeys:      []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY"},
		AllowFqdns:   []string{"api.anthropic.com", "api.openai.com"},
		ProbeCommand: []string{"cursor-agent", "--version"},
	},
	"opencode_local": {
		RuntimeImage: "ghcr.io/paperclipai/agent-runtime-opencode:v1",
		EnvKeys:      []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "OPENROUTER_API_KEY"},
		AllowFqdns:   []string{"api.anthropic.com", "api.openai.com", "openrouter.ai"},
		ProbeCommand: []string{"opencode", "--version"},
	},
	"pi_local": {
		RuntimeImage: "ghcr.io/paperclipai/agent-runtime-pi:v1",
		EnvKeys:      []string{"ANTHROPIC_API_KEY"},
		AllowFqdns:   []string{"api.anthropic.com"},
		ProbeCommand: []string{"pi", "--version"},
	},
}

// BuiltinAdapterTypes returns the six built-in adapter types, sorted.
func BuiltinAdapterTypes() []string {
	return slices.Sorted(maps.Keys(builtinAdapters))
}

// GetAdapterDefaults resolves an adapter type (getAdapterDefaults in adapter-defaults.ts).
//
// A non-empty registry REPLACES the built-ins: the type must be declared there and have a
// runtimeImage; missing arrays become empty. Otherwise the type must be a built-in. Errors are
// *AdapterError (errors.Is(err, ErrUnknownAdapter)) with upstream's messages.
func GetAdapterDefaults(adapterType string, registry []AdapterEntry) (AdapterDefaults, error) {
	if len(registry) > 0 {
		for _, e := range registry {
			if e.AdapterType != adapterType {
				continue
			}
			if e.RuntimeImage == "" {
				return AdapterDefaults{}, &AdapterError{AdapterType: adapterType,
					Message: fmt.Sprintf("Adapter %q is missing required runtime field: runtimeImage", adapterType)}
			}
			return AdapterDefaults{
				AdapterType:  e.AdapterType,
				RuntimeImage: e.RuntimeImage,
				EnvKeys:      orEmpty(e.EnvKeys),
				AllowFqdns:   orEmpty(e.AllowFqdns),
				ProbeCommand: orEmpty(e.ProbeCommand),
				DefaultEnv:   maps.Clone(e.DefaultEnv),
			}, nil
		}
		return AdapterDefaults{}, &AdapterError{AdapterType: adapterType,
			Message: fmt.Sprintf("Adapter %q is not in the configured adapter registry", adapterType)}
	}
	b, ok := builtinAdapters[adapterType]
	if !ok {
		return AdapterDefaults{}, &AdapterError{AdapterType: adapterType,
			Message: "Unknown adapter type: " + adapterType}
	}
	return AdapterDefaults{
		AdapterType:  adapterType,
		RuntimeImage: b.RuntimeImage,
		EnvKeys:      slices.Clone(b.EnvKeys),
		AllowFqdns:   slices.Clone(b.AllowFqdns),
		ProbeCommand: slices.Clone(b.ProbeCommand),
	}, nil
}

// Adapter resolves an adapter type against the config's registry (or the built-ins).
func (c Config) Adapter(adapterType string) (AdapterDefaults, error) {
	return GetAdapterDefaults(adapterType, c.Adapters)
}

// ResolveRunAdapterType picks a run's adapter type: the run's own (trimmed) when non-empty,
// else the config's adapterType (resolveRunAdapterType). Unlike upstream, which fails later
// when the defaults are looked up, it checks the type is usable now and returns an
// *AdapterError matching ErrUnknownAdapter when it is not.
func ResolveRunAdapterType(run string, cfg Config) (string, error) {
	t := strings.TrimSpace(run)
	if t == "" {
		t = cfg.AdapterType
	}
	if _, err := cfg.Adapter(t); err != nil {
		return "", err
	}
	return t, nil
}

// BuildAdapterEnv builds the adapter's part of a run's Secret data (buildAdapterEnv): the
// adapter's defaultEnv, then every envKey whose value lookupEnv finds non-empty (a secret from
// the worker's environment wins over defaultEnv). Missing keys are left out; see
// MissingAdapterEnv. Pass os.LookupEnv from main.
func BuildAdapterEnv(defaults AdapterDefaults, lookupEnv func(string) (string, bool)) map[string]string {
	env := maps.Clone(defaults.DefaultEnv)
	if env == nil {
		env = map[string]string{}
	}
	for _, k := range defaults.EnvKeys {
		// JavaScript truthiness: an empty value counts as missing.
		if v, ok := lookupEnv(k); ok && v != "" {
			env[k] = v
		}
	}
	return env
}

// MissingAdapterEnv lists the adapter's envKeys that lookupEnv does not supply (non-empty) and
// defaultEnv does not set either, for a warning. It returns key names only.
func MissingAdapterEnv(defaults AdapterDefaults, lookupEnv func(string) (string, bool)) []string {
	var missing []string
	for _, k := range defaults.EnvKeys {
		if v, ok := lookupEnv(k); ok && v != "" {
			continue
		}
		if _, ok := defaults.DefaultEnv[k]; ok {
			continue
		}
		missing = append(missing, k)
	}
	return missing
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return slices.Clone(s)
}
