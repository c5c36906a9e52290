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
	"testing"

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
