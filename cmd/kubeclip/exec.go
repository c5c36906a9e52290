package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sys/unix"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execclient"
)

const execUsage = `kubeclip exec runs a command in the pod of an exec-capable lease (backend pod or
sandbox-cr), through kubeclip's exec-workers; kubeclip attach follows one that runs or ran.

Usage:
  kubeclip exec <runId> --company ID [-t] [--cwd DIR] [-e K=V]... [--timeout D] [--record] -- command [args...]
  kubeclip attach <runId> <execId> --company ID [--from-seq N]

stdin goes to the command when it is not a terminal (a pipe or a file); the command's stdout and
stderr are kubeclip's. With -t the command runs on a terminal in the pod, of the size of
kubeclip's own (which must be stdin; resizing it resizes the pod's), with kubeclip's terminal in
raw mode until it exits: an interactive shell (kubeclip exec <runId> --company ID -t -- bash).
In every case kubeclip exits with the command's status: 128+n when signal n ended it,
124 when its timeout did. The lease is the run's, from its created event (waited for when the
run was acquired a moment ago), or --lease.
`

// leaseWait bounds the wait for a run's created event: an acquire takes seconds.
const leaseWait = 2 * time.Minute

// Exit statuses that say how a command ended, as timeout(1) and shells report them.
const (
	exitTimedOut  = 124
	exitSignalled = 128
)

func runExec(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout, stderr io.Writer) error {
	head, command := args, []string(nil)
	if i := slices.Index(args, "--"); i >= 0 {
		head, command = args[:i], args[i+1:]
	}
	runID, flags := positional(head, 1)
	var c client
	var l execclient.Lease
	var x execclient.Exec
	var env []string
	var timeout time.Duration
	var tty bool
	fs := config.New("kubeclip exec", lookupEnv)
	c.bind(fs)
	fs.String(&l.CompanyID, "company", "KUBECLIP_COMPANY", "", "company id (required)")
	fs.String(&l.ProviderLeaseID, "lease", "KUBECLIP_LEASE", "", "the run's providerLeaseId; empty: read from its created event")
	fs.String(&x.Cwd, "cwd", "KUBECLIP_EXEC_CWD", "", "working directory in the pod (absolute); empty: the pod's")
	fs.Strings(&env, "env", "e", "KUBECLIP_EXEC_ENV", "K=V laid over the pod's environment")
	fs.Duration(&timeout, "timeout", "KUBECLIP_EXEC_TIMEOUT", 0, "kill the command (and everything it started) after this long; 0: never")
	fs.Bool(&x.Record, "record", "KUBECLIP_EXEC_RECORD", false, "publish the output as exec events in the run stream")
	fs.Bool(&tty, "tty", "KUBECLIP_EXEC_TTY", false, "run the command on a terminal, interactively: stdin must be a terminal")
	fs.Alias("t", "tty")
	if err := parse(fs, flags, stdout, execUsage); err != nil {
		return err
	}
	if len(runID) != 1 || l.CompanyID == "" || len(command) == 0 {
		fmt.Fprint(stderr, execUsage)
		return &app.UsageError{Err: errors.New("exec needs a run id, --company and a command after --")}
	}
	l.RunID = runID[0]
	x.Command, x.Args, x.Timeout = command[0], command[1:], timeout
	x.Env = map[string]string{}
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return &app.UsageError{Err: fmt.Errorf("--env %q: want K=V", kv)}
		}
		x.Env[k] = v
	}
	x.Stdout, x.Stderr = stdout, stderr
	var tm *terminal
	if tty {
		var err error
		if tm, err = openTerminal(os.Stdin); err != nil {
			return err
		}
		sz, err := tm.size()
		if err != nil {
			return err
		}
		x.TTY, x.Stdin = &sz, os.Stdin
		// The command draws for kubeclip's terminal: it gets its type unless -e names one.
		if v, ok := lookupEnv("TERM"); ok && x.Env["TERM"] == "" {
			x.Env["TERM"] = v
		}
	} else {
		x.Stdin, x.StdinBytes = commandStdin()
	}

	nc, js, s, err := c.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	if x.Lease, err = resolveLease(ctx, js, s, l); err != nil {
		return err
	}
	ec, err := execclient.New(execclient.Options{NATS: nc, Subjects: s})
	if err != nil {
		return err
	}
	if tm != nil {
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		x.Resize = tm.resizes(rctx)
		restore, err := tm.raw()
		if err != nil {
			return err
		}
		defer restore()
	}
	res, err := ec.Run(ctx, x)
	return exitStatus(ctx, res, err)
}

