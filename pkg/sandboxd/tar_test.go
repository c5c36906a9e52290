package sandboxd_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// tree describes a directory for the round trip: each name's type, mode and content (a file's
// bytes, a symlink's target).
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		desc := fi.Mode().String()
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		case fi.Mode().IsRegular():
			b, _ := os.ReadFile(p)
			desc += " " + string(b)
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// makeTree writes files (name → content; a name ending in "/" is a directory, content "->x" a
// symlink to x) under dir, with modes.
func makeTree(t *testing.T, dir string, files map[string]string, modes map[string]fs.FileMode) {
	t.Helper()
	for _, name := range slices.Sorted(mapsKeys(files)) {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		var err error
		switch c := files[name]; {
		case strings.HasSuffix(name, "/"):
			err = os.MkdirAll(p, 0o755)
		case strings.HasPrefix(c, "->"):
			err = os.Symlink(c[2:], p)
		default:
			err = os.WriteFile(p, []byte(c), 0o644)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	for name, m := range modes {
		if err := os.Chmod(filepath.Join(dir, name), m); err != nil {
			t.Fatal(err)
		}
	}
}

func mapsKeys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func TestTarUntarRoundTrip(t *testing.T) {
	src := t.TempDir()
	files := map[string]string{
		"README.md":                    "# hi\n",
		"bin/run.sh":                   "#!/bin/sh\necho run\n",
		"home/.claude/session.json":    `{"id":"s1"}`,
		"empty/":                       "",
		"deep/a/b/c/d/e/f/g/h/file":    "deep",
		strings.Repeat("long", 40):     "a name over ustar's 100 bytes",
		"unicode/ünï €.txt":            "utf-8",
		"links/rel":                    "->../README.md",
		"links/dangling":               "->nowhere",
		"links/dir":                    "->../bin",
		"big":                          strings.Repeat("0123456789abcdef", 100_000),
		"home/.config/secret-with-600": "s",
	}
	makeTree(t, src, files, map[string]fs.FileMode{"bin/run.sh": 0o755, "home/.config/secret-with-600": 0o600, "home/.claude": 0o700})
	var buf bytes.Buffer
	st, err := sandboxd.Tar(&buf, sandboxd.TarOptions{Root: src, Names: []string{"."}})
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "dst")
	ust, err := sandboxd.Untar(&buf, sandboxd.UntarOptions{Root: dst})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(tree(t, src), tree(t, dst)); diff != "" {
		t.Errorf("the tree after tar | untar (-src +dst):\n%s", diff)
	}
	if st != ust || st.Files != 11 {
		t.Errorf("tar counted %+v, untar %+v: want the same, 11 files", st, ust)
	}
}

func TestTarNamesAndExcludes(t *testing.T) {
	src := t.TempDir()
	makeTree(t, src, map[string]string{
		"ws/a.go": "a", "ws/a_test.go": "t", "ws/node_modules/x/i.js": "n", "ws/sub/node_modules/y": "n",
		"ws/.git/HEAD": "h", "ws/docs/x.md": "d", "other/o": "o",
	}, nil)
	for _, tc := range []struct {
		name     string
		names    []string
		excludes []string
		want     []string
	}{
		{"one file", []string{"ws/a.go"}, nil, []string{"ws/a.go"}},
		{"a tree", []string{"ws/docs"}, nil, []string{"ws/docs/", "ws/docs/x.md"}},
		{"a directory anywhere", []string{"ws"}, []string{"node_modules", ".git", "docs"}, []string{"ws/", "ws/a.go", "ws/a_test.go", "ws/sub/"}},
		{"star matches slash", []string{"."}, []string{"ws/*"}, []string{"other/", "other/o", "ws/"}},
		{"unanchored suffix", []string{"ws"}, []string{"*_test.go", "x/i.js", "sub", "node_modules", ".git", "docs"}, []string{"ws/", "ws/a.go"}},
		{"class and ?", []string{"ws/docs", "ws/a.go", "ws/a_test.go"}, []string{"[xyz].md", "?.go", "[!a]_test.go"}, []string{"ws/docs/", "ws/a_test.go"}},
		{"the name itself", []string{"ws", "other"}, []string{"other"}, []string{"ws/", "ws/.git/", "ws/.git/HEAD", "ws/a.go", "ws/a_test.go", "ws/docs/", "ws/docs/x.md", "ws/node_modules/", "ws/node_modules/x/", "ws/node_modules/x/i.js", "ws/sub/", "ws/sub/node_modules/", "ws/sub/node_modules/y"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if _, err := sandboxd.Tar(&buf, sandboxd.TarOptions{Root: src, Names: tc.names, Excludes: tc.excludes}); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, names(t, &buf)); diff != "" {
				t.Errorf("entries (-want +got):\n%s", diff)
			}
		})
	}
}

