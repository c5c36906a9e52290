package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// readTar returns the headers and contents of a tar stream, in order.
func readTar(t *testing.T, r io.Reader) ([]*tar.Header, map[string][]byte) {
	t.Helper()
	var hdrs []*tar.Header
	data := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return hdrs, data
		}
		if err != nil {
			t.Fatalf("reading tar: %v", err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("reading %s: %v", hdr.Name, err)
		}
		hdrs = append(hdrs, hdr)
		data[hdr.Name] = b
	}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRunWritesDockerSaveTarball(t *testing.T) {
	stub := writeFile(t, "stub", "#!stub binary")
	tini := writeFile(t, "tini", "#!tini binary")
	out := filepath.Join(t.TempDir(), "img.tar")

	err := run([]string{
		"--tag", "kubeclip.local/agent-stub:dev", "--out", out,
		"--entrypoint", "/usr/local/bin/paperclip-agent-shim", "--user", "1000", "--env", "FOO=bar",
		stub + ":/usr/local/bin/paperclip-agent-shim", tini + ":/usr/bin/tini",
	}, io.Discard)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, outer := readTar(t, f)

	var manifest []manifestEntry
	if err := json.Unmarshal(outer["manifest.json"], &manifest); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	if len(manifest) != 1 || len(manifest[0].Layers) != 1 {
		t.Fatalf("manifest = %+v, want one image with one layer", manifest)
	}
	m := manifest[0]
	if diff := cmp.Diff([]string{"kubeclip.local/agent-stub:dev"}, m.RepoTags); diff != "" {
		t.Errorf("RepoTags (-want +got):\n%s", diff)
	}

	// The config is named after its own digest and lists the layer's digest as its diff id.
	config, layer := outer[m.Config], outer[m.Layers[0]]
	if got := sha256Hex(config) + ".json"; got != m.Config {
		t.Errorf("config file %s has digest %s", m.Config, got)
	}
	var cfg configFile
	if err := json.Unmarshal(config, &cfg); err != nil {
		t.Fatalf("config: %v", err)
	}
	if diff := cmp.Diff([]string{"sha256:" + sha256Hex(layer)}, cfg.RootFS.DiffIDs); diff != "" {
		t.Errorf("diff_ids (-want +got):\n%s", diff)
	}
	wantConfig := containerConfig{
		User:       "1000",
		Env:        []string{defaultPath, "FOO=bar"},
		Entrypoint: []string{"/usr/local/bin/paperclip-agent-shim"},
		WorkingDir: "/",
	}
	if diff := cmp.Diff(wantConfig, cfg.Config); diff != "" {
		t.Errorf("container config (-want +got):\n%s", diff)
	}
	if cfg.OS != "linux" || cfg.RootFS.Type != "layers" {
		t.Errorf("os/rootfs = %q/%q, want linux/layers", cfg.OS, cfg.RootFS.Type)
	}

	// The layer holds every parent directory before its contents, all owned by root, mode 0755.
	hdrs, files := readTar(t, bytes.NewReader(layer))
	type entry struct {
		Name     string
		Type     byte
		Mode     int64
		UID, GID int
	}
	var got []entry
	for _, h := range hdrs {
		got = append(got, entry{h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid})
	}
	want := []entry{
		{"usr/", tar.TypeDir, 0o755, 0, 0},
		{"usr/bin/", tar.TypeDir, 0o755, 0, 0},
		{"usr/local/", tar.TypeDir, 0o755, 0, 0},
		{"usr/local/bin/", tar.TypeDir, 0o755, 0, 0},
		{"usr/bin/tini", tar.TypeReg, 0o755, 0, 0},
		{"usr/local/bin/paperclip-agent-shim", tar.TypeReg, 0o755, 0, 0},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layer entries (-want +got):\n%s", diff)
	}
	if string(files["usr/local/bin/paperclip-agent-shim"]) != "#!stub binary" {
		t.Errorf("stub content = %q", files["usr/local/bin/paperclip-agent-shim"])
	}
}

func TestWriteIsReproducible(t *testing.T) {
	img := Image{
		Tag:        "kubeclip.local/pause:dev",
		Entrypoint: []string{"/pause"},
		Files:      []File{{Src: writeFile(t, "pause", "pause"), Dst: "/pause"}},
	}
	var a, b bytes.Buffer
	if err := Write(&a, img); err != nil {
		t.Fatal(err)
	}
	if err := Write(&b, img); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two builds of the same image differ")
	}
}

