package execspec

import (
	"os/exec"
	"strings"
	"testing"
)

func TestValidID(t *testing.T) {
	for _, tc := range []struct {
		id   string
		want bool
	}{
		{"01J9ZXKQ3V4W5X6Y7Z8A9B0C1D", true}, {"a_b-C9", true}, {strings.Repeat("a", MaxIDLen), true},
		{"", false}, {strings.Repeat("a", MaxIDLen+1), false}, {"a.b", false}, {"a b", false}, {"a/b", false},
		{"a*", false}, {"a>", false}, {"é", false},
	} {
		if got := ValidID(tc.id); got != tc.want {
			t.Errorf("ValidID(%q) = %v, want %v", tc.id, got, tc.want)
		}
	}
}

// TestVocabularyHasOneOwner: the exec protocol, the run events and the dispatcher speak this
// package's vocabulary, not the pod daemon's.
func TestVocabularyHasOneOwner(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "../execproto", "../events", "../dispatch").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		if dep == "github.com/kubeclip/kubeclip/pkg/sandboxd" {
			t.Errorf("pkg/execproto, pkg/events or pkg/dispatch depends on pkg/sandboxd")
		}
	}
}
