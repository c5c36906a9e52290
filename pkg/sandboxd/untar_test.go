package sandboxd_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// entry is one tar entry of a test archive.
type entry struct {
	name string
	typ  byte // default tar.TypeReg
	body string
	link string
	size int64 // default len(body); larger: the archive ends inside the entry
	mode int64
}

// archive writes entries as a tar stream. An entry whose size exceeds its body is written as
// a header and the body only: the stream ends there, as a hostile or broken one does.
func archive(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Size: e.size, Mode: e.mode}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Size == 0 && h.Typeflag == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("writing %q: %v", e.name, err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatalf("writing %q: %v", e.name, err)
		}
		if h.Size > int64(len(e.body)) {
			_ = tw.Flush()
			return buf.Bytes()
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// snapshot lists every name under dir with its type and size: what a test compares to prove
// nothing was written outside the root.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = fmt.Sprintf("%v %d", fi.Mode(), fi.Size())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// hostileSetup is a sandbox: outer/ holds a file and the root; the root holds a symlink the
// tenant made to outer (a write through it would land outside).
func hostileSetup(t *testing.T) (outer, root string) {
	t.Helper()
	outer = t.TempDir()
	root = filepath.Join(outer, "root")
	if err := os.MkdirAll(filepath.Join(root, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(outer, "secret"), []byte("s"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outer, filepath.Join(root, "tenantlink")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "sub", "keep"), []byte("k"), 0o644); err != nil {
		t.Fatal(err)
	}
	return outer, root
}

func TestUntarRefusesHostileArchives(t *testing.T) {
	long := strings.Repeat("n", 5000)
	for _, tc := range []struct {
		name      string
		entries   []entry
		maxBytes  int64
		maxFiles  int
		wantEntry string
		wantIn    string // in the reason
		wantFiles []string
	}{
		{name: "dotdot", entries: []entry{{name: "../evil", body: "x"}}, wantEntry: "../evil", wantIn: "'..' component"},
		{name: "dotdot inside", entries: []entry{{name: "sub/../../evil", body: "x"}}, wantEntry: "sub/../../evil", wantIn: "leads out of the root"},
		{name: "absolute", entries: []entry{{name: "/tmp/evil", body: "x"}}, wantEntry: "/tmp/evil", wantIn: "absolute name"},
		{name: "symlink out", entries: []entry{{name: "l", typ: tar.TypeSymlink, link: "../secret"}}, wantEntry: "l", wantIn: "symlink leads out"},
		{name: "symlink out deep", entries: []entry{{name: "sub/x/l", typ: tar.TypeSymlink, link: "../../.."}}, wantEntry: "sub/x/l", wantIn: "symlink leads out"},
		{name: "symlink absolute", entries: []entry{{name: "l", typ: tar.TypeSymlink, link: "/etc"}}, wantEntry: "l", wantIn: "absolute path"},
		{
			name: "write through own symlink", wantEntry: "in/f", wantIn: `written through the symlink "in"`,
			entries:   []entry{{name: "in", typ: tar.TypeSymlink, link: "sub"}, {name: "in/f", body: "x"}},
			wantFiles: []string{"in"},
		},
		{name: "write through tenant symlink", entries: []entry{{name: "tenantlink/evil", body: "x"}}, wantEntry: "tenantlink/evil", wantIn: "written through the symlink"},
		{name: "dir through tenant symlink", entries: []entry{{name: "tenantlink/d/", typ: tar.TypeDir}}, wantEntry: "tenantlink/d/", wantIn: "written through the symlink"},
		{name: "hardlink out", entries: []entry{{name: "h", typ: tar.TypeLink, link: "../secret"}}, wantEntry: "h", wantIn: "hardlinks are refused"},
		{name: "hardlink absolute", entries: []entry{{name: "h", typ: tar.TypeLink, link: "/etc/passwd"}}, wantEntry: "h", wantIn: "hardlinks are refused"},
		{name: "hardlink through tenant symlink", entries: []entry{{name: "h", typ: tar.TypeLink, link: "tenantlink/secret"}}, wantEntry: "h", wantIn: "hardlinks are refused"},
		{name: "char device", entries: []entry{{name: "null", typ: tar.TypeChar}}, wantEntry: "null", wantIn: "device node"},
		{name: "block device", entries: []entry{{name: "sda", typ: tar.TypeBlock}}, wantEntry: "sda", wantIn: "device node"},
		{name: "fifo", entries: []entry{{name: "p", typ: tar.TypeFifo}}, wantEntry: "p", wantIn: "fifo"},
		{name: "huge header", entries: []entry{{name: "bomb", size: 1 << 40}}, wantEntry: "bomb", wantIn: "--max-bytes"},
		{
			name: "bytes over the bound", maxBytes: 1000, wantEntry: "b", wantIn: "more than 1000 bytes",
			entries:   []entry{{name: "a", body: strings.Repeat("a", 600)}, {name: "b", body: strings.Repeat("b", 600)}},
			wantFiles: []string{"a"},
		},
		{
			name: "too many files", maxFiles: 3, wantEntry: "d", wantIn: "more than 3 entries",
			entries:   []entry{{name: "a", body: "1"}, {name: "b", body: "2"}, {name: "c", body: "3"}, {name: "d", body: "4"}},
			wantFiles: []string{"a", "b", "c"},
		},
		{name: "long name", entries: []entry{{name: long, body: "x"}}, wantEntry: long, wantIn: "longer than 4096"},
		{name: "truncated file", entries: []entry{{name: "t", body: "half", size: 100}}, wantEntry: "t", wantIn: "ended inside the file"},
		{name: "file over a directory", entries: []entry{{name: "sub", body: "x"}}, wantEntry: "sub", wantIn: "a directory exists"},
		{name: "the root as a file", entries: []entry{{name: ".", body: "x"}}, wantEntry: ".", wantIn: "root itself"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outer, root := hostileSetup(t)
			before := snapshot(t, outer)
			_, err := sandboxd.Untar(bytes.NewReader(archive(t, tc.entries...)), sandboxd.UntarOptions{Root: root, MaxBytes: tc.maxBytes, MaxFiles: tc.maxFiles})
			var se *sandboxd.SyncError
			if !errors.As(err, &se) {
				t.Fatalf("Untar: %v, want a *SyncError", err)
			}
			if !se.Refused || se.ExitCode() != sandboxd.ExitSyncRefused {
				t.Errorf("refused %v, exit %d: want refused, %d", se.Refused, se.ExitCode(), sandboxd.ExitSyncRefused)
			}
			if se.Entry != tc.wantEntry {
				t.Errorf("entry %.40q, want %.40q", se.Entry, tc.wantEntry)
			}
			if !strings.Contains(se.Error(), tc.wantIn) || strings.Contains(se.Error(), "\n") {
				t.Errorf("error %.200q: want one line containing %q", se.Error(), tc.wantIn)
			}
			after := snapshot(t, outer)
			for _, f := range tc.wantFiles {
				delete(after, filepath.Join("root", f))
			}
			if diff := cmp.Diff(before, after); diff != "" {
				t.Errorf("the sandbox changed beyond %v (-before +after):\n%s", tc.wantFiles, diff)
			}
		})
	}
}

// TestUntarRefusesHugePAXRecords: a PAX extended header over 1 MiB (archive/tar's bound on
// special headers) is refused before anything is extracted, naming the entry by its place.
func TestUntarRefusesHugePAXRecords(t *testing.T) {
	rec := strings.Repeat("x", 2<<20)
	rec = fmt.Sprintf("%d comment=%s\n", len(rec)+len(" comment=\n")+7, rec)
	data := archive(t, entry{name: "pax", body: rec}, entry{name: "p", body: "x"})
	// Make the first entry the PAX header of the second: typeflag 'x', checksum recomputed.
	data[156] = tar.TypeXHeader
	copy(data[148:156], "        ")
	sum := 0
	for _, b := range data[:512] {
		sum += int(b)
	}
	copy(data[148:156], fmt.Sprintf("%06o\x00 ", sum))
	root := t.TempDir()
	_, err := sandboxd.Untar(bytes.NewReader(data), sandboxd.UntarOptions{Root: root})
	var se *sandboxd.SyncError
	if !errors.As(err, &se) || !se.Refused || se.Entry != "#1" || !errors.Is(err, tar.ErrFieldTooLong) {
		t.Fatalf("Untar: %v, want entry #1 refused with %v", err, tar.ErrFieldTooLong)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Errorf("the root holds %d entries, want none", len(entries))
	}
}

// TestUntarLeavesNoPartialFile: a refusal mid-file (the archive ends inside it) leaves neither
// the file under its name nor the temporary file, and an earlier file in place.
func TestUntarLeavesNoPartialFile(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "b"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	data := archive(t, entry{name: "a", body: "whole"}, entry{name: "b", body: "half of it", size: 1 << 20})
	_, err := sandboxd.Untar(bytes.NewReader(data), sandboxd.UntarOptions{Root: root})
	if err == nil {
		t.Fatal("Untar of a truncated archive succeeded")
	}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if diff := cmp.Diff([]string{"a", "b"}, names); diff != "" {
		t.Errorf("names in the root (-want +got):\n%s", diff)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "b")); string(b) != "old" {
		t.Errorf("b holds %q, want the old %q", b, "old")
	}
}

