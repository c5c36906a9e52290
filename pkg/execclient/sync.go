package execclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// Native sync (docs/exec.md, "Native sync"): a tree goes into a lease as one tar stream on the
// stdin of `sandboxd untar`, and comes out as the stdout of `sandboxd tar`, each one exec with
// the exec protocol's flow control, failover and bounds; no base64, no 4 MiB calls.

// syncInJournal caps a sync in's journal: its output is one JSON line or one error line.
const syncInJournal = 64 << 10

// SyncOptions bound a sync; zero values are sandboxd's defaults.
type SyncOptions struct {
	// Sandboxd is the sandboxd binary in the pod; empty: policy.SandboxdBinary.
	Sandboxd string
	// MaxBytes bounds the regular files' bytes (--max-bytes); MaxFiles the entries a sync in
	// extracts (--max-files).
	MaxBytes int64
	MaxFiles int
	// Modes sets the mode of entries a sync in extracts, by name relative to the target.
	Modes map[string]fs.FileMode
	// Excludes are a sync out's tar --exclude globs; FollowSymlinks archives what links point
	// to (links leading out of the source are refused).
	Excludes       []string
	FollowSymlinks bool
	// Timeout kills the exec after this long; 0: none.
	Timeout time.Duration
}

func (o SyncOptions) sandboxd() string {
	if o.Sandboxd == "" {
		return policy.SandboxdBinary
	}
	return o.Sandboxd
}

// SyncError is a sync that did not complete in the pod: sandboxd's exit status (65: the
// archive or request was refused; 74: an I/O failure) and its one stderr line, which names the
// entry. The line comes from the tenant's pod: it is shown, never interpreted.
type SyncError struct {
	Op       string // "sync in" or "sync out"
	ExitCode *int
	Signal   *string
	TimedOut bool
	Message  string
}

func (e *SyncError) Error() string {
	switch {
	case e.TimedOut:
		return e.Op + ": timed out"
	case e.ExitCode != nil:
		return fmt.Sprintf("%s: exit %d: %s", e.Op, *e.ExitCode, e.Message)
	case e.Signal != nil:
		return fmt.Sprintf("%s: killed by %s", e.Op, *e.Signal)
	}
	return e.Op + ": " + e.Message
}

// Refused reports whether sandboxd refused the archive or the request (a hostile entry, a
// bound exceeded, a missing name), rather than failing to read or write.
func (e *SyncError) Refused() bool {
	return e.ExitCode != nil && *e.ExitCode == sandboxd.ExitSyncRefused
}

// SyncIn extracts the tar stream archive under targetDir in the lease (created if missing) and
// returns what was extracted (sandboxd's answer: entries that are not directories, and the
// regular files' bytes). Entries are relative to targetDir; what sandboxd refuses (names
// or links leading out, device nodes, more than the bounds) is a *SyncError naming the entry.
func (c *Client) SyncIn(ctx context.Context, l Lease, targetDir string, archive io.Reader, opts SyncOptions) (sandboxd.SyncStats, error) {
	args := []string{"untar", "--root", targetDir}
	if opts.MaxBytes > 0 {
		args = append(args, "--max-bytes", strconv.FormatInt(opts.MaxBytes, 10))
	}
	if opts.MaxFiles > 0 {
		args = append(args, "--max-files", strconv.Itoa(opts.MaxFiles))
	}
	for _, name := range slices.Sorted(maps.Keys(opts.Modes)) {
		args = append(args, "--mode-file", fmt.Sprintf("%s=%o", name, opts.Modes[name].Perm()))
	}
	var stdout, stderr bytes.Buffer
	res, err := c.Run(ctx, Exec{
		Lease: l, Command: opts.sandboxd(), Args: args, Timeout: opts.Timeout,
		Stdin: archive, StdinBytes: -1, MaxOutputBytes: syncInJournal,
		Stdout: &limitedBuffer{b: &stdout, n: syncInJournal}, Stderr: &limitedBuffer{b: &stderr, n: syncInJournal},
	})
	if err != nil {
		return sandboxd.SyncStats{}, fmt.Errorf("sync in to %s: %w", targetDir, err)
	}
	if err := syncFailure("sync in", res, &stderr); err != nil {
		return sandboxd.SyncStats{}, err
	}
	var st sandboxd.SyncStats
	if err := json.Unmarshal(bytes.TrimSpace(stdout.Bytes()), &st); err != nil {
		return sandboxd.SyncStats{}, &SyncError{Op: "sync in", Message: fmt.Sprintf("sandboxd's answer is not its JSON line: %v", err)}
	}
	return st, nil
}

