package execproto

import (
	"bytes"
	_ "embed" // envpolicy.json
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// envPolicyJSON is the execute-environment policy's built-in list, shared byte for byte with the
// Paperclip plugin (plugins/paperclip/src/envpolicy.json). Format: {"deny": [GLOB...], "allow":
// [GLOB...]}; a GLOB matches a whole key, `*` any run of characters, case-sensitive. "deny": the
// keys of Paperclip's own server (its host forwards its server's whole environment in some
// `execute` calls, and these are its secrets). "allow": what an agent needs (the shell basics,
// Paperclip's run variables, the adapters' homes and model API keys): the allowlist mode's keys,
// and the exceptions to "deny".
//
//go:embed envpolicy.json
var envPolicyJSON []byte

// EnvPolicyJSON returns the built-in list as shipped.
func EnvPolicyJSON() []byte { return bytes.Clone(envPolicyJSON) }

// Env policy modes.
const (
	// EnvModeDeny drops the built-in deny list's keys and the operator's deny globs: every other
	// key of the client's passes. The exec-worker's default: its clients are the operator's
	// (the plugin filters Paperclip's execute env itself, in allowlist mode by default; `kubeclip
	// exec` sends the operator's own variables).
	EnvModeDeny = "deny"
	// EnvModeAllowlist passes only the keys of the built-in allow list (what an agent needs) and
	// of the operator's allow globs: a key the operator's Paperclip server happens to hold
	// (GITHUB_TOKEN, SLACK_*, HF_TOKEN) never reaches a company's pod. The plugin's default.
	EnvModeAllowlist = "allowlist"
)

// EnvPolicy decides which keys of an exec's environment reach the pod, exactly as the plugin's
// EnvPolicy.passes does (plugins/paperclip/src/envpolicy.ts; both run the cases of
// testdata/envpolicy/cases.json), so both enforcers of the one operator policy agree:
//  1. a key matching an operator deny glob is dropped;
//  2. a key matching a built-in deny glob and no built-in allow glob is dropped;
//  3. in allowlist mode, a key matching no built-in allow glob and no operator allow glob is
//     dropped;
//  4. every other key passes.
//
// Build it with DefaultEnvPolicy or NewEnvPolicy; the zero EnvPolicy (IsZero) keeps nothing back.
type EnvPolicy struct {
	builtin   envList
	allowlist bool
	deny      []string // the operator's
	allow     []string // the operator's additions (allowlist mode)
}

// IsZero reports the zero EnvPolicy, one no constructor made.
func (p EnvPolicy) IsZero() bool { return p.builtin.Deny == nil && p.builtin.Allow == nil }

type envList struct {
	Deny  []string `json:"deny"`
	Allow []string `json:"allow"`
}

// DefaultEnvPolicy is the built-in list in deny mode.
func DefaultEnvPolicy() EnvPolicy {
	p, err := NewEnvPolicy(EnvModeDeny, nil, nil)
	if err != nil {
		panic(fmt.Sprintf("execproto: the embedded envpolicy.json: %v", err)) // a test pins it valid
	}
	return p
}

// NewEnvPolicy is the built-in list in mode, plus the operator's allow and deny globs.
func NewEnvPolicy(mode string, allow, deny []string) (EnvPolicy, error) {
	var l envList
	dec := json.NewDecoder(bytes.NewReader(envPolicyJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return EnvPolicy{}, fmt.Errorf("reading envpolicy.json: %w", err)
	}
	p := EnvPolicy{builtin: l, deny: slices.Clone(deny), allow: slices.Clone(allow)}
	switch mode {
	case EnvModeDeny:
	case EnvModeAllowlist:
		p.allowlist = true
	default:
		return EnvPolicy{}, fmt.Errorf("env policy mode must be %s or %s, got %q", EnvModeDeny, EnvModeAllowlist, mode)
	}
	for _, g := range slices.Concat(l.Deny, l.Allow, p.deny, p.allow) {
		if err := CheckEnvGlob(g); err != nil {
			return EnvPolicy{}, err
		}
	}
	return p, nil
}

// CheckEnvGlob refuses a glob that can match no environment key: empty, or with `=` or NUL.
func CheckEnvGlob(g string) error {
	if g == "" || strings.ContainsAny(g, "=\x00") {
		return fmt.Errorf("env glob %q must be a non-empty key pattern without = or NUL", g)
	}
	return nil
}

// Drops reports whether key is kept back (the rules on EnvPolicy).
func (p EnvPolicy) Drops(key string) bool {
	switch {
	case anyGlob(p.deny, key):
		return true
	case anyGlob(p.builtin.Deny, key) && !anyGlob(p.builtin.Allow, key):
		return true
	case p.allowlist:
		return !anyGlob(p.builtin.Allow, key) && !anyGlob(p.allow, key)
	}
	return false
}

func anyGlob(globs []string, key string) bool {
	return slices.ContainsFunc(globs, func(g string) bool { return globMatch(g, key) })
}

// Filter returns env without the keys the policy drops, and the dropped keys' names (sorted;
// names only: callers log and count them, never their values). env itself is not changed.
func (p EnvPolicy) Filter(env map[string]string) (map[string]string, []string) {
	var dropped []string
	for k := range env {
		if p.Drops(k) {
			dropped = append(dropped, k)
		}
	}
	if len(dropped) == 0 {
		return env, nil
	}
	slices.Sort(dropped)
	kept := make(map[string]string, len(env)-len(dropped))
	for k, v := range env {
		if !p.Drops(k) {
			kept[k] = v
		}
	}
	return kept, dropped
}

// globMatch reports whether s matches g as a whole, `*` matching any run of characters.
func globMatch(g, s string) bool {
	parts := strings.Split(g, "*")
	if len(parts) == 1 {
		return g == s
	}
	if !strings.HasPrefix(s, parts[0]) {
		return false
	}
	s = s[len(parts[0]):]
	last := parts[len(parts)-1]
	for _, mid := range parts[1 : len(parts)-1] {
		i := strings.Index(s, mid)
		if i < 0 {
			return false
		}
		s = s[i+len(mid):]
	}
	return len(s) >= len(last) && strings.HasSuffix(s, last)
}
