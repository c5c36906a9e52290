package sandboxd

import (
	"archive/tar"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// UntarOptions configure Untar.
type UntarOptions struct {
	// Root is the directory entries are extracted under; created (0755) if missing.
	Root string
	// MaxBytes bounds the regular files' bytes (default DefaultSyncMaxBytes); MaxFiles the
	// entries (default DefaultSyncMaxFiles).
	MaxBytes int64
	MaxFiles int
	// Modes sets the permissions of entries by name (relative to Root, as CleanSyncName gives
	// it), over the archive's: Paperclip's per-file mode (0600 for secrets).
	Modes map[string]fs.FileMode
}

// Untar extracts the tar stream r (ustar, PAX or GNU) under opts.Root and returns what it
// extracted. It refuses, naming the entry, anything that would write outside the root or
// through a symlink: absolute names, ".." components, symlinks whose target leads out,
// hardlinks to names outside, device nodes and fifos, more than the bounds. Each file is
// written to a temporary name beside it and renamed into place, so a refusal leaves no
// partial file under a final name; entries extracted before it stay, as with tar.
//
// Every write goes through an os.Root: even a symlink the tenant's own processes swap in
// while Untar runs cannot take a write out of the root.
func Untar(r io.Reader, opts UntarOptions) (SyncStats, error) {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultSyncMaxBytes
	}
	if opts.MaxFiles <= 0 {
		opts.MaxFiles = DefaultSyncMaxFiles
	}
	if err := os.MkdirAll(opts.Root, 0o755); err != nil {
		return SyncStats{}, &SyncError{Op: "untar", Entry: opts.Root, Err: ioCause(err)}
	}
	root, err := os.OpenRoot(opts.Root)
	if err != nil {
		return SyncStats{}, &SyncError{Op: "untar", Entry: opts.Root, Err: ioCause(err)}
	}
	defer root.Close()
	x := &extractor{root: root, opts: opts, dirs: map[string]bool{".": true}}
	tr := tar.NewReader(&readErrs{r: r, err: &x.readErr})
	for n := 1; ; n++ {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return x.stats, x.fail(fmt.Sprintf("#%d", n), err)
		}
		if err := x.entry(tr, hdr); err != nil {
			return x.stats, err
		}
	}
	return x.stats, x.finishDirs()
}

// readErrs remembers a read error of the archive, so that a failed copy is told apart: the
// archive ended or broke (refused), or the disk failed (I/O).
type readErrs struct {
	r   io.Reader
	err *error
}

func (e *readErrs) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		*e.err = err
	}
	return n, err
}

type extractor struct {
	root    *os.Root
	opts    UntarOptions
	stats   SyncStats
	entries int
	dirs    map[string]bool // names checked or made as real directories
	dirMeta []dirMeta       // directory entries' modes and times, applied at the end
	readErr error
	buf     []byte // copyN's
}

type dirMeta struct {
	name  string
	mode  fs.FileMode
	mtime time.Time
}

func (x *extractor) refuse(entry string, err error) error {
	return &SyncError{Op: "untar", Entry: entry, Err: err, Refused: true}
}

func (x *extractor) ioFail(entry string, err error) error {
	return &SyncError{Op: "untar", Entry: entry, Err: ioCause(err)}
}

// fail classifies an error of the archive reader: a broken or truncated archive is refused.
func (x *extractor) fail(entry string, err error) error {
	if x.readErr != nil {
		return x.ioFail(entry, fmt.Errorf("reading the archive: %w", x.readErr))
	}
	return x.refuse(entry, err)
}

