package policy_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

// Issue 15 item 18: 40,000 egress FQDNs were accepted and rendered into one policy. Every list
// a company sends is bounded; one over its bound is refused as a whole, naming the field and
// the bound (and its entries are not each reported).
func TestConfigListsAreBounded(t *testing.T) {
	list := func(n int, f func(i int) string) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = f(i)
		}
		return out
	}
	names := func(n int) []string { return list(n, func(i int) string { return fmt.Sprintf("h%d.example.com", i) }) }
	keys := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("example.com/k%d", i)] = "v"
		}
		return m
	}
	adapter := func(kv ...any) map[string]any {
		a := map[string]any{"adapterType": "x", "runtimeImage": "ghcr.io/x/y:v1"}
		for i := 0; i+1 < len(kv); i += 2 {
			a[kv[i].(string)] = kv[i+1]
		}
		return a
	}
	tests := []struct {
		name, field string
		cfg         map[string]any
		max         int
	}{
		{"egressAllowFqdns", "egressAllowFqdns", map[string]any{"egressAllowFqdns": names(40000)}, policy.MaxEgressEntries},
		{"egressAllowCidrs", "egressAllowCidrs", map[string]any{"egressAllowCidrs": list(101, func(i int) string { return fmt.Sprintf("203.0.%d.0/24", i) })}, policy.MaxEgressEntries},
		{"imageAllowList", "imageAllowList", map[string]any{"imageAllowList": list(65, func(i int) string { return fmt.Sprintf("r%d/*", i) })}, policy.MaxImageAllowList},
		{"imagePullSecrets", "imagePullSecrets", map[string]any{"imagePullSecrets": list(17, func(i int) string { return fmt.Sprintf("s%d", i) })}, policy.MaxSmallMap},
		{"serviceAccountAnnotations", "serviceAccountAnnotations", map[string]any{"serviceAccountAnnotations": keys(17)}, policy.MaxSmallMap},
		{"paperclipServerPodLabels", "paperclipServerPodLabels", map[string]any{"paperclipServerPodLabels": keys(17)}, policy.MaxSmallMap},
		{"adapters", "adapters", map[string]any{"adapterType": "x", "adapters": list(33, func(i int) string { return "" })}, policy.MaxAdapters},
		{"envKeys", "adapters[0].envKeys", map[string]any{"adapterType": "x", "adapters": []any{adapter("envKeys", list(33, func(i int) string { return fmt.Sprintf("K%d", i) }))}}, policy.MaxAdapterEntries},
		{"allowFqdns", "adapters[0].allowFqdns", map[string]any{"adapterType": "x", "adapters": []any{adapter("allowFqdns", names(33))}}, policy.MaxAdapterEntries},
		{"probeCommand", "adapters[0].probeCommand", map[string]any{"adapterType": "x", "adapters": []any{adapter("probeCommand", names(33))}}, policy.MaxAdapterEntries},
		{"defaultEnv", "adapters[0].defaultEnv", map[string]any{"adapterType": "x", "adapters": []any{adapter("defaultEnv", keysEnv(65))}}, policy.MaxDefaultEnv},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.field == "adapters" {
				entries := make([]any, 33)
				for i := range entries {
					entries[i] = map[string]any{"adapterType": fmt.Sprintf("x%d", i), "runtimeImage": "ghcr.io/x/y:v1"}
				}
				entries[0].(map[string]any)["adapterType"] = "x"
				tc.cfg["adapters"] = entries
			}
			raw, err := json.Marshal(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = policy.ParseConfig(raw)
			var ve *policy.ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("ParseConfig = %v, want a ValidationError", err)
			}
			want := policy.FieldError{Field: tc.field, Message: fmt.Sprintf("has %d entries; at most %d are allowed", tc.max+1, tc.max)}
			if tc.field == "egressAllowFqdns" {
				want.Message = fmt.Sprintf("has 40000 entries; at most %d are allowed", tc.max)
			}
			if diff := cmp.Diff([]policy.FieldError{want}, ve.Errors); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
	// A run's egress grant is bounded as the config's lists are.
	grant, _ := json.Marshal(map[string]any{"networkEgress": map[string]any{"allowCidrs": list(101, func(i int) string { return fmt.Sprintf("203.0.%d.0/24", i) })}})
	_, err := policy.ParseEgressGrant(grant)
	var ve *policy.ValidationError
	if !errors.As(err, &ve) || len(ve.Errors) != 1 || ve.Errors[0].Field != policy.EgressGrantPath+".allowCidrs" {
		t.Errorf("ParseEgressGrant(101 CIDRs) = %v, want one error naming %s.allowCidrs", err, policy.EgressGrantPath)
	}
}

func keysEnv(n int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m[fmt.Sprintf("K%d", i)] = "v"
	}
	return m
}
