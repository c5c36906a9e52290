// Command mkimage writes a single-layer container image as a `docker save` tarball, with no Docker.
//
// The local test cluster cannot pull images, so its images (the pod sandbox "pause" image and the
// agent stub) are built from static Go binaries and imported into containerd with
// `ctr images import`. Usage:
//
//	mkimage --tag kubeclip.local/pause:dev --out pause.tar --entrypoint /pause [--user 65532] \
//	    [--env K=V]... [--dir /data:65532:65532:0700]... ./bin/pause:/pause ...
//
// Every file is owned by root with mode 0755; its parent directories are added to the layer. The
// tarball is reproducible: the same inputs give the same image id, so re-importing an unchanged
// image is a no-op for containerd.
package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(2)
	}
}

// defaultPath is the PATH a `FROM scratch` image gets from Docker; kept so tools that look up
// commands in the container behave as they would with a Docker-built image.
const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// epoch is the modification time of every layer entry, fixed so that builds are reproducible.
var epoch = time.Unix(0, 0).UTC()

// Image describes what goes into the tarball.
type Image struct {
	Tag        string   // repository:tag, e.g. kubeclip.local/pause:dev
	Entrypoint []string // absolute path of the command inside the image, then its arguments
	User       string   // numeric uid[:gid], empty for root
	Env        []string // K=V; PATH is added when missing
	Files      []File
	Dirs       []Dir // empty directories with an owner, such as a non-root user's data dir
}

// Dir is an empty directory in the image owned by UID:GID with Mode. A volume mounted there
// starts with that owner (Docker copies it into a new named volume).
type Dir struct {
	Path     string
	UID, GID int
	Mode     int64
}

// File is one host file copied into the image.
type File struct {
	Src string // host path
	Dst string // absolute path in the image
}