func (x *extractor) entry(tr *tar.Reader, hdr *tar.Header) error {
	if hdr.Typeflag == tar.TypeXGlobalHeader {
		return nil
	}
	name, err := CleanSyncName(hdr.Name)
	if err != nil {
		return x.refuse(hdr.Name, err)
	}
	if x.entries++; x.entries > x.opts.MaxFiles {
		return x.refuse(hdr.Name, fmt.Errorf("more than %d entries (--max-files)", x.opts.MaxFiles))
	}
	if name == "." {
		if hdr.Typeflag != tar.TypeDir {
			return x.refuse(hdr.Name, errors.New("the root itself as a non-directory"))
		}
		return nil
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeGNUSparse: // a sparse file's holes are read as zeros
		return x.file(tr, hdr, name)
	case tar.TypeDir:
		return x.dir(hdr, name)
	case tar.TypeSymlink:
		return x.symlink(hdr, name)
	case tar.TypeLink:
		return x.hardlink(hdr, name)
	case tar.TypeChar, tar.TypeBlock:
		return x.refuse(hdr.Name, errors.New("device node"))
	case tar.TypeFifo:
		return x.refuse(hdr.Name, errors.New("fifo"))
	default:
		return x.refuse(hdr.Name, fmt.Errorf("unsupported entry type %q", hdr.Typeflag))
	}
}

// parents makes sure every parent of name is a real directory, creating missing ones (0755):
// nothing is written through a symlink, even one leading inside the root.
func (x *extractor) parents(entry, name string) error {
	dir := path.Dir(name)
	if x.dirs[dir] {
		return nil
	}
	p := ""
	for part := range splitPath(dir) {
		p = path.Join(p, part)
		if x.dirs[p] {
			continue
		}
		fi, err := x.root.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := x.root.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return x.ioFail(entry, err)
			}
		case err != nil:
			return x.ioFail(entry, err)
		case fi.Mode()&fs.ModeSymlink != 0:
			return x.refuse(entry, fmt.Errorf("written through the symlink %q", p))
		case !fi.IsDir():
			return x.refuse(entry, fmt.Errorf("%q is not a directory", p))
		}
		x.dirs[p] = true
	}
	return nil
}

func splitPath(p string) func(func(string) bool) {
	return func(yield func(string) bool) {
		start := 0
		for i := 0; i <= len(p); i++ {
			if i == len(p) || p[i] == '/' {
				if !yield(p[start:i]) {
					return
				}
				start = i + 1
			}
		}
	}
}

// placeable checks that a non-directory may take name: its parents are real directories and
// no directory is there (a rename cannot replace one, and tar would not either).
func (x *extractor) placeable(entry, name string) error {
	if err := x.parents(entry, name); err != nil {
		return err
	}
	fi, err := x.root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return x.ioFail(entry, err)
	case fi.IsDir():
		return x.refuse(entry, errors.New("a directory exists under this name"))
	}
	return nil
}

// tempName is a fresh name beside name, for a file written and then renamed into place.
func tempName(name string) string {
	return path.Join(path.Dir(name), ".kubeclip-untar-"+rand.Text())
}

func (x *extractor) mode(name string, archived int64) fs.FileMode {
	if m, ok := x.opts.Modes[name]; ok {
		return m.Perm()
	}
	return fs.FileMode(archived).Perm()
}

func (x *extractor) file(tr *tar.Reader, hdr *tar.Header, name string) (err error) {
	if hdr.Size < 0 {
		return x.refuse(hdr.Name, errors.New("negative size"))
	}
	if hdr.Size > x.opts.MaxBytes-x.stats.Bytes {
		return x.refuse(hdr.Name, fmt.Errorf("more than %d bytes of files (--max-bytes)", x.opts.MaxBytes))
	}
	if err := x.placeable(hdr.Name, name); err != nil {
		return err
	}
	tmp := tempName(name)
	f, err := x.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return x.ioFail(hdr.Name, err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = x.root.Remove(tmp)
		}
	}()
	if _, err := copyN(f, tr, hdr.Size, &x.buf); err != nil {
		if x.readErr != nil || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return x.fail(hdr.Name, fmt.Errorf("the archive ended inside the file: %w", err))
		}
		return x.ioFail(hdr.Name, err)
	}
	// fchmod and futimes on the open file: no name to race on.
	if err := f.Chmod(x.mode(name, hdr.Mode)); err != nil {
		return x.ioFail(hdr.Name, err)
	}
	mtime := unix.NsecToTimeval(hdr.ModTime.UnixNano())
	if err := unix.Futimes(int(f.Fd()), []unix.Timeval{mtime, mtime}); err != nil {
		return x.ioFail(hdr.Name, err)
	}
	if err := f.Close(); err != nil {
		return x.ioFail(hdr.Name, err)
	}
	if err := x.root.Rename(tmp, name); err != nil {
		return x.ioFail(hdr.Name, err)
	}
	x.stats.Files++
	x.stats.Bytes += hdr.Size
	return nil
}

