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
	// EnvModeDeny drops a key that matches a deny glob and no allow glob (the default).
	EnvModeDeny = "deny"
	// EnvModeAllowlist drops every key that matches no allow glob.
	EnvModeAllowlist = "allowlist"
)

// EnvPolicy decides which keys of an exec's environment reach the pod. Build it with
// DefaultEnvPolicy or NewEnvPolicy; the zero EnvPolicy (IsZero) keeps nothing back.
type EnvPolicy struct {
	deny, allow []string
}

// IsZero reports the zero EnvPolicy, one no constructor made.
func (p EnvPolicy) IsZero() bool { return p.deny == nil && p.allow == nil }

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

// NewEnvPolicy is the built-in list in mode, plus the operator's extra allow and deny globs.
// In allowlist mode every key is denied unless a glob allows it.
func NewEnvPolicy(mode string, extraAllow, extraDeny []string) (EnvPolicy, error) {
	var l envList
	dec := json.NewDecoder(bytes.NewReader(envDenyJSON))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil {
		return EnvPolicy{}, fmt.Errorf("reading envdeny.json: %w", err)
	}
	p := EnvPolicy{deny: slices.Concat(l.Deny, extraDeny), allow: slices.Concat(l.Allow, extraAllow)}
	switch mode {
	case EnvModeDeny:
	case EnvModeAllowlist:
		p.deny = append(p.deny, "*")
	default:
		return EnvPolicy{}, fmt.Errorf("env policy mode must be %s or %s, got %q", EnvModeDeny, EnvModeAllowlist, mode)
	}
	for _, g := range slices.Concat(p.deny, p.allow) {
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

// Drops reports whether key is kept back: it matches a deny glob and no allow glob.
func (p EnvPolicy) Drops(key string) bool {
	return slices.ContainsFunc(p.deny, func(g string) bool { return globMatch(g, key) }) &&
		!slices.ContainsFunc(p.allow, func(g string) bool { return globMatch(g, key) })
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