func TestRunRejectsBadArguments(t *testing.T) {
	file := writeFile(t, "f", "x")
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"no out", []string{"--tag", "a:b", "--entrypoint", "/f", file + ":/f"}, "--out is required"},
		{"no tag", []string{"--entrypoint", "/f", file + ":/f"}, "want name:tag"},
		{"tag without version", []string{"--tag", "a", "--entrypoint", "/f", file + ":/f"}, "want name:tag"},
		{"relative entrypoint", []string{"--tag", "a:b", "--entrypoint", "f", file + ":/f"}, "absolute path"},
		{"no files", []string{"--tag", "a:b", "--entrypoint", "/f"}, "no files"},
		{"relative destination", []string{"--tag", "a:b", "--entrypoint", "/f", file + ":f"}, "clean absolute"},
		{"missing destination", []string{"--tag", "a:b", "--entrypoint", "/f", file}, "want src:dst"},
		{"duplicate destination", []string{"--tag", "a:b", "--entrypoint", "/f", file + ":/f", file + ":/f"}, "given twice"},
		{"file over directory", []string{"--tag", "a:b", "--entrypoint", "/a/f", file + ":/a", file + ":/a/f"}, "parent directory"},
		{"missing source", []string{"--tag", "a:b", "--entrypoint", "/f", file + ".missing:/f"}, "no such file"},
		{"bad env", []string{"--tag", "a:b", "--entrypoint", "/f", "--env", "NOEQUALS", file + ":/f"}, "want K=V"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			args := tc.args
			if tc.name != "no out" {
				args = append([]string{"--out", filepath.Join(dir, "img.tar")}, args...)
			}
			err := run(args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("run error = %v, want one containing %q", err, tc.wantErr)
			}
			// A failed build leaves nothing behind, not even its temporary file.
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("files left after a failed build: %v", entries)
			}
		})
	}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestDirsGetTheirOwner(t *testing.T) {
	bin := writeFile(t, "nats-server", "#!nats")
	out := filepath.Join(t.TempDir(), "img.tar")
	err := run([]string{
		"--tag", "kubeclip.local/nats:dev", "--out", out, "--entrypoint", "/usr/local/bin/nats-server",
		"--user", "65532:65532", "--dir", "/data:65532:65532:0700", "--dir", "/var/run/nats:65532:65532:0755",
		bin + ":/usr/local/bin/nats-server",
	}, io.Discard)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, outer := readTar(t, f)
	var manifest []manifestEntry
	if err := json.Unmarshal(outer["manifest.json"], &manifest); err != nil {
		t.Fatal(err)
	}
	hdrs, _ := readTar(t, bytes.NewReader(outer[manifest[0].Layers[0]]))
	type entry struct {
		Name     string
		Mode     int64
		UID, GID int
	}
	var got []entry
	for _, h := range hdrs {
		if h.Typeflag == tar.TypeDir {
			got = append(got, entry{h.Name, h.Mode, h.Uid, h.Gid})
		}
	}
	want := []entry{
		{"data/", 0o700, 65532, 65532},
		{"usr/", 0o755, 0, 0},
		{"usr/local/", 0o755, 0, 0},
		{"usr/local/bin/", 0o755, 0, 0},
		{"var/", 0o755, 0, 0},
		{"var/run/", 0o755, 0, 0},
		{"var/run/nats/", 0o755, 65532, 65532},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("directories (-want +got):\n%s", diff)
	}
	for _, bad := range []string{"data:1:1:0700", "/data:x:1:0700", "/data:1:1:9", "/data:1:1"} {
		if err := run([]string{"--tag", "a:b", "--out", out, "--entrypoint", "/x", "--dir", bad, bin + ":/x"}, io.Discard); err == nil {
			t.Errorf("--dir %q accepted", bad)
		}
	}
}