type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func run(args []string, stderr io.Writer) error {
	fs := flag.NewFlagSet("mkimage", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var img Image
	var out, entrypoint string
	var env, dirs stringList
	fs.StringVar(&img.Tag, "tag", "", "image reference `name:tag` (required)")
	fs.StringVar(&out, "out", "", "tarball to write (required)")
	fs.StringVar(&entrypoint, "entrypoint", "", "absolute `path` of the entrypoint inside the image (required)")
	fs.StringVar(&img.User, "user", "", "numeric `uid[:gid]` the image runs as (default root)")
	fs.Var(&env, "env", "environment variable `K=V` (repeatable)")
	fs.Var(&dirs, "dir", "empty directory `/path:uid:gid:mode` (octal mode, repeatable)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: mkimage --tag name:tag --out file.tar --entrypoint /path [--user uid] [--env K=V]... src:dst ...")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if out == "" {
		return errors.New("--out is required")
	}
	if entrypoint != "" {
		img.Entrypoint = []string{entrypoint}
	}
	img.Env = env
	for _, d := range dirs {
		dir, err := parseDir(d)
		if err != nil {
			return err
		}
		img.Dirs = append(img.Dirs, dir)
	}
	for _, a := range fs.Args() {
		src, dst, ok := strings.Cut(a, ":")
		if !ok || src == "" || dst == "" {
			return fmt.Errorf("file argument %q: want src:dst", a)
		}
		img.Files = append(img.Files, File{Src: src, Dst: dst})
	}
	return writeAtomically(out, func(w io.Writer) error { return Write(w, img) })
}

// parseDir parses /path:uid:gid:mode.
func parseDir(s string) (Dir, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 4 || !path.IsAbs(parts[0]) || path.Clean(parts[0]) != parts[0] || parts[0] == "/" {
		return Dir{}, fmt.Errorf("--dir %q: want /path:uid:gid:mode", s)
	}
	d := Dir{Path: parts[0]}
	var err1, err2, err3 error
	d.UID, err1 = strconv.Atoi(parts[1])
	d.GID, err2 = strconv.Atoi(parts[2])
	d.Mode, err3 = strconv.ParseInt(parts[3], 8, 32)
	if err := errors.Join(err1, err2, err3); err != nil || d.UID < 0 || d.GID < 0 {
		return Dir{}, fmt.Errorf("--dir %q: want numeric uid, gid and an octal mode", s)
	}
	return d, nil
}

// writeAtomically writes to a temporary file beside path and renames it into place, so a reader
// never sees a half-written tarball.
func writeAtomically(path string, write func(io.Writer) error) (err error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return fmt.Errorf("creating %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	if err := write(f); err != nil {
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// validate checks the description before anything is written.
func (img Image) validate() error {
	name, tag, ok := strings.Cut(img.Tag, ":")
	if img.Tag == "" || !ok || name == "" || tag == "" || strings.Contains(tag, "/") {
		return fmt.Errorf("--tag %q: want name:tag", img.Tag)
	}
	if len(img.Entrypoint) == 0 || !path.IsAbs(img.Entrypoint[0]) {
		return errors.New("--entrypoint must be an absolute path inside the image")
	}
	if len(img.Files) == 0 {
		return errors.New("no files given (want src:dst arguments)")
	}
	seen := map[string]bool{}
	for _, f := range img.Files {
		if !path.IsAbs(f.Dst) || path.Clean(f.Dst) != f.Dst || f.Dst == "/" {
			return fmt.Errorf("destination %q: want a clean absolute file path", f.Dst)
		}
		if seen[f.Dst] {
			return fmt.Errorf("destination %q given twice", f.Dst)
		}
		seen[f.Dst] = true
	}
	for _, e := range img.Env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("--env %q: want K=V", e)
		}
	}
	return nil
}

// Write writes img to w in the format of `docker save`: manifest.json, the image config named
// after its digest, and one layer tar.
func Write(w io.Writer, img Image) error {
	if err := img.validate(); err != nil {
		return err
	}
	layer, err := buildLayer(img.Files, img.Dirs)
	if err != nil {
		return err
	}
	layerSum := sha256.Sum256(layer)
	layerID := hex.EncodeToString(layerSum[:])

	config, err := json.Marshal(imageConfig(img, "sha256:"+layerID))
	if err != nil {
		return fmt.Errorf("encoding image config: %w", err)
	}
	configSum := sha256.Sum256(config)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	layerName := layerID + "/layer.tar"

	manifest, err := json.Marshal([]manifestEntry{{
		Config:   configName,
		RepoTags: []string{img.Tag},
		Layers:   []string{layerName},
	}})
	if err != nil {
		return fmt.Errorf("encoding manifest: %w", err)
	}

	tw := tar.NewWriter(w)
	for _, e := range []struct {
		name string
		data []byte
	}{
		{configName, config},
		{layerName, layer},
		{"manifest.json", manifest},
	} {
		if dir := path.Dir(e.name); dir != "." {
			if err := tw.WriteHeader(dirHeader(dir + "/")); err != nil {
				return fmt.Errorf("writing %s: %w", dir, err)
			}
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: epoch}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("writing %s: %w", e.name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return fmt.Errorf("writing %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("closing image tarball: %w", err)
	}
	return nil
}

type manifestEntry struct {
	Config   string   `json:"Config"`
	RepoTags []string `json:"RepoTags"`
	Layers   []string `json:"Layers"`
}

// configFile is the subset of the OCI/Docker image config that containerd and the kubelet read.
type configFile struct {
	Architecture string          `json:"architecture"`
	OS           string          `json:"os"`
	Created      time.Time       `json:"created"`
	Config       containerConfig `json:"config"`
	RootFS       rootFS          `json:"rootfs"`
	History      []history       `json:"history"`
}

type containerConfig struct {
	User       string   `json:"User,omitempty"`
	Env        []string `json:"Env"`
	Entrypoint []string `json:"Entrypoint"`
	WorkingDir string   `json:"WorkingDir"`
}

type rootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

type history struct {
	Created   time.Time `json:"created"`
	CreatedBy string    `json:"created_by"`
}

func imageConfig(img Image, diffID string) configFile {
	env := append([]string(nil), img.Env...)
	hasPath := false
	for _, e := range env {
		if strings.HasPrefix(e, "PATH=") {
			hasPath = true
		}
	}
	if !hasPath {
		env = append([]string{defaultPath}, env...)
	}
	return configFile{
		Architecture: runtime.GOARCH,
		OS:           "linux",
		Created:      epoch,
		Config:       containerConfig{User: img.User, Env: env, Entrypoint: img.Entrypoint, WorkingDir: "/"},
		RootFS:       rootFS{Type: "layers", DiffIDs: []string{diffID}},
		History:      []history{{Created: epoch, CreatedBy: "kubeclip hack/mkimage"}},
	}
}

// buildLayer returns an uncompressed layer tar holding files and every parent directory, sorted
// so that a directory always comes before what it contains.
func buildLayer(files []File, owned []Dir) ([]byte, error) {
	dirs := map[string]bool{}
	for _, f := range files {
		for d := path.Dir(f.Dst); d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	ownedBy := map[string]Dir{}
	for _, o := range owned {
		ownedBy[o.Path] = o
		for d := o.Path; d != "/"; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var entries []string
	for d := range dirs {
		entries = append(entries, d)
	}
	sort.Strings(entries)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range entries {
		hdr := dirHeader(strings.TrimPrefix(d, "/") + "/")
		if o, ok := ownedBy[d]; ok {
			hdr.Uid, hdr.Gid, hdr.Mode = o.UID, o.GID, o.Mode
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("writing layer directory %s: %w", d, err)
		}
	}
	sorted := append([]File(nil), files...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Dst < sorted[j].Dst })
	for _, f := range sorted {
		if dirs[f.Dst] {
			return nil, fmt.Errorf("destination %s is also the parent directory of another file", f.Dst)
		}
		data, err := os.ReadFile(f.Src)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", f.Src, err)
		}
		hdr := &tar.Header{
			Typeflag: tar.TypeReg,
			Name:     strings.TrimPrefix(f.Dst, "/"),
			Mode:     0o755,
			Size:     int64(len(data)),
			ModTime:  epoch,
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("writing layer file %s: %w", f.Dst, err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("writing layer file %s: %w", f.Dst, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("closing layer: %w", err)
	}
	return buf.Bytes(), nil
}

// dirHeader is a root-owned 0755 directory entry (Uid, Gid and names are zero values: root).
func dirHeader(name string) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: epoch}
}
