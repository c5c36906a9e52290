package sandboxd

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"
)

// TarOptions configure Tar.
type TarOptions struct {
	// Root is the directory Names are relative to; entries are named relative to it.
	Root string
	// Names are the files and directory trees to archive ("." is all of Root).
	Names []string
	// Excludes are tar --exclude globs (excluder says how they match).
	Excludes []string
	// FollowSymlinks archives what symlinks point to (tar -h); a link leading out of Root, or an
	// absolute one, is refused. Otherwise symlinks are archived as links, whatever they point to.
	FollowSymlinks bool
	// MaxBytes bounds the regular files' bytes (default DefaultSyncMaxBytes).
	MaxBytes int64
}

// Tar writes a POSIX tar of opts.Names to w (ustar headers, PAX extended headers where a name
// or a size needs them), in name order, and returns what it archived. Fifos, sockets and
// device nodes are skipped (Untar would refuse them); hardlinked files are archived as
// separate regular files. A refusal (a missing name, a link leading out, MaxBytes exceeded)
// or a failure ends the archive where it stopped, without its end marker: only a nil error
// (the subcommand's exit 0) says the archive is whole.
func Tar(w io.Writer, opts TarOptions) (SyncStats, error) {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultSyncMaxBytes
	}
	excl, err := newExcluder(opts.Excludes)
	if err != nil {
		return SyncStats{}, &SyncError{Op: "tar", Entry: opts.Root, Err: err, Refused: true}
	}
	root, err := os.OpenRoot(opts.Root)
	if err != nil {
		return SyncStats{}, &SyncError{Op: "tar", Entry: opts.Root, Err: ioCause(err)}
	}
	defer root.Close()
	a := &archiver{root: root, opts: opts, excl: excl, tw: tar.NewWriter(w)}
	for _, n := range opts.Names {
		name, err := CleanSyncName(n)
		if err != nil {
			return a.stats, a.refuse(n, err)
		}
		if err := a.walk(name, nil); err != nil {
			return a.stats, err
		}
	}
	if err := a.tw.Close(); err != nil {
		return a.stats, &SyncError{Op: "tar", Entry: "", Err: err}
	}
	return a.stats, nil
}

type archiver struct {
	root  *os.Root
	opts  TarOptions
	excl  excluder
	tw    *tar.Writer
	stats SyncStats
	buf   []byte // copyN's
}

func (a *archiver) refuse(entry string, err error) error {
	return &SyncError{Op: "tar", Entry: entry, Err: err, Refused: true}
}

func (a *archiver) ioFail(entry string, err error) error {
	return &SyncError{Op: "tar", Entry: entry, Err: ioCause(err)}
}

// fileID identifies a directory on the walk's current path, to refuse a symlink loop when
// following links.
type fileID struct{ dev, ino uint64 }

func idOf(fi fs.FileInfo) fileID {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return fileID{dev: uint64(st.Dev), ino: st.Ino}
	}
	return fileID{}
}

// walk archives name (relative to the root) and, for a directory, everything under it.
// ancestors are the directories being walked above it.
func (a *archiver) walk(name string, ancestors []fileID) error {
	if name != "." && a.excl.excluded(name) {
		return nil
	}
	fi, err := a.root.Lstat(name)
	if errors.Is(err, fs.ErrNotExist) && len(ancestors) == 0 {
		return a.refuse(name, errors.New("no such file or directory"))
	}
	if errors.Is(err, fs.ErrNotExist) {
		return nil // removed while the tree was walked
	}
	if err != nil {
		return a.ioFail(name, err)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		if !a.opts.FollowSymlinks {
			target, err := a.root.Readlink(name)
			if err != nil {
				return a.ioFail(name, err)
			}
			a.stats.Files++
			return a.header(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: fi.ModTime()})
		}
		// os.Root follows links that stay inside the root and refuses the others.
		if fi, err = a.root.Stat(name); err != nil {
			return a.refuse(name, fmt.Errorf("symlink %w or dangles: %w", errOutside, ioCause(err)))
		}
	}
	switch {
	case fi.Mode().IsRegular():
		return a.file(name, fi)
	case fi.IsDir():
		return a.dir(name, fi, ancestors)
	default:
		return nil // fifo, socket, device: not archived
	}
}

func (a *archiver) header(h *tar.Header) error {
	h.ModTime = h.ModTime.Truncate(time.Second) // no PAX record per file for sub-second times
	if err := a.tw.WriteHeader(h); err != nil {
		return &SyncError{Op: "tar", Entry: h.Name, Err: err}
	}
	return nil
}

func (a *archiver) file(name string, fi fs.FileInfo) error {
	size := fi.Size()
	if size > a.opts.MaxBytes-a.stats.Bytes {
		return a.refuse(name, fmt.Errorf("more than %d bytes of files (--max-bytes)", a.opts.MaxBytes))
	}
	f, err := a.root.Open(name)
	if err != nil {
		return a.ioFail(name, err)
	}
	defer f.Close()
	if err := a.header(&tar.Header{Typeflag: tar.TypeReg, Name: name, Size: size, Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime()}); err != nil {
		return err
	}
	if _, err := copyN(a.tw, f, size, &a.buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = errors.New("the file shrank while it was read")
		}
		return a.ioFail(name, err)
	}
	a.stats.Files++
	a.stats.Bytes += size
	return nil
}

func (a *archiver) dir(name string, fi fs.FileInfo, ancestors []fileID) error {
	id := idOf(fi)
	if slices.Contains(ancestors, id) {
		return a.refuse(name, errors.New("symlink loop"))
	}
	if name != "." {
		if err := a.header(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: int64(fi.Mode().Perm()), ModTime: fi.ModTime()}); err != nil {
			return err
		}
	}
	d, err := a.root.Open(name)
	if err != nil {
		return a.ioFail(name, err)
	}
	entries, err := d.ReadDir(-1)
	_ = d.Close()
	if err != nil {
		return a.ioFail(name, err)
	}
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	ancestors = append(ancestors, id)
	for _, e := range entries {
		if err := a.walk(path.Join(name, e.Name()), ancestors); err != nil {
			return err
		}
	}
	return nil
}