// SyncOut writes a tar stream of names (relative to sourceDir in the lease; "." is all of it)
// to w, as `sandboxd tar` produces it, and returns its size. Only a nil error means the
// archive is whole: a refusal or failure in the pod ends it unfinished, and w has taken what
// came before it.
func (c *Client) SyncOut(ctx context.Context, l Lease, sourceDir string, names []string, w io.Writer, opts SyncOptions) (int64, error) {
	if len(names) == 0 {
		return 0, errors.New("sync out: no names")
	}
	args := []string{"tar", "--root", sourceDir}
	maxBytes := opts.MaxBytes
	if maxBytes > 0 {
		args = append(args, "--max-bytes", strconv.FormatInt(maxBytes, 10))
	} else {
		maxBytes = sandboxd.DefaultSyncMaxBytes
	}
	for _, g := range opts.Excludes {
		args = append(args, "--exclude", g)
	}
	if opts.FollowSymlinks {
		args = append(args, "--follow-symlinks")
	}
	args = append(append(args, "--"), names...)
	var stderr bytes.Buffer
	out := &countingWriter{w: w}
	res, err := c.Run(ctx, Exec{
		Lease: l, Command: opts.sandboxd(), Args: args, Timeout: opts.Timeout,
		// The archive is the files plus their headers: room for a quarter more, and sandboxd
		// holds any exec to its --output-bytes-limit.
		MaxOutputBytes: maxBytes + maxBytes/4 + 64<<20,
		Stdout:         out, Stderr: &limitedBuffer{b: &stderr, n: syncInJournal},
	})
	if err != nil {
		return out.n, fmt.Errorf("sync out of %s: %w", sourceDir, err)
	}
	if err := syncFailure("sync out", res, &stderr); err != nil {
		return out.n, err
	}
	if res.Truncated {
		return out.n, &SyncError{Op: "sync out", Message: "the archive outgrew the pod's journal (sandboxd --output-bytes-limit or --journal-disk-bytes): incomplete"}
	}
	return out.n, nil
}

// syncFailure is the *SyncError of an exec that did not exit 0.
func syncFailure(op string, res Result, stderr *bytes.Buffer) error {
	if res.ExitCode != nil && *res.ExitCode == 0 && !res.TimedOut {
		return nil
	}
	msg := string(bytes.TrimSpace(stderr.Bytes()))
	if i := bytes.IndexByte([]byte(msg), '\n'); i >= 0 {
		msg = msg[:i] // sandboxd prints one line; anything after it is not sandboxd's
	}
	if res.ExitCode != nil && *res.ExitCode != sandboxd.ExitSyncRefused && *res.ExitCode != sandboxd.ExitSyncIO && msg == "" {
		msg = "sandboxd did not run"
	}
	return &SyncError{Op: op, ExitCode: res.ExitCode, Signal: res.Signal, TimedOut: res.TimedOut, Message: msg}
}

// limitedBuffer keeps the first n bytes written and drops the rest.
type limitedBuffer struct {
	b *bytes.Buffer
	n int
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	if room := l.n - l.b.Len(); room > 0 {
		l.b.Write(p[:min(room, len(p))])
	}
	return len(p), nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}
