package policy_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

// A company's provider config and its egress grant come straight from a lease request: both
// parsers take hostile input. Their seed corpora under testdata/fuzz run with every `go test`;
// `make fuzz` explores.

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		cfg, err := policy.ParseConfig(raw)
		if err != nil {
			checkFieldErrors(t, err, "")
			if diff := cmp.Diff(policy.Config{}, cfg); diff != "" {
				t.Fatalf("a refused config comes with a Config (-want +got):\n%s", diff)
			}
			// The same config gets the same errors: they are a failed event's message.
			if _, again := policy.ParseConfig(raw); again.Error() != err.Error() {
				t.Fatalf("errors changed between two parses:\n%v\n%v", err, again)
			}
		} else {
			if err := cfg.Validate(); err != nil {
				t.Fatalf("ParseConfig accepted a config Validate refuses: %v", err)
			}
			// The JSON form is the normalized config: it parses back to the same Config.
			data, err := json.Marshal(cfg)
			if err != nil {
				t.Fatal(err)
			}
			again, err := policy.ParseConfig(data)
			if err != nil {
				t.Fatalf("re-parsing the normalized config %s: %v", data, err)
			}
			if diff := cmp.Diff(cfg, again, cmpopts.EquateEmpty()); diff != "" {
				t.Fatalf("round trip (-first +again):\n%s", diff)
			}
		}
		// Values that may hold secrets are never echoed, whatever else is wrong with the config.
		if planted, ok := plantSecrets(raw); ok {
			if _, err := policy.ParseConfig(planted); err != nil && strings.Contains(err.Error(), secretMark) {
				t.Fatalf("an error echoes a secret value: %v", err)
			}
		}
	})
}

func FuzzParseEgressGrant(f *testing.F) {
	f.Add([]byte(`{"networkEgress": {"allowFqdns": ["GitHub.com "], "allowCidrs": ["10.0.0.0/8"]}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		grant, err := policy.ParseEgressGrant(raw)
		if err != nil {
			checkFieldErrors(t, err, "executionWorkspaceSettings")
			return
		}
		// A grant holds what the config's own egress lists accept: trimmed, FQDNs lower-cased,
		// each once.
		cfg := policy.DefaultConfig()
		cfg.EgressAllowFqdns, cfg.EgressAllowCidrs = grant.AllowFqdns, grant.AllowCidrs
		if err := cfg.Validate(); err != nil {
			t.Fatalf("grant %+v: %v", grant, err)
		}
		for _, list := range [][]string{grant.AllowFqdns, grant.AllowCidrs} {
			for i, s := range list {
				if s == "" || s != strings.TrimSpace(s) || slices.Index(list, s) != i {
					t.Fatalf("grant %+v: entry %q is empty, untrimmed or repeated", grant, s)
				}
			}
		}
		for _, s := range grant.AllowFqdns {
			if s != strings.ToLower(s) {
				t.Fatalf("grant %+v: FQDN %q is not lower-case", grant, s)
			}
		}
		// Written back as settings, the grant reads the same.
		data, err := json.Marshal(map[string]any{"networkEgress": grant})
		if err != nil {
			t.Fatal(err)
		}
		again, err := policy.ParseEgressGrant(data)
		if err != nil {
			t.Fatalf("re-parsing %s: %v", data, err)
		}
		if diff := cmp.Diff(grant, again); diff != "" {
			t.Fatalf("round trip (-first +again):\n%s", diff)
		}
	})
}

// checkFieldErrors checks a refusal: a *ValidationError with at least one problem, each naming
// its field (under prefix) and saying what is wrong.
func checkFieldErrors(t *testing.T, err error, prefix string) {
	t.Helper()
	var verr *policy.ValidationError
	if !errors.As(err, &verr) || len(verr.Errors) == 0 {
		t.Fatalf("error %v (%T): want a *ValidationError with field errors", err, err)
	}
	for _, fe := range verr.Errors {
		if fe.Field == "" || fe.Message == "" || !strings.HasPrefix(fe.Field, prefix) {
			t.Fatalf("field error %q: %q, want a field under %q and a message", fe.Field, fe.Message, prefix)
		}
	}
}

// secretMark starts every string plantSecrets puts where a secret may be.
const secretMark = "s3cr3t-7f1d:"

// plantSecrets returns the config object in raw with secretMark in front of every string inside
// the values that may hold secrets: kubeconfig, serviceAccountAnnotations' values and adapters'
// defaultEnv values. ok is false when raw is not a JSON object, or already holds the mark.
func plantSecrets(raw []byte) ([]byte, bool) {
	if bytes.Contains(raw, []byte(secretMark)) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var doc map[string]any
	if dec.Decode(&doc) != nil || doc == nil {
		return nil, false
	}
	var mark func(v any) any
	mark = func(v any) any {
		switch v := v.(type) {
		case string:
			return secretMark + v
		case []any:
			for i := range v {
				v[i] = mark(v[i])
			}
		case map[string]any:
			for k := range v {
				v[k] = mark(v[k])
			}
		}
		return v
	}
	if v, ok := doc["kubeconfig"]; ok {
		doc["kubeconfig"] = mark(v)
	}
	if m, ok := doc["serviceAccountAnnotations"].(map[string]any); ok {
		mark(m)
	}
	if list, ok := doc["adapters"].([]any); ok {
		for _, e := range list {
			if entry, ok := e.(map[string]any); ok {
				if env, ok := entry["defaultEnv"].(map[string]any); ok {
					mark(env)
				}
			}
		}
	}
	data, err := json.Marshal(doc)
	return data, err == nil
}
