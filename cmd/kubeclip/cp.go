package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

const cpUsage = `kubeclip cp copies files between this machine and the pod of an exec-capable lease, as one
tar stream through kubeclip's exec-workers (native sync: sandboxd untar and tar in the pod).

Usage:
  kubeclip cp <runId> --company ID [flags] LOCAL :DIR     into the lease
  kubeclip cp <runId> --company ID [flags] :PATH LOCALDIR  out of the lease

The two names come last, after the flags. A name starting with ':' is in the lease (an absolute
path). The source lands under the target directory by its own name, as with cp -r SRC DIR/
(created if missing); a source named "." (or ending in "/.") copies a directory's entries. What
the pod sends is extracted with the same refusals as in the pod: nothing outside LOCALDIR.
`

func runCp(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout, stderr io.Writer) error {
	runID, rest := positional(args, 1)
	var c client
	var l execclient.Lease
	var opts execclient.SyncOptions
	var timeout time.Duration
	fs := config.New("kubeclip cp", lookupEnv)
	c.bind(fs)
	fs.String(&l.CompanyID, "company", "KUBECLIP_COMPANY", "", "company id (required)")
	fs.String(&l.ProviderLeaseID, "lease", "KUBECLIP_LEASE", "", "the run's providerLeaseId; empty: read from its created event")
	fs.Strings(&opts.Excludes, "exclude", "", "KUBECLIP_CP_EXCLUDE", "skip names matching this glob, as tar --exclude")
	fs.Bool(&opts.FollowSymlinks, "follow-symlinks", "KUBECLIP_CP_FOLLOW_SYMLINKS", false, "copy what symlinks point to (links leading out of the source are refused)")
	var maxBytes int
	fs.Int(&maxBytes, "max-bytes", "KUBECLIP_CP_MAX_BYTES", sandboxd.DefaultSyncMaxBytes, "refuse to copy regular files of more bytes")
	fs.Duration(&timeout, "timeout", "KUBECLIP_CP_TIMEOUT", 10*time.Minute, "give up on the copy after this long")
	var names []string
	if len(rest) >= 2 {
		names, rest = rest[len(rest)-2:], rest[:len(rest)-2]
	}
	flags := rest
	if err := parse(fs, flags, stdout, cpUsage); err != nil {
		return err
	}
	if len(runID) != 1 || l.CompanyID == "" || len(names) != 2 || strings.HasPrefix(names[0], ":") == strings.HasPrefix(names[1], ":") || maxBytes <= 0 || timeout <= 0 {
		fmt.Fprint(stderr, cpUsage)
		return &app.UsageError{Err: errors.New("cp needs a run id, --company, one local name and one :name in the lease, --max-bytes and --timeout > 0")}
	}
	opts.MaxBytes, opts.Timeout = int64(maxBytes), timeout
	l.RunID = runID[0]
	nc, js, s, err := c.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	if l, err = resolveLease(ctx, js, s, l); err != nil {
		return err
	}
	ec, err := execclient.New(execclient.Options{NATS: nc, Subjects: s})
	if err != nil {
		return err
	}
	if remote, ok := strings.CutPrefix(names[1], ":"); ok {
		st, err := copyIn(ctx, ec, l, names[0], remote, opts)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "copied %d files, %d bytes into %s\n", st.Files, st.Bytes, remote)
		return nil
	}
	st, err := copyOut(ctx, ec, l, strings.TrimPrefix(names[0], ":"), names[1], opts)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "copied %d files, %d bytes into %s\n", st.Files, st.Bytes, names[1])
	return nil
}

// copyIn tars local, by its name, into the lease's dir.
func copyIn(ctx context.Context, ec *execclient.Client, l execclient.Lease, local, dir string, opts execclient.SyncOptions) (sandboxd.SyncStats, error) {
	if !path.IsAbs(dir) {
		return sandboxd.SyncStats{}, &app.UsageError{Err: fmt.Errorf("the lease's directory %q must be absolute", dir)}
	}
	if _, err := os.Stat(local); err != nil {
		return sandboxd.SyncStats{}, err
	}
	root, names := filepath.Dir(local), []string{filepath.Base(local)}
	pr, pw := io.Pipe()
	tarred := make(chan error, 1)
	go func() {
		_, err := sandboxd.Tar(pw, sandboxd.TarOptions{Root: root, Names: names, Excludes: opts.Excludes, FollowSymlinks: opts.FollowSymlinks, MaxBytes: opts.MaxBytes})
		_ = pw.CloseWithError(err)
		tarred <- err
	}()
	st, err := ec.SyncIn(ctx, l, dir, pr, opts)
	_ = pr.Close()
	if terr := <-tarred; terr != nil && !errors.Is(terr, io.ErrClosedPipe) {
		return st, terr // the local side's own refusal names the entry
	}
	return st, err
}

// copyOut tars the lease's remote, by its name, into local (a directory, created if missing).
func copyOut(ctx context.Context, ec *execclient.Client, l execclient.Lease, remote, local string, opts execclient.SyncOptions) (sandboxd.SyncStats, error) {
	if !path.IsAbs(remote) {
		return sandboxd.SyncStats{}, &app.UsageError{Err: fmt.Errorf("the lease's path %q must be absolute", remote)}
	}
	pr, pw := io.Pipe()
	type untarred struct {
		st  sandboxd.SyncStats
		err error
	}
	done := make(chan untarred, 1)
	go func() {
		st, err := sandboxd.Untar(pr, sandboxd.UntarOptions{Root: local, MaxBytes: opts.MaxBytes})
		_ = pr.CloseWithError(err)
		done <- untarred{st, err}
	}()
	_, err := ec.SyncOut(ctx, l, path.Dir(remote), []string{path.Base(remote)}, pw, opts)
	_ = pw.CloseWithError(err)
	u := <-done
	if u.err != nil && !errors.Is(u.err, err) {
		return u.st, u.err // the local side's refusal names the entry
	}
	return u.st, err
}
