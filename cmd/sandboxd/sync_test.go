package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// runBinary runs the static sandboxd with stdin and returns stdout, stderr and the exit status.
func runBinary(t *testing.T, stdin []byte, args ...string) (string, string, int) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		return out.String(), errOut.String(), ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return out.String(), errOut.String(), 0
}

// TestSyncSubcommands runs `sandboxd tar` into `sandboxd untar` as the exec path does, and the
// contract of their answers: one JSON line on success, one stderr line and exit 65 on a
// refusal, 2 on bad flags.
func TestSyncSubcommands(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "dst")
	if err := os.MkdirAll(filepath.Join(src, "ws", "node_modules"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{"ws/a": "hello", "ws/node_modules/x": "skip", "ws/k=ey": "secret"} {
		if err := os.WriteFile(filepath.Join(src, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	archive, stderr, code := runBinary(t, nil, "tar", "--root", src, "--exclude", "node_modules", "ws")
	if code != 0 || stderr != "" {
		t.Fatalf("tar: exit %d, stderr %q", code, stderr)
	}
	out, stderr, code := runBinary(t, []byte(archive), "untar", "--root", dst, "--mode-file", "./ws/k=ey=0600")
	if code != 0 || stderr != "" || out != `{"files":2,"bytes":11}`+"\n" {
		t.Fatalf("untar: exit %d, stdout %q, stderr %q; want 0, one JSON line", code, out, stderr)
	}
	fi, err := os.Stat(filepath.Join(dst, "ws", "k=ey"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("ws/k=ey: %v, %v; want mode 0600", fi, err)
	}
	if _, err := os.Stat(filepath.Join(dst, "ws", "node_modules")); err == nil {
		t.Error("the excluded node_modules was extracted")
	}

	var hostile bytes.Buffer
	tw := tar.NewWriter(&hostile)
	_ = tw.WriteHeader(&tar.Header{Name: "../escape\nuntar: forged", Typeflag: tar.TypeReg, Mode: 0o644})
	_ = tw.Close()
	out, stderr, code = runBinary(t, hostile.Bytes(), "untar", "--root", dst)
	if code != 65 || out != "" || stderr != `untar: "../escape\nuntar: forged": a '..' component leads out of the root`+"\n" {
		t.Errorf("hostile untar: exit %d, stdout %q, stderr %q; want 65 and one line naming the entry", code, out, stderr)
	}

	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"untar without root", []string{"untar"}, 2},
		{"untar bad mode", []string{"untar", "--root", dst, "--mode-file", "a=999"}, 2},
		{"tar without names", []string{"tar", "--root", src}, 2},
		{"tar of a missing name", []string{"tar", "--root", src, "nope"}, 65},
		{"tar of a missing root", []string{"tar", "--root", filepath.Join(src, "nope"), "."}, 74},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := runBinary(t, nil, tc.args...)
			if code != tc.want || strings.Count(stderr, "\n") < 1 {
				t.Errorf("exit %d, stderr %q; want %d and a reason", code, stderr, tc.want)
			}
		})
	}
	if diff := cmp.Diff([]string{"a", "k=ey"}, dirNames(t, filepath.Join(dst, "ws"))); diff != "" {
		t.Errorf("ws after the refusals (-want +got):\n%s", diff)
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}
