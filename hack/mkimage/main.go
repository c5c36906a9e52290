// Command mkimage writes a single-layer container image as a `docker save` tarball, with no Docker.
//
// The local test cluster cannot pull images, so its images (the pod sandbox "pause" image and the
// agent stub) are built from static Go binaries and imported into containerd with
// `ctr images import`. Usage:
//
//	mkimage --tag kubeclip.local/pause:dev --out pause.tar --entrypoint /pause [--user 65532] \
//	    [--env K=V]... [--dir /data:65532:65532:0700]... [--rootfs DIR]... ./bin/pause:/pause ...
//
// A src:dst file is owned by root with mode 0755. --rootfs adds the whole tree under DIR at the
// image's root (a Debian userland staged with dpkg-deb -x, say): directories, regular files with
// their permission bits, symlinks as they are and hard links as links; everything owned by root.
// Parent directories missing from both are added as root-owned 0755. The tarball is reproducible:
// entries are sorted and carry a fixed mtime, so the same inputs give the same image id and
// re-importing an unchanged image is a no-op for containerd.
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
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
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
	Dirs       []Dir    // empty directories with an owner, such as a non-root user's data dir
	Rootfs     []string // host directories whose trees are added at the image's root
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
	var env, dirs, rootfs stringList
	fs.StringVar(&img.Tag, "tag", "", "image reference `name:tag` (required)")
	fs.StringVar(&out, "out", "", "tarball to write (required)")
	fs.StringVar(&entrypoint, "entrypoint", "", "absolute `path` of the entrypoint inside the image (required)")
	fs.StringVar(&img.User, "user", "", "numeric `uid[:gid]` the image runs as (default root)")
	fs.Var(&env, "env", "environment variable `K=V` (repeatable)")
	fs.Var(&dirs, "dir", "empty directory `/path:uid:gid:mode` (octal mode, repeatable)")
	fs.Var(&rootfs, "rootfs", "add the whole tree under host directory `DIR` at the image's root (repeatable)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: mkimage --tag name:tag --out file.tar --entrypoint /path [--user uid] [--env K=V]... [--rootfs DIR]... src:dst ...")
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
	img.Rootfs = rootfs
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
	if len(img.Files) == 0 && len(img.Rootfs) == 0 {
		return errors.New("no files given (want src:dst arguments or --rootfs)")
	}
	for _, root := range img.Rootfs {
		if info, err := os.Stat(root); err != nil {
			return fmt.Errorf("--rootfs: %w", err)
		} else if !info.IsDir() {
			return fmt.Errorf("--rootfs %s: not a directory", root)
		}
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
// after its digest, and one layer tar. The layer goes to a temporary file first: the config
// names its digest and comes before it, and a rootfs may be too large to hold in memory.
func Write(w io.Writer, img Image) (err error) {
	if err := img.validate(); err != nil {
		return err
	}
	layer, err := os.CreateTemp("", "mkimage-layer-*.tar")
	if err != nil {
		return fmt.Errorf("creating the layer: %w", err)
	}
	defer func() {
		_ = layer.Close()
		if rmErr := os.Remove(layer.Name()); rmErr != nil && err == nil {
			err = fmt.Errorf("removing the layer: %w", rmErr)
		}
	}()
	sum := sha256.New()
	if err := writeLayer(io.MultiWriter(layer, sum), img); err != nil {
		return err
	}
	layerSize, err := layer.Seek(0, io.SeekCurrent)
	if err != nil {
		return fmt.Errorf("sizing the layer: %w", err)
	}
	if _, err := layer.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("rewinding the layer: %w", err)
	}
	layerID := hex.EncodeToString(sum.Sum(nil))

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
		size int64
		data io.Reader
	}{
		{configName, int64(len(config)), bytes.NewReader(config)},
		{layerName, layerSize, layer},
		{"manifest.json", int64(len(manifest)), bytes.NewReader(manifest)},
	} {
		if dir := path.Dir(e.name); dir != "." {
			if err := tw.WriteHeader(dirHeader(dir + "/")); err != nil {
				return fmt.Errorf("writing %s: %w", dir, err)
			}
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: e.name, Mode: 0o644, Size: e.size, ModTime: epoch}
		if err := tw.WriteHeader(hdr); err != nil {
			return fmt.Errorf("writing %s: %w", e.name, err)
		}
		if _, err := io.CopyN(tw, e.data, e.size); err != nil {
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

// layerEntry is one entry of the layer: its header, and for a regular file the host file that
// holds its content.
type layerEntry struct {
	hdr *tar.Header
	src string
	ino fileID // for hard links between files of a rootfs; zero otherwise
}

// fileID identifies a host file, so that hard links in a rootfs stay links in the layer.
type fileID struct{ dev, ino uint64 }

// layerEntries collects what goes into the layer by absolute path: the rootfs trees, then the
// files, the owned directories and every missing parent directory.
func layerEntries(img Image) (map[string]*layerEntry, error) {
	entries := map[string]*layerEntry{}
	for _, root := range img.Rootfs {
		if err := addTree(entries, root); err != nil {
			return nil, err
		}
	}
	for _, f := range img.Files {
		if e, ok := entries[f.Dst]; ok {
			if e.hdr.Typeflag == tar.TypeDir {
				return nil, fmt.Errorf("destination %s is also the parent directory of another file", f.Dst)
			}
			return nil, fmt.Errorf("destination %q given twice (as a file and in --rootfs)", f.Dst)
		}
		entries[f.Dst] = &layerEntry{
			hdr: &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(f.Dst, "/"), Mode: 0o755, ModTime: epoch},
			src: f.Src,
		}
	}
	for _, o := range img.Dirs {
		e, ok := entries[o.Path]
		if ok && e.hdr.Typeflag != tar.TypeDir {
			return nil, fmt.Errorf("--dir %s: the path is a file", o.Path)
		}
		if !ok {
			e = &layerEntry{hdr: dirHeader(strings.TrimPrefix(o.Path, "/") + "/")}
			entries[o.Path] = e
		}
		e.hdr.Uid, e.hdr.Gid, e.hdr.Mode = o.UID, o.GID, o.Mode
	}
	for p := range entries {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			e, ok := entries[d]
			if !ok {
				entries[d] = &layerEntry{hdr: dirHeader(strings.TrimPrefix(d, "/") + "/")}
				continue
			}
			if e.hdr.Typeflag != tar.TypeDir {
				return nil, fmt.Errorf("destination %s is also the parent directory of another file", d)
			}
		}
	}
	return entries, nil
}

