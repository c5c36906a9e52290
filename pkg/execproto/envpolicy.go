package execproto

import (
	"bytes"
	_ "embed" // envdeny.json
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// envDenyJSON is the execute-environment policy's built-in list, shared byte for byte with the
// Paperclip plugin (plugins/paperclip/src/envdeny.json): Paperclip's host forwards its server's
// own environment in `execute`, and these keys are its secrets. Format: {"deny": [GLOB...],
// "allow": [GLOB...]}; a GLOB matches a whole key, `*` any run of characters, case-sensitive.
//
//go:embed envdeny.json
var envDenyJSON []byte

// EnvDenyJSON returns the built-in list as shipped.
func EnvDenyJSON() []byte { return bytes.Clone(envDenyJSON) }

// Env policy modes.
const (
	// EnvModeDeny drops the built-in list's keys and the operator's deny globs (the default).
	EnvModeDeny = "deny"
	// EnvModeAllowlist also drops every key that matches none of the operator's allow globs.
	EnvModeAllowlist = "allowlist"
)

// EnvPolicy decides which keys of an exec's environment reach the pod, exactly as the plugin's
// EnvPolicy.passes does (plugins/paperclip/src/envpolicy.ts), so both enforcers of the one
// operator policy agree:
//  1. a key matching an operator deny glob is dropped;
//  2. a key matching a built-in deny glob and no built-in allow glob is dropped;
//  3. in allowlist mode, a key matching no operator allow glob is dropped;
//  4. every other key passes.
//
// Build it with DefaultEnvPolicy or NewEnvPolicy; the zero EnvPolicy (IsZero) keeps nothing back.
type EnvPolicy struct {
	builtin   envList
	allowlist bool
	deny      []string // the operator's
	allow     []string // the operator's (allowlist mode)
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
		panic(fmt.Sprintf("execproto: the embedded envdeny.json: %v", err)) // a test pins it valid
	}
	return p
}

// NewEnvPolicy is the built-in list in mode, plus the operator's allow and deny globs. Allowlist
// mode needs at least one allow glob (else no key would pass).
func NewEnvPolicy(mode string, allow, deny []string) (EnvPolicy, error) {
	var l envList
	dec := json.NewDecoder(bytes.NewReader(envDenyJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return EnvPolicy{}, fmt.Errorf("reading envdeny.json: %w", err)
	}
	p := EnvPolicy{builtin: l, deny: slices.Clone(deny), allow: slices.Clone(allow)}
	switch mode {
	case EnvModeDeny:
	case EnvModeAllowlist:
		if len(allow) == 0 {
			return EnvPolicy{}, fmt.Errorf("env policy mode %s needs at least one allow glob (else no key would pass)", EnvModeAllowlist)
		}
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
		return !anyGlob(p.allow, key)
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
