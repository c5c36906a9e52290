package sandboxd

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"
	"unicode/utf8"
)

// Native sync: `sandboxd untar` and `sandboxd tar` move a tree into and out of a lease as one
// uncompressed tar stream over an exec's stdin or stdout (docs/exec.md, "Native sync"), in
// place of Paperclip's base64 chunks over execute. Both run as commands the exec service
// starts, in the tenant's pod: the archive and every name in it are the tenant's, hostile.

// Defaults of the sync bounds; operators and clients may set lower ones per call.
const (
	// DefaultSyncMaxBytes bounds the regular files' bytes of one archive: a header may declare
	// any size (a sparse entry a terabyte), so the bound is checked before a byte is written.
	DefaultSyncMaxBytes = 1 << 30
	// DefaultSyncMaxFiles bounds the entries of one archive (directories included).
	DefaultSyncMaxFiles = 100_000
	// maxSyncName bounds an entry's name (PATH_MAX): archive/tar itself refuses PAX and GNU
	// long-name headers over 1 MiB.
	maxSyncName = 4096
)

// Exit statuses of `sandboxd untar` and `sandboxd tar` (sysexits.h), the only ones they use
// besides 0 and 2 (a usage error).
const (
	// ExitSyncRefused: the archive or the request is refused (a name leading out of the root, a
	// device node, a bound exceeded, a malformed header, a missing name).
	ExitSyncRefused = 65 // EX_DATAERR
	// ExitSyncIO: reading or writing the tree failed (a full disk, a permission).
	ExitSyncIO = 74 // EX_IOERR
)

// SyncError is why untar or tar stopped, naming the entry. Error is the one stderr line the
// subcommands print: `untar: "<entry>": <reason>`, the name quoted so that no name can forge
// a second line.
type SyncError struct {
	Op      string // "untar" or "tar"
	Entry   string // the entry's name as the archive or the request gave it
	Err     error
	Refused bool // the input is refused (ExitSyncRefused); false: an I/O failure (ExitSyncIO)
}

func (e *SyncError) Error() string {
	reason := strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, e.Err.Error())
	return fmt.Sprintf("%s: %q: %s", e.Op, e.Entry, reason)
}

func (e *SyncError) Unwrap() error { return e.Err }

// ExitCode is the subcommand's exit status for e.
func (e *SyncError) ExitCode() int {
	if e.Refused {
		return ExitSyncRefused
	}
	return ExitSyncIO
}

// SyncStats counts what untar extracted or tar archived: files are the entries that are not
// directories (regular files, symlinks, hardlinks), bytes the regular files' contents.
type SyncStats struct {
	Files int   `json:"files"`
	Bytes int64 `json:"bytes"`
}

// copyBuffer is the size of the copies between the archive and the files: io.Copy's 32 KiB
// would make 32 reads and writes of each MiB.
const copyBuffer = 1 << 20

// copyN copies n bytes from src to dst through *buf (allocated once, copyBuffer bytes), never
// through dst's ReadFrom or src's WriteTo and their 32 KiB buffers. Fewer bytes than n is
// io.EOF, as with io.CopyN.
func copyN(dst io.Writer, src io.Reader, n int64, buf *[]byte) (int64, error) {
	if *buf == nil {
		*buf = make([]byte, copyBuffer)
	}
	written, err := io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{io.LimitReader(src, n)}, *buf)
	if err == nil && written < n {
		err = io.EOF
	}
	return written, err
}

// errOutside is a name or link target that leads out of the root.
var errOutside = errors.New("leads out of the root")

// CleanSyncName is an archive or request name relative to the root, '/'-separated, without "./"
// prefixes or empty components; "." is the root itself. Absolute names and ".." components
// are refused, as is anything longer than maxSyncName.
func CleanSyncName(name string) (string, error) {
	switch {
	case name == "":
		return "", errors.New("empty name")
	case len(name) > maxSyncName:
		return "", fmt.Errorf("name longer than %d bytes", maxSyncName)
	case strings.ContainsRune(name, 0):
		return "", errors.New("name contains NUL")
	case strings.HasPrefix(name, "/"):
		return "", fmt.Errorf("absolute name %w", errOutside)
	}
	var parts []string
	for p := range strings.SplitSeq(name, "/") {
		switch p {
		case "", ".":
		case "..":
			return "", fmt.Errorf("a '..' component %w", errOutside)
		default:
			parts = append(parts, p)
		}
	}
	if len(parts) == 0 {
		return ".", nil
	}
	return strings.Join(parts, "/"), nil
}

