package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"strconv"
	"strings"

	"github.com/kubeclip/kubeclip/internal/cli"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// syncBuffer is the size of the buffers between the archive and the exec's pipes: a pipe
// moves 64 KiB a read, and fewer, larger writes keep tar's small headers off the syscalls.
const syncBuffer = 256 << 10

// untarCmd runs `sandboxd untar`: the archive on in, one JSON line on out.
// Its settings come from its command line only: its environment is the tenant's.
func untarCmd(args []string, in io.Reader, out, errOut io.Writer) error {
	var opts sandboxd.UntarOptions
	modes := map[string]fs.FileMode{}
	flags := flag.NewFlagSet("sandboxd untar", flag.ContinueOnError)
	flags.SetOutput(errOut)
	flags.StringVar(&opts.Root, "root", "", "directory to extract under (created, 0755, if missing); required")
	flags.Int64Var(&opts.MaxBytes, "max-bytes", sandboxd.DefaultSyncMaxBytes, "refuse an archive whose regular files hold more bytes")
	flags.IntVar(&opts.MaxFiles, "max-files", sandboxd.DefaultSyncMaxFiles, "refuse an archive of more entries")
	flags.Func("mode-file", "NAME=OCTAL: extract entry NAME (relative to --root) with this mode (repeatable)", func(v string) error {
		i := strings.LastIndexByte(v, '=') // a name may hold '='; a mode never does
		name, octal := v[:max(i, 0)], v[i+1:]
		m, err := strconv.ParseUint(octal, 8, 32)
		if i < 0 || err != nil || m > 0o777 {
			return fmt.Errorf("%q is not NAME=OCTAL with a mode of at most 0777", v)
		}
		if name == "" {
			return fmt.Errorf("%q has no name", v)
		}
		modes[cleanOr(name)] = fs.FileMode(m)
		return nil
	})
	if err := flags.Parse(args); err != nil {
		return cli.Usage(err)
	}
	switch {
	case opts.Root == "":
		return cli.Usage(errors.New("untar: --root is required"))
	case flags.NArg() > 0:
		return cli.Usage(fmt.Errorf("untar: unexpected argument %q", flags.Arg(0)))
	case opts.MaxBytes <= 0 || opts.MaxFiles <= 0:
		return cli.Usage(errors.New("untar: --max-bytes and --max-files must be > 0"))
	}
	opts.Modes = modes
	stats, err := sandboxd.Untar(bufio.NewReaderSize(in, syncBuffer), opts)
	if err != nil {
		return syncFailed(err, errOut)
	}
	return json.NewEncoder(out).Encode(stats)
}

// tarCmd runs `sandboxd tar`: the archive on out.
func tarCmd(args []string, out, errOut io.Writer) error {
	var opts sandboxd.TarOptions
	flags := flag.NewFlagSet("sandboxd tar", flag.ContinueOnError)
	flags.SetOutput(errOut)
	flags.StringVar(&opts.Root, "root", "", "directory the names are relative to; required")
	flags.Func("exclude", "GLOB: skip names it matches, as tar --exclude (repeatable)", func(v string) error {
		opts.Excludes = append(opts.Excludes, v)
		return nil
	})
	flags.BoolVar(&opts.FollowSymlinks, "follow-symlinks", false, "archive what symlinks point to (refusing links that lead out of --root)")
	flags.Int64Var(&opts.MaxBytes, "max-bytes", sandboxd.DefaultSyncMaxBytes, "refuse to archive regular files of more bytes")
	if err := flags.Parse(args); err != nil {
		return cli.Usage(err)
	}
	opts.Names = flags.Args()
	switch {
	case opts.Root == "":
		return cli.Usage(errors.New("tar: --root is required"))
	case len(opts.Names) == 0:
		return cli.Usage(errors.New("tar: no NAME to archive"))
	case opts.MaxBytes <= 0:
		return cli.Usage(errors.New("tar: --max-bytes must be > 0"))
	}
	w := bufio.NewWriterSize(out, syncBuffer)
	if _, err := sandboxd.Tar(w, opts); err != nil {
		return syncFailed(err, errOut)
	}
	if err := w.Flush(); err != nil {
		return syncFailed(&sandboxd.SyncError{Op: "tar", Err: fmt.Errorf("writing the archive: %w", err)}, errOut)
	}
	return nil
}

// syncFailed prints a SyncError as the one stderr line the contract promises and returns the
// exit status; cli.Main prints nothing more for it.
func syncFailed(err error, errOut io.Writer) error {
	var se *sandboxd.SyncError
	if !errors.As(err, &se) {
		return err
	}
	fmt.Fprintln(errOut, se.Error())
	return &cli.ExitStatus{Code: se.ExitCode()}
}

// cleanOr is the name as Untar compares it (relative, no "./"), or the name itself when it is
// one Untar would refuse anyway.
func cleanOr(name string) string {
	if c, err := sandboxd.CleanSyncName(name); err == nil {
		return c
	}
	return name
}
