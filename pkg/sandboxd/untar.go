package sandboxd

import (
	"archive/tar"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
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

// Bounds of an archive's headers, the plugin's too (plugins/paperclip/src/tar.ts): archive/tar
// holds one PAX header (at most 1 MiB) at a time, but reads any number of them before an entry.
const (
	// maxPaxRecords bounds the records of one PAX header, local or global.
	maxPaxRecords = 256
	// maxEntryMeta bounds the header bytes before one entry, blocks counted: its PAX header,
	// global PAX headers, GNU long names and links. One PAX header of archive/tar's 1 MiB fits;
	// a flood of headers is refused as it is read (archiveReader), not parsed to its end.
	maxEntryMeta = 2 << 20
	// maxLinkHops bounds the links followed resolving one symlink (Linux's own limit).
	maxLinkHops = 40
	blockSize   = 512
)

// errMetaBound: the headers before one entry passed maxEntryMeta.
var errMetaBound = fmt.Errorf("headers before one entry pass %d bytes (PAX, global PAX and GNU long-name headers): refused", maxEntryMeta)

// Untar extracts the tar stream r (ustar, PAX or GNU) under opts.Root and returns what it
// extracted. It refuses, naming the entry, anything that would write outside the root or
// through a symlink: absolute names, ".." components, a symlink whose resolution leaves the
// root at any step (resolveLink, checked again once the archive is in: a refused link is
// removed), hardlinks, sparse files, device nodes and fifos, directories or links that carry
// data, more than the bounds, a flood of headers before one entry (maxEntryMeta), a PAX header
// of more than maxPaxRecords records, a header with no entry after it. Each file is written to
// a temporary name beside it and renamed into place, so a refusal leaves no partial file under
// a final name; entries extracted before it stay, as with tar.
//
// The plugin's extractor follows the same rules: testdata/archives at the repository's root
// holds the archives both are tested with, and the outcome each must give.
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
	x := &extractor{root: root, opts: opts, dirs: map[string]bool{".": true}, named: map[string]bool{}}
	err = x.extractAll(r)
	// The links made are judged whatever ended the archive: a refusal after a chain of links
	// leaves none that leads out.
	if linkErr := x.checkLinks(); err == nil {
		err = linkErr
	}
	if err != nil {
		return x.stats, err
	}
	return x.stats, x.finishDirs()
}

// extractAll extracts every entry of r, holding archive/tar to the header bounds.
func (x *extractor) extractAll(r io.Reader) error {
	ar := &archiveReader{r: r, err: &x.readErr}
	tr := tar.NewReader(ar)
	// metaStart is where the headers of the next entry begin (after the last entry's data);
	// lastEnd where the last thing Next returned ends.
	var metaStart, lastEnd int64
	for n := 1; ; n++ {
		ar.limit = metaStart + maxEntryMeta + 2*blockSize
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			if ar.lastNonZero > lastEnd {
				return x.refuse(fmt.Sprintf("#%d", n), errors.New("a PAX or GNU long-name header with no entry after it"))
			}
			return nil
		}
		if err != nil {
			return x.fail(fmt.Sprintf("#%d", n), err)
		}
		ar.limit = math.MaxInt64
		if hdr.Typeflag == tar.TypeXGlobalHeader {
			lastEnd = roundBlock(ar.n)
			if lastEnd-metaStart > maxEntryMeta {
				return x.refuse(hdr.Name, errMetaBound)
			}
		} else {
			if ar.n-blockSize-metaStart > maxEntryMeta {
				return x.refuse(hdr.Name, errMetaBound)
			}
			if hdr.Typeflag == tar.TypeReg || hdr.Typeflag == tar.TypeCont { // archive/tar reads an old TypeRegA as TypeReg
				metaStart = ar.n + roundBlock(hdr.Size)
			} else {
				metaStart = ar.n
			}
			lastEnd = metaStart
		}
		if len(hdr.PAXRecords) > maxPaxRecords {
			return x.refuse(hdr.Name, fmt.Errorf("a PAX header of more than %d records: refused", maxPaxRecords))
		}
		if err := x.entry(tr, hdr); err != nil {
			return err
		}
	}
}

func roundBlock(n int64) int64 { return (n + blockSize - 1) / blockSize * blockSize }

// archiveReader counts what archive/tar reads of the archive and stops it at limit (the
// headers of one entry: errMetaBound). It remembers a read error of the archive, so that a
// failed copy is told apart: the archive ended or broke (refused), or the disk failed (I/O).
type archiveReader struct {
	r     io.Reader
	err   *error
	n     int64 // bytes read
	limit int64
	// lastNonZero is just past the last non-zero byte read: archive/tar drops a header with no
	// entry after it at the end of the archive, and this is how Untar sees one.
	lastNonZero int64
}

