package sandboxd

import (
	"encoding/json"
	"os"
	"testing"
)

// TestExcludeCases runs testdata/excludes/cases.json at the repository's root: the exclude
// globs of sync out (excluder) must match as the plugin's sync in does (excludes.test.ts).
func TestExcludeCases(t *testing.T) {
	b, err := os.ReadFile("../../testdata/excludes/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var table struct {
		Cases []struct {
			Glob     string `json:"glob"`
			Name     string `json:"name"`
			Excluded bool   `json:"excluded"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(b, &table); err != nil {
		t.Fatal(err)
	}
	for _, c := range table.Cases {
		x, err := newExcluder([]string{c.Glob})
		if err != nil {
			t.Errorf("glob %q: %v", c.Glob, err)
			continue
		}
		if got := leftOut(x, c.Name); got != c.Excluded {
			t.Errorf("glob %q, name %q: excluded %v, want %v", c.Glob, c.Name, got, c.Excluded)
		}
	}
}

// leftOut is whether Tar leaves name out: it or a directory above it is excluded (the walk
// never enters an excluded directory).
func leftOut(x excluder, name string) bool {
	for i := range len(name) {
		if name[i] == '/' && x.excluded(name[:i]) {
			return true
		}
	}
	return x.excluded(name)
}