// ioCause strips the path from an os error: the path holds the root and a hostile name, and
// the entry is named once, quoted, by SyncError.
func ioCause(err error) error {
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe):
		return pe.Err
	case errors.As(err, &le):
		return le.Err
	}
	return err
}

// excluder decides tar's --exclude: a name (relative to the root) is excluded when a glob
// matches the whole name or any part of it that starts after a '/' (tar's default
// --no-anchored), where '*' and '?' match '/' too (--wildcards-match-slash). An excluded
// directory is skipped with everything under it.
type excluder []string

// newExcluder checks each glob's syntax ('*', '?', '[...]' with '!' or '^' negation, '\'
// escapes).
func newExcluder(globs []string) (excluder, error) {
	for _, g := range globs {
		if _, err := path.Match(classSyntax(g), ""); err != nil || g == "" {
			return nil, fmt.Errorf("exclude glob %q is malformed", g)
		}
	}
	return excluder(globs), nil
}

func (x excluder) excluded(name string) bool {
	for _, g := range x {
		if globMatch(g, name) {
			return true
		}
		for i := range len(name) {
			if name[i] == '/' && globMatch(g, name[i+1:]) {
				return true
			}
		}
	}
	return false
}

// globMatch matches name against pattern with a single backtracking point (the last '*'), so
// a hostile pattern costs at most len(pattern)*len(name) steps.
func globMatch(pattern, name string) bool {
	px, nx := 0, 0
	nextPx, nextNx := 0, 0
	for px < len(pattern) || nx < len(name) {
		if px < len(pattern) {
			switch c := pattern[px]; c {
			case '*':
				nextPx, nextNx = px, nx+runeLen(name[nx:])
				px++
				continue
			case '?':
				if nx < len(name) {
					px, nx = px+1, nx+runeLen(name[nx:])
					continue
				}
			case '[':
				if end := classEnd(pattern, px); end > 0 && nx < len(name) {
					r, n := utf8.DecodeRuneInString(name[nx:])
					if ok, _ := path.Match(classSyntax(pattern[px:end]), string(r)); ok || (r == '/' && classHasSlash(pattern[px:end])) {
						px, nx = end, nx+n
						continue
					}
				} else if end < 0 && nx < len(name) && name[nx] == '[' {
					px, nx = px+1, nx+1
					continue
				}
			case '\\':
				if px+1 < len(pattern) && nx < len(name) && name[nx] == pattern[px+1] {
					px, nx = px+2, nx+1
					continue
				}
			default:
				if nx < len(name) && name[nx] == c {
					px, nx = px+1, nx+1
					continue
				}
			}
		}
		if nextNx > 0 && nextNx <= len(name) {
			px, nx = nextPx, nextNx
			continue
		}
		return false
	}
	return true
}

func runeLen(s string) int {
	if s == "" {
		return 1
	}
	_, n := utf8.DecodeRuneInString(s)
	return n
}

// classEnd is the index just past the ']' closing the class at pattern[start]; -1 if none.
func classEnd(pattern string, start int) int {
	i := start + 1
	if i < len(pattern) && (pattern[i] == '!' || pattern[i] == '^') {
		i++
	}
	for ; i < len(pattern); i++ {
		switch pattern[i] {
		case '\\':
			i++
		case ']':
			return i + 1
		}
	}
	return -1
}

// classSyntax writes tar's "[!...]" negation as path.Match's "[^...]".
func classSyntax(p string) string { return strings.ReplaceAll(p, "[!", "[^") }

// classHasSlash reports whether a non-negated class lists '/' (path.Match never matches it).
func classHasSlash(class string) bool {
	return !strings.HasPrefix(class, "[!") && !strings.HasPrefix(class, "[^") && strings.Contains(class, "/")
}
