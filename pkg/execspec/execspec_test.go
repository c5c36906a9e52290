package execspec

import (
	"bytes"
	"encoding/hex"
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

// TestDeriveBindSeed pins the bind seed's derivation (vectors from Python's hmac: the dispatcher
// and sandboxd of different releases must agree) and keeps it apart from every lease seed.
func TestDeriveBindSeed(t *testing.T) {
	master := []byte("0123456789abcdef0123456789abcdef")
	for _, tc := range []struct{ ns, pod, want string }{
		{"tenant-a", "warm-1", "9ea5b630cc914f30f6727e424dadfa0ad01b540e0fb1fe21e24cba4c926f776c"},
		{"tenant-a", "warm-2", "830c13e66d53ac68e359ef47a57dca56edae5547b59e4f853d1631dd5b9b18bf"},
	} {
		if got := hex.EncodeToString(DeriveBindSeed(master, tc.ns, tc.pod)); got != tc.want {
			t.Errorf("DeriveBindSeed(%s, %s) = %s, want %s", tc.ns, tc.pod, got, tc.want)
		}
	}
	bind := DeriveBindSeed(master, "tenant-a", "warm-1")
	for name, other := range map[string][]byte{
		"the lease seed of the same names": DeriveSeed(master, "tenant-a", "warm-1"),
		"another pod's":                    DeriveBindSeed(master, "tenant-a", "warm-2"),
		"another namespace's":              DeriveBindSeed(master, "tenant-b", "warm-1"),
		"the name boundary moved":          DeriveBindSeed(master, "tenant-aw", "arm-1"),
		"another master key's":             DeriveBindSeed([]byte("another master key, 32 bytes...."), "tenant-a", "warm-1"),
	} {
		if bytes.Equal(bind, other) {
			t.Errorf("the bind seed equals %s", name)
		}
	}
	if len(bind) != SeedSize {
		t.Errorf("%d bytes, want SeedSize %d", len(bind), SeedSize)
	}
}

func TestTTYValidate(t *testing.T) {
	for _, tc := range []struct {
		tty     TTY
		wantErr string
	}{
		{TTY{Rows: 24, Cols: 80}, ""},
		{TTY{Rows: 1, Cols: MaxTTYDim}, ""},
		{TTY{Rows: 0, Cols: 80}, "rows: must be 1-1000, got 0"},
		{TTY{Rows: 24, Cols: -1}, "cols: must be 1-1000, got -1"},
		{TTY{Rows: MaxTTYDim + 1, Cols: 80}, "rows: must be 1-1000, got 1001"},
	} {
		err := tc.tty.Validate()
		got := ""
		if err != nil {
			got = err.Error()
		}
		if got != tc.wantErr {
			t.Errorf("%+v: error %q, want %q", tc.tty, got, tc.wantErr)
		}
	}
}
