package broker_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/broker"
)

// TestKeyNames: the operator's --brokered-keys, one comma-separated value, many values or both,
// as the exec-worker and the dispatcher both read it.
func TestKeyNames(t *testing.T) {
	for _, tc := range []struct {
		name    string
		in      []string
		want    []string
		wantErr string
	}{
		{name: "none", in: nil, want: nil},
		{name: "commas and values", in: []string{"ANTHROPIC_API_KEY, OPENAI_API_KEY", "GEMINI_API_KEY", " , "}, want: []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY"}},
		{name: "a name with =", in: []string{"A=B"}, wantErr: `brokered key "A=B" must be a non-empty environment key without = or NUL`},
		{name: "a name with NUL", in: []string{"A\x00B"}, wantErr: "without = or NUL"},
		{name: "a name twice", in: []string{"K,L", "K"}, wantErr: `brokered key "K" is named twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := broker.KeyNames(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("KeyNames(%q) = %v, %v, want an error saying %q", tc.in, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("KeyNames(%q) = %v, %v, want %v", tc.in, got, err, tc.want)
			}
		})
	}
}