func (x *extractor) dir(hdr *tar.Header, name string) error {
	if err := x.parents(hdr.Name, name); err != nil {
		return err
	}
	fi, err := x.root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := x.root.Mkdir(name, 0o755); err != nil {
			return x.ioFail(hdr.Name, err)
		}
	case err != nil:
		return x.ioFail(hdr.Name, err)
	case fi.Mode()&fs.ModeSymlink != 0:
		return x.refuse(hdr.Name, errors.New("a symlink exists under this name"))
	case !fi.IsDir():
		return x.refuse(hdr.Name, errors.New("a file exists under this name"))
	}
	x.dirs[name] = true
	x.dirMeta = append(x.dirMeta, dirMeta{name: name, mode: x.mode(name, hdr.Mode), mtime: hdr.ModTime})
	return nil
}

// finishDirs applies the directory entries' modes and times, deepest first, once their
// contents are in (a 0555 directory could not be filled otherwise).
func (x *extractor) finishDirs() error {
	for _, d := range slices.Backward(x.dirMeta) {
		if err := x.root.Chmod(d.name, d.mode); err != nil {
			return x.ioFail(d.name, err)
		}
		if err := x.root.Chtimes(d.name, d.mtime, d.mtime); err != nil {
			return x.ioFail(d.name, err)
		}
	}
	return nil
}

func (x *extractor) symlink(hdr *tar.Header, name string) error {
	target := hdr.Linkname
	switch {
	case target == "":
		return x.refuse(hdr.Name, errors.New("symlink without a target"))
	case len(target) > maxSyncName:
		return x.refuse(hdr.Name, fmt.Errorf("symlink target longer than %d bytes", maxSyncName))
	case path.IsAbs(target):
		return x.refuse(hdr.Name, fmt.Errorf("symlink to an absolute path %w", errOutside))
	}
	if resolved := path.Join(path.Dir(name), target); resolved == ".." || len(resolved) > 2 && resolved[:3] == "../" {
		return x.refuse(hdr.Name, fmt.Errorf("symlink %w", errOutside))
	}
	if err := x.placeable(hdr.Name, name); err != nil {
		return err
	}
	tmp := tempName(name)
	if err := x.root.Symlink(target, tmp); err != nil {
		return x.ioFail(hdr.Name, err)
	}
	if err := x.root.Rename(tmp, name); err != nil {
		_ = x.root.Remove(tmp)
		return x.ioFail(hdr.Name, err)
	}
	x.stats.Files++
	return nil
}

func (x *extractor) hardlink(hdr *tar.Header, name string) error {
	target, err := CleanSyncName(hdr.Linkname)
	if err != nil {
		return x.refuse(hdr.Name, fmt.Errorf("hardlink target: %w", err))
	}
	fi, err := x.root.Lstat(target)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return x.refuse(hdr.Name, errors.New("hardlink to a missing file"))
	case err != nil:
		// Through a symlink leading out (os.Root refuses it) or unreadable.
		return x.refuse(hdr.Name, fmt.Errorf("hardlink target: %w", ioCause(err)))
	case !fi.Mode().IsRegular():
		return x.refuse(hdr.Name, errors.New("hardlink to something other than a regular file"))
	}
	if err := x.placeable(hdr.Name, name); err != nil {
		return err
	}
	tmp := tempName(name)
	if err := x.root.Link(target, tmp); err != nil {
		return x.ioFail(hdr.Name, err)
	}
	if err := x.root.Rename(tmp, name); err != nil {
		_ = x.root.Remove(tmp)
		return x.ioFail(hdr.Name, err)
	}
	x.stats.Files++
	return nil
}