func runAttach(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout, stderr io.Writer) error {
	ids, flags := positional(args, 2)
	var c client
	var l execclient.Lease
	var fromSeq int
	fs := config.New("kubeclip attach", lookupEnv)
	c.bind(fs)
	fs.String(&l.CompanyID, "company", "KUBECLIP_COMPANY", "", "company id (required)")
	fs.String(&l.ProviderLeaseID, "lease", "KUBECLIP_LEASE", "", "the run's providerLeaseId; empty: read from its created event")
	fs.Int(&fromSeq, "from-seq", "KUBECLIP_FROM_SEQ", 1, "journal seq to start from (1: the whole output)")
	if err := parse(fs, flags, stdout, execUsage); err != nil {
		return err
	}
	if len(ids) != 2 || l.CompanyID == "" || fromSeq < 1 {
		fmt.Fprint(stderr, execUsage)
		return &app.UsageError{Err: errors.New("attach needs a run id, an exec id, --company and --from-seq >= 1")}
	}
	l.RunID = ids[0]
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
	res, err := ec.Attach(ctx, l, ids[1], uint64(fromSeq), stdout, stderr)
	return exitStatus(ctx, res, err)
}

// positional splits the first n arguments that are not flags from the rest.
func positional(args []string, n int) (pos, rest []string) {
	for len(args) > 0 && len(pos) < n && !strings.HasPrefix(args[0], "-") {
		pos, args = append(pos, args[0]), args[1:]
	}
	return pos, args
}

// commandStdin is kubeclip's stdin when it is not a terminal: a pipe (size unknown) or a file.
func commandStdin() (io.Reader, int64) {
	fi, err := os.Stdin.Stat()
	if err != nil || fi.Mode()&os.ModeCharDevice != 0 {
		return nil, 0
	}
	if fi.Mode().IsRegular() {
		return os.Stdin, fi.Size()
	}
	return os.Stdin, -1
}

// resolveLease fills in the run's providerLeaseId from its created event, waiting for it (a
// run acquired a moment ago) for at most leaseWait; a failed acquire says why.
func resolveLease(ctx context.Context, js jetstream.JetStream, s events.Subjects, l execclient.Lease) (execclient.Lease, error) {
	if l.ProviderLeaseID != "" {
		return l, nil
	}
	if err := events.Ref(l.CompanyID, l.RunID).Validate(); err != nil {
		return l, &app.UsageError{Err: err}
	}
	wctx, cancel := context.WithTimeout(ctx, leaseWait)
	defer cancel()
	var failed *events.RunFailedEvent
	err := events.Follow(wctx, js, s, l.CompanyID, l.RunID, events.FollowOptions{}, func(r events.Received) error {
		switch ev := r.Event.(type) {
		case events.RunCreatedEvent:
			l.ProviderLeaseID = ev.ProviderLeaseID
			return events.ErrStopFollowing
		case events.RunFailedEvent:
			if ev.Request == events.LeaseAcquire {
				failed = &ev
				return events.ErrStopFollowing
			}
		}
		return nil
	})
	switch {
	case failed != nil:
		return l, fmt.Errorf("run %s has no lease: its acquire failed: %s: %s", l.RunID, failed.Code, failed.Message)
	case l.ProviderLeaseID != "":
		return l, nil
	case wctx.Err() != nil && ctx.Err() == nil:
		return l, fmt.Errorf("run %s of company %s has no created event after %s: was it acquired?", l.RunID, l.CompanyID, leaseWait)
	case err != nil:
		return l, fmt.Errorf("reading the events of run %s: %w", l.RunID, err)
	}
	return l, ctx.Err()
}

// exitStatus maps how the command ended to kubeclip's exit status.
func exitStatus(ctx context.Context, res execclient.Result, err error) error {
	switch {
	case err != nil && ctx.Err() != nil:
		return &app.ExitStatus{Code: exitSignalled + int(unix.SIGINT)}
	case errors.Is(err, execclient.ErrNoExit):
		return fmt.Errorf("exec %s: %w", res.ExecID, err)
	case err != nil:
		return err
	case res.TimedOut:
		return &app.ExitStatus{Code: exitTimedOut}
	case res.Signal != nil:
		return &app.ExitStatus{Code: exitSignalled + int(unix.SignalNum(*res.Signal))}
	case res.ExitCode != nil && *res.ExitCode != 0:
		return &app.ExitStatus{Code: *res.ExitCode}
	}
	return nil
}