// layerOf runs mkimage with args and returns the headers and contents of the image's one layer.
func layerOf(t *testing.T, args ...string) ([]*tar.Header, map[string][]byte) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "img.tar")
	if err := run(append([]string{"--tag", "kubeclip.local/sandbox:dev", "--out", out}, args...), io.Discard); err != nil {
		t.Fatalf("run: %v", err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	_, outer := readTar(t, f)
	var manifest []manifestEntry
	if err := json.Unmarshal(outer["manifest.json"], &manifest); err != nil {
		t.Fatalf("manifest.json: %v", err)
	}
	layer := outer[manifest[0].Layers[0]]
	if got, want := manifest[0].Layers[0], sha256Hex(layer)+"/layer.tar"; got != want {
		t.Errorf("layer stored as %s, want %s", got, want)
	}
	return readTar(t, bytes.NewReader(layer))
}

// mkTree creates a small Debian-like rootfs under dir, with mtimes and owners a build must not
// carry into the layer.
func mkTree(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []struct {
		path string
		mode os.FileMode
	}{
		{"bin", 0o755}, {"usr/bin", 0o755}, {"usr/lib/x86_64-linux-gnu", 0o755}, {"lib64", 0o755},
		{"tmp", 0o777 | os.ModeSticky}, {"etc", 0o755}, {"var/private", 0o700},
	} {
		if err := os.MkdirAll(filepath.Join(dir, d.path), 0o755); err != nil {
			t.Fatal(err)
		}
		// MkdirAll applies the umask and drops the sticky bit; set the mode explicitly.
		if err := os.Chmod(filepath.Join(dir, d.path), d.mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []struct {
		path, content string
		mode          os.FileMode
	}{
		{"bin/dash", "dash binary", 0o755},
		{"usr/bin/base64", "base64 binary", 0o755},
		{"usr/lib/x86_64-linux-gnu/libc.so.6", "libc", 0o644},
		{"etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644},
		{"var/private/secret", "s", 0o600},
		{"usr/bin/su", "setuid binary", 0o755 | os.ModeSetuid},
	} {
		p := filepath.Join(dir, f.path)
		if err := os.WriteFile(p, []byte(f.content), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, f.mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, l := range []struct{ target, path string }{
		{"dash", "bin/sh"}, // relative, in the same directory
		{"/usr/lib/x86_64-linux-gnu/libc.so.6", "lib64/libc"}, // absolute: resolved inside the container
		{"../nowhere", "usr/bin/dangling"},                    // dangling links are kept as they are
	} {
		if err := os.Symlink(l.target, filepath.Join(dir, l.path)); err != nil {
			t.Fatal(err)
		}
	}
	// gzip ships gunzip and uncompress as hard links of one file.
	if err := os.Link(filepath.Join(dir, "usr/bin/base64"), filepath.Join(dir, "usr/bin/base32")); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		if err := os.Lchown(filepath.Join(dir, "bin/sh"), 1234, 1234); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(filepath.Join(dir, "etc/passwd"), 1234, 1234); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRootfsAddsTheTree(t *testing.T) {
	root := t.TempDir()
	mkTree(t, root)
	stub := writeFile(t, "claude", "#!claude")
	hdrs, files := layerOf(t, "--entrypoint", "/bin/sh", "--rootfs", root,
		"--dir", "/var/private:0:0:0750", "--dir", "/workspace:1000:1000:0755", stub+":/usr/local/bin/claude")

	type entry struct {
		Name     string
		Type     byte
		Mode     int64
		UID, GID int
		Link     string
		ModTime  int64
	}
	var got []entry
	for _, h := range hdrs {
		got = append(got, entry{h.Name, h.Typeflag, h.Mode, h.Uid, h.Gid, h.Linkname, h.ModTime.Unix()})
	}
	// Directories first, then everything else, each sorted; all root-owned at the epoch except
	// --dir's; the modes of the tree, setuid and sticky included; links as they are.
	want := []entry{
		{"bin/", tar.TypeDir, 0o755, 0, 0, "", 0},
		{"etc/", tar.TypeDir, 0o755, 0, 0, "", 0},
		{"lib64/", tar.TypeDir, 0o755, 0, 0, "", 0},
		{"tmp/", tar.TypeDir, 0o1777, 0, 0, "", 0},
		{"usr/", tar.TypeDir, 0o755, 0, 0, "", 0},
		{"usr/bin/", tar.TypeDir, 0o755, 0, 0, "", 0},
		{"usr/lib/", tar.TypeDir, 0o755, 0, 0, "", 0},
		{"usr/lib/x86_64-linux-gnu/", tar.TypeDir, 0o755, 0, 0, "", 0},
		{"usr/local/", tar.TypeDir, 0o755, 0, 0, "", 0},
		{"usr/local/bin/", tar.TypeDir, 0o755, 0, 0, "", 0},
		{"var/", tar.TypeDir, 0o755, 0, 0, "", 0},
		{"var/private/", tar.TypeDir, 0o750, 0, 0, "", 0}, // --dir overrides the tree's mode
		{"workspace/", tar.TypeDir, 0o755, 1000, 1000, "", 0},
		{"bin/dash", tar.TypeReg, 0o755, 0, 0, "", 0},
		{"bin/sh", tar.TypeSymlink, 0o777, 0, 0, "dash", 0},
		{"etc/passwd", tar.TypeReg, 0o644, 0, 0, "", 0},
		{"lib64/libc", tar.TypeSymlink, 0o777, 0, 0, "/usr/lib/x86_64-linux-gnu/libc.so.6", 0},
		{"usr/bin/base32", tar.TypeReg, 0o755, 0, 0, "", 0},
		{"usr/bin/base64", tar.TypeLink, 0o755, 0, 0, "usr/bin/base32", 0},
		{"usr/bin/dangling", tar.TypeSymlink, 0o777, 0, 0, "../nowhere", 0},
		{"usr/bin/su", tar.TypeReg, 0o4755, 0, 0, "", 0},
		{"usr/lib/x86_64-linux-gnu/libc.so.6", tar.TypeReg, 0o644, 0, 0, "", 0},
		{"usr/local/bin/claude", tar.TypeReg, 0o755, 0, 0, "", 0},
		{"var/private/secret", tar.TypeReg, 0o600, 0, 0, "", 0},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("layer entries (-want +got):\n%s", diff)
	}
	for name, content := range map[string]string{
		"bin/dash":             "dash binary",
		"usr/bin/base32":       "base64 binary",
		"usr/bin/base64":       "", // a hard link carries no data
		"usr/local/bin/claude": "#!claude",
	} {
		if got := string(files[name]); got != content {
			t.Errorf("%s holds %q, want %q", name, got, content)
		}
	}
}

func TestRootfsIsReproducible(t *testing.T) {
	// Two copies of one tree, made at different times: the same image, byte for byte.
	a, b := t.TempDir(), t.TempDir()
	mkTree(t, a)
	old := time.Now().Add(-48 * time.Hour)
	if err := os.Chtimes(filepath.Join(a, "bin/dash"), old, old); err != nil {
		t.Fatal(err)
	}
	mkTree(t, b)
	build := func(root string) []byte {
		t.Helper()
		out := filepath.Join(t.TempDir(), "img.tar")
		if err := run([]string{"--tag", "kubeclip.local/sandbox:dev", "--out", out, "--entrypoint", "/bin/sh", "--rootfs", root}, io.Discard); err != nil {
			t.Fatalf("run: %v", err)
		}
		data, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	if !bytes.Equal(build(a), build(b)) {
		t.Error("two builds of the same tree differ")
	}
}

func TestRootfsRejectsConflicts(t *testing.T) {
	file := writeFile(t, "f", "x")
	fifoTree := t.TempDir()
	if err := syscall.Mkfifo(filepath.Join(fifoTree, "pipe"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		args    func(root string) []string
		wantErr string
	}{
		{"file over a tree's file", func(root string) []string { return []string{"--rootfs", root, file + ":/bin/dash"} }, "given twice"},
		{"file over a tree's directory", func(root string) []string { return []string{"--rootfs", root, file + ":/usr/bin"} }, "parent directory"},
		{"file under a tree's symlink", func(root string) []string { return []string{"--rootfs", root, file + ":/bin/sh/x"} }, "parent directory"},
		{"dir over a tree's file", func(root string) []string { return []string{"--rootfs", root, "--dir", "/etc/passwd:0:0:0755"} }, "is a file"},
		{"two trees with one file", func(root string) []string { return []string{"--rootfs", root, "--rootfs", root} }, "given twice"},
		{"fifo", func(string) []string { return []string{"--rootfs", fifoTree} }, "want a directory, regular file or symlink"},
		{"not a directory", func(string) []string { return []string{"--rootfs", file} }, "not a directory"},
		{"missing", func(root string) []string { return []string{"--rootfs", root + "/missing"} }, "no such file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			mkTree(t, root)
			dir := t.TempDir()
			args := append([]string{"--tag", "a:b", "--out", filepath.Join(dir, "img.tar"), "--entrypoint", "/bin/sh"}, tc.args(root)...)
			err := run(args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("run error = %v, want one containing %q", err, tc.wantErr)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 0 {
				t.Errorf("files left after a failed build: %v", entries)
			}
		})
	}
}