// addTree adds the tree under root to entries, at the image's root.
func addTree(entries map[string]*layerEntry, root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("--rootfs %s: %w", root, err)
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return fmt.Errorf("--rootfs %s: %w", root, err)
		}
		if rel == "." {
			return nil // the image's root directory is the runtime's
		}
		dst := "/" + filepath.ToSlash(rel)
		info, err := d.Info()
		if err != nil {
			return fmt.Errorf("--rootfs %s: %w", root, err)
		}
		e := &layerEntry{hdr: &tar.Header{Name: strings.TrimPrefix(dst, "/"), Mode: tarMode(info.Mode()), ModTime: epoch}}
		switch {
		case info.IsDir():
			e.hdr.Typeflag = tar.TypeDir
			e.hdr.Name += "/"
		case info.Mode().IsRegular():
			e.hdr.Typeflag = tar.TypeReg
			e.src = p
			if st, ok := info.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
				e.ino = fileID{dev: uint64(st.Dev), ino: st.Ino}
			}
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return fmt.Errorf("--rootfs %s: %w", root, err)
			}
			e.hdr.Typeflag = tar.TypeSymlink
			e.hdr.Linkname = target
			e.hdr.Mode = 0o777
		default:
			return fmt.Errorf("--rootfs %s: %s is a %s, want a directory, regular file or symlink", root, rel, info.Mode().Type())
		}
		if prev, ok := entries[dst]; ok {
			if prev.hdr.Typeflag == tar.TypeDir && e.hdr.Typeflag == tar.TypeDir {
				return nil // two trees share a directory: the first one's mode stands
			}
			return fmt.Errorf("--rootfs %s: %s given twice", root, dst)
		}
		entries[dst] = e
		return nil
	})
}

// tarMode is the permission bits of m, with setuid, setgid and sticky in their tar places.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// writeLayer writes an uncompressed layer tar of img to w: every directory first, then every
// other entry, each group sorted by path, so that a directory comes before what it contains and
// the first path of a set of hard links holds the content the others link to.
func writeLayer(w io.Writer, img Image) error {
	entries, err := layerEntries(img)
	if err != nil {
		return err
	}
	var dirs, others []string
	for p, e := range entries {
		if e.hdr.Typeflag == tar.TypeDir {
			dirs = append(dirs, p)
		} else {
			others = append(others, p)
		}
	}
	sort.Strings(dirs)
	sort.Strings(others)

	tw := tar.NewWriter(w)
	for _, p := range dirs {
		if err := tw.WriteHeader(entries[p].hdr); err != nil {
			return fmt.Errorf("writing layer directory %s: %w", p, err)
		}
	}
	linked := map[fileID]string{} // first path written of each hard-linked file
	for _, p := range others {
		e := entries[p]
		if e.ino != (fileID{}) {
			if target, ok := linked[e.ino]; ok {
				hdr := *e.hdr
				hdr.Typeflag, hdr.Linkname = tar.TypeLink, target
				if err := tw.WriteHeader(&hdr); err != nil {
					return fmt.Errorf("writing layer link %s: %w", p, err)
				}
				continue
			}
			linked[e.ino] = e.hdr.Name
		}
		if err := writeEntry(tw, e); err != nil {
			return fmt.Errorf("writing layer file %s: %w", p, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("closing layer: %w", err)
	}
	return nil
}

// writeEntry writes e's header and, for a regular file, the content of its source.
func writeEntry(tw *tar.Writer, e *layerEntry) error {
	if e.hdr.Typeflag != tar.TypeReg {
		return tw.WriteHeader(e.hdr)
	}
	f, err := os.Open(e.src)
	if err != nil {
		return fmt.Errorf("reading %s: %w", e.src, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return fmt.Errorf("reading %s: %w", e.src, err)
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("reading %s: not a regular file", e.src)
	}
	hdr := *e.hdr
	hdr.Size = info.Size()
	if err := tw.WriteHeader(&hdr); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
		return fmt.Errorf("reading %s: %w", e.src, err)
	}
	return nil
}

// dirHeader is a root-owned 0755 directory entry (Uid, Gid and names are zero values: root).
func dirHeader(name string) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: epoch}
}