func TestUntarModes(t *testing.T) {
	root := filepath.Join(t.TempDir(), "new", "root")
	data := archive(t,
		entry{name: "./d/", typ: tar.TypeDir, mode: 0o750},
		entry{name: "./d/secret", body: "s", mode: 0o644},
		entry{name: "./d/run.sh", body: "#!/bin/sh", mode: 0o4755},
		entry{name: "ro/", typ: tar.TypeDir, mode: 0o555},
		entry{name: "ro/f", body: "in a read-only directory"},
	)
	st, err := sandboxd.Untar(bytes.NewReader(data), sandboxd.UntarOptions{Root: root, Modes: map[string]fs.FileMode{"d/secret": 0o600}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(sandboxd.SyncStats{Files: 3, Bytes: int64(1 + 9 + 24)}, st); diff != "" {
		t.Errorf("stats (-want +got):\n%s", diff)
	}
	for name, want := range map[string]fs.FileMode{"d": fs.ModeDir | 0o750, "d/secret": 0o600, "d/run.sh": 0o755, "ro": fs.ModeDir | 0o555, "ro/f": 0o644} {
		fi, err := os.Lstat(filepath.Join(root, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", name, fi.Mode(), want)
		}
	}
	_ = os.Chmod(filepath.Join(root, "ro"), 0o755) // let t.TempDir remove it
}
