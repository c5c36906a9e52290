package sandboxd_test

import (
	"strings"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// TestOutputCapRaised: a start's maxOutputBytes raises its journal's cap above the daemon's
// MaxOutputBytes (a sync out of a tree larger than 256 MiB), up to OutputBytesLimit and no
// further; 0 keeps MaxOutputBytes.
func TestOutputCapRaised(t *testing.T) {
	h := startServer(t, func(o *sandboxd.Options) {
		o.MaxOutputBytes, o.OutputBytesLimit = 64<<10, 1<<20
	})
	const printed = "2000000" // bytes: above both bounds
	for _, tc := range []struct {
		name     string
		max      int64
		wantKept int // at most, and more than wantKept/2
	}{
		{"the daemon's cap", 0, 64 << 10},
		{"raised", 512 << 10, 512 << 10},
		{"raised to the limit at most", 8 << 20, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := run(t, h.tls, sandboxd.Spec{Command: "head", Args: []string{"-c", printed, "/dev/zero"}, MaxOutputBytes: tc.max}, nil)
			if !got.Truncated || len(got.Stdout) > tc.wantKept || len(got.Stdout) < tc.wantKept/2 {
				t.Errorf("truncated=%v with %d bytes, want truncated near %d", got.Truncated, len(got.Stdout), tc.wantKept)
			}
		})
	}
}

// TestJournalDiskBound: past the journals' disk bound output is dropped (the exit says
// truncated and why) rather than filling the emptyDir, and a removed journal gives its disk
// back.
func TestJournalDiskBound(t *testing.T) {
	h := startServer(t, func(o *sandboxd.Options) {
		o.MaxOutputBytes, o.JournalDisk = 8<<20, 1<<20
	})
	for range 2 { // the second run finds the first's disk given back
		spec := sandboxd.Spec{ID: newID(), Command: "head", Args: []string{"-c", "3000000", "/dev/zero"}}
		got := run(t, h.tls, spec, nil)
		if !got.Truncated || len(got.Stdout) > 1<<20 || len(got.Stdout) < 512<<10 || !strings.Contains(got.Error, "--journal-disk-bytes") {
			t.Fatalf("truncated=%v with %d bytes, error %q; want truncated under 1 MiB naming --journal-disk-bytes", got.Truncated, len(got.Stdout), got.Error)
		}
		if err := h.tls.Delete(t.Context(), spec.ID); err != nil {
			t.Fatal(err)
		}
	}
}