func names(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h.Name)
	}
}

func TestTarFollowSymlinks(t *testing.T) {
	outer := t.TempDir()
	src := filepath.Join(outer, "src")
	makeTree(t, src, map[string]string{"real/f": "bytes", "to-dir": "->real", "to-file": "->real/f"}, nil)
	if err := os.WriteFile(filepath.Join(outer, "secret"), []byte("s"), 0o600); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := sandboxd.Tar(&buf, sandboxd.TarOptions{Root: src, Names: []string{"to-dir", "to-file"}, FollowSymlinks: true}); err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if _, err := sandboxd.Untar(&buf, sandboxd.UntarOptions{Root: dst}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"to-dir": "drwxr-xr-x", "to-dir/f": "-rw-r--r-- bytes", "to-file": "-rw-r--r-- bytes"}
	if diff := cmp.Diff(want, tree(t, dst)); diff != "" {
		t.Errorf("followed links (-want +got):\n%s", diff)
	}

	for _, tc := range []struct {
		name, link, wantIn string
	}{
		{"out", "../secret", "leads out of the root"},
		{"absolute", filepath.Join(outer, "secret"), "leads out of the root"},
		{"loop", ".", "symlink loop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if err := os.Symlink(tc.link, filepath.Join(root, "l")); err != nil {
				t.Fatal(err)
			}
			_, err := sandboxd.Tar(io.Discard, sandboxd.TarOptions{Root: root, Names: []string{"."}, FollowSymlinks: true})
			var se *sandboxd.SyncError
			if !errors.As(err, &se) || !se.Refused || se.Entry != "l" || !strings.Contains(se.Error(), tc.wantIn) {
				t.Errorf("Tar: %v, want entry l refused: %s", err, tc.wantIn)
			}
		})
	}
}

func TestTarRefusals(t *testing.T) {
	src := t.TempDir()
	makeTree(t, src, map[string]string{"a": "0123456789", "b": "0123456789"}, nil)
	for _, tc := range []struct {
		name      string
		opts      sandboxd.TarOptions
		wantEntry string
		wantIn    string
	}{
		{"missing", sandboxd.TarOptions{Names: []string{"nope"}}, "nope", "no such file"},
		{"dotdot", sandboxd.TarOptions{Names: []string{"../etc"}}, "../etc", "leads out of the root"},
		{"absolute", sandboxd.TarOptions{Names: []string{"/etc"}}, "/etc", "leads out of the root"},
		{"max bytes", sandboxd.TarOptions{Names: []string{"."}, MaxBytes: 15}, "b", "more than 15 bytes"},
		{"bad glob", sandboxd.TarOptions{Names: []string{"."}, Excludes: []string{"[a"}}, src, "malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Root = src
			_, err := sandboxd.Tar(io.Discard, tc.opts)
			var se *sandboxd.SyncError
			if !errors.As(err, &se) || !se.Refused || se.Entry != tc.wantEntry || !strings.Contains(se.Error(), tc.wantIn) {
				t.Fatalf("Tar: %v, want entry %q refused: %s", err, tc.wantEntry, tc.wantIn)
			}
		})
	}
}

func TestSyncErrorIsOneLine(t *testing.T) {
	err := &sandboxd.SyncError{Op: "untar", Entry: "a\nuntar: \"b\": forged", Err: errors.New("reason\nwith a line")}
	got := err.Error()
	if strings.ContainsAny(got, "\n\r") || !strings.HasPrefix(got, `untar: "a\nuntar: \"b\": forged": `) {
		t.Errorf("Error() = %q, want one line with the entry quoted", got)
	}
	if fmt.Sprint(err.ExitCode()) != "74" {
		t.Errorf("an I/O failure exits %d, want 74", err.ExitCode())
	}
}