func (a *archiveReader) Read(p []byte) (int, error) {
	if a.n >= a.limit {
		return 0, errMetaBound
	}
	if int64(len(p)) > a.limit-a.n {
		p = p[:a.limit-a.n]
	}
	n, err := a.r.Read(p)
	for i := n - 1; i >= 0; i-- {
		if p[i] != 0 {
			a.lastNonZero = a.n + int64(i) + 1
			break
		}
	}
	a.n += int64(n)
	if err != nil && !errors.Is(err, io.EOF) {
		*a.err = err
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
	links   []string        // the symlinks made, resolved again at the end (checkLinks)
	named   map[string]bool // names of this archive's files and links: a link never shares one
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
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return x.refuse(hdr.Name, errors.New("a sparse file: refused"))
		}
	}
	if (hdr.Typeflag == tar.TypeDir || hdr.Typeflag == tar.TypeSymlink) && hdr.Size != 0 {
		return x.refuse(hdr.Name, fmt.Errorf("a directory or symlink that carries %d bytes of data: refused", hdr.Size))
	}
	switch hdr.Typeflag {
	case tar.TypeReg, tar.TypeCont:
		return x.file(tr, hdr, name)
	case tar.TypeDir:
		return x.dir(hdr, name)
	case tar.TypeSymlink:
		return x.symlink(hdr, name)
	case tar.TypeLink:
		// Refused as the plugin refuses them: a hardlink aliases a file the archive does not
		// show, and nothing sandboxd or the plugin writes holds one.
		return x.refuse(hdr.Name, errors.New("a hardlink: hardlinks are refused"))
	case tar.TypeGNUSparse:
		return x.refuse(hdr.Name, errors.New("a sparse file: refused"))
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
	if x.named[name] && x.isLink(name) {
		return x.refuse(hdr.Name, errors.New("a file over a symlink of the archive: refused, as a symlink over an existing entry is"))
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
	x.named[name] = true
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
	if x.named[name] {
		return x.refuse(hdr.Name, errors.New("a symlink over an existing entry of the archive: refused"))
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
	x.links = append(x.links, name)
	x.named[name] = true
	x.stats.Files++
	return nil
}

// isLink reports whether name is a symlink now.
func (x *extractor) isLink(name string) bool {
	fi, err := x.root.Lstat(name)
	return err == nil && fi.Mode()&fs.ModeSymlink != 0
}

// checkLinks resolves every symlink made once the whole archive is in (a later link can turn an
// earlier one's path out of the root): one whose resolution leaves the root at any step is
// refused and removed, with every other link so refused.
func (x *extractor) checkLinks() error {
	var bad []string
	var first error
	for _, name := range x.links {
		target, err := x.root.Readlink(name)
		if errors.Is(err, syscall.EINVAL) || errors.Is(err, fs.ErrNotExist) {
			continue // no longer a link
		}
		if err != nil {
			return x.ioFail(name, err)
		}
		where, err := resolveLink(x.root, name, target)
		if err != nil {
			return x.ioFail(name, err)
		}
		if where != linkInside {
			bad = append(bad, name)
			if first == nil {
				first = x.refuse(name, fmt.Errorf("symlink %s", where))
			}
		}
	}
	for _, name := range bad { // once all are judged: a removed link would change the others' paths
		if err := x.root.Remove(name); err != nil {
			return x.ioFail(name, err)
		}
	}
	return first
}

// linkWhere is where resolving a symlink ends.
type linkWhere string

const (
	linkInside  linkWhere = "stays inside the root"
	linkOutside linkWhere = "leads out of the root through other links: refused"
	linkLoop    linkWhere = "loops: refused"
)

// resolveLink says where the symlink name (relative to root) leads, resolved one step at a time
// as the kernel would, through every link on the way (their targets read from the disk):
// outside as soon as a step leaves the root (an absolute target, ".." above it), a loop past
// maxLinkHops links. A step that does not exist (or is not a directory) is taken lexically: it
// may exist later. The same rule as the plugin's (plugins/paperclip/src/tar.ts resolveLink).
func resolveLink(root *os.Root, name, target string) (linkWhere, error) {
	var stack []string
	if dir := path.Dir(name); dir != "." {
		stack = strings.Split(dir, "/")
	}
	if path.IsAbs(target) {
		return linkOutside, nil
	}
	queue := strings.Split(target, "/")
	for hops := 0; len(queue) > 0; {
		c := queue[0]
		queue = queue[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(stack) == 0 {
				return linkOutside, nil
			}
			stack = stack[:len(stack)-1]
			continue
		}
		p := path.Join(append(slices.Clone(stack), c)...)
		fi, err := root.Lstat(p)
		if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			return "", err
		}
		if err == nil && fi.Mode()&fs.ModeSymlink != 0 {
			if hops++; hops > maxLinkHops {
				return linkLoop, nil
			}
			next, err := root.Readlink(p)
			if err != nil {
				return "", err
			}
			if path.IsAbs(next) {
				return linkOutside, nil
			}
			queue = append(strings.Split(next, "/"), queue...)
			continue
		}
		stack = append(stack, c)
	}
	return linkInside, nil
}
