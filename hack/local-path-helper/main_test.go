package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The provisioner's setup: the directory exists with mode 0777 whatever the umask, and a second
// create (a helper pod run again after a provisioner restart) succeeds.
func TestCreateMakesAWorldWritableDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "pvc-1_ns_claim")
	for range 2 {
		if err := run([]string{"-p", dir, "-s", "1073741824", "-m", "Filesystem", "-a", "create"}, io.Discard); err != nil {
			t.Fatal(err)
		}
	}
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !fi.IsDir() || fi.Mode().Perm() != 0o777 {
		t.Errorf("created %v, want a directory with mode 0777", fi.Mode())
	}
}

// The provisioner's teardown: the directory and everything in it go; a symbolic link a pod left
// inside is removed, not followed; deleting what is already gone succeeds (a retried delete).
func TestDeleteRemovesTheVolumeAndNothingOutside(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(root, "outside")
	if err := os.MkdirAll(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(outside, "keep")
	if err := os.WriteFile(keep, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "data", "pvc-1_ns_claim")
	if err := os.MkdirAll(filepath.Join(dir, "home", ".claude"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "home", ".claude", "session"), []byte("s"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "escape")); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := run([]string{"-p", dir, "-s", "0", "-m", "Filesystem", "-a", "delete"}, io.Discard); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Errorf("the volume's directory is still there (%v)", err)
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("a file outside the volume, linked from inside it, is gone: %v", err)
	}
}

func TestRefusesWhatTheProvisionerNeverPasses(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "v")
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"no path", []string{"-a", "create"}, "-p is required"},
		{"relative", []string{"-p", "data/v", "-a", "create"}, "absolute, clean"},
		{"unclean", []string{"-p", dir + "/../v", "-a", "delete"}, "absolute, clean"},
		{"the root", []string{"-p", "/", "-a", "delete"}, "not the root"},
		{"below the root", []string{"-p", "/var", "-a", "delete"}, "not the root"},
		{"block volume", []string{"-p", dir, "-m", "Block", "-a", "create"}, "only Filesystem"},
		{"unknown action", []string{"-p", dir, "-a", "resize"}, "want create or delete"},
		{"no action", []string{"-p", dir}, "want create or delete"},
		{"extra arguments", []string{"-p", dir, "-a", "create", "x"}, "unexpected arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := run(tc.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("run(%q) = %v, want an error containing %q", tc.args, err, tc.wantErr)
			}
		})
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Errorf("a refused call left %s behind", dir)
	}
}
