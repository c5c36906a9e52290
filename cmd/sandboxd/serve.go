package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/internal/cli"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

const serveSummary = "sandboxd serve runs commands for kubeclip's exec service (TLS on --listen, plain on --socket)."

type serveSettings struct {
	Listen           string
	Socket           string
	JournalDir       string
	MaxOutputBytes   int
	OutputBytesLimit int
	JournalDiskBytes int
	JournalTTL       time.Duration
	LogLevel         string
	// SeedFile holds the seed until serve reads and removes it (an exec-capable pod's init
	// container writes it there); empty: the seed is in SeedEnv. Never the seed itself in a
	// flag: flags show in ps.
	SeedFile string
	// Seed is SeedEnv's when SeedFile is empty; serve reads SeedFile's.
	Seed []byte
	// Unbound starts a warm pod's daemon: the seed is the pod's bind seed, and only a bind,
	// which installs the lease's seed and environment, is served until one succeeds.
	Unbound bool
}

// parseServe reads serve's settings: defaults, environment, flags, then checks them.
func parseServe(args []string, lookupEnv config.LookupEnv, stdout io.Writer) (serveSettings, error) {
	var s serveSettings
	fs := config.New("sandboxd serve", lookupEnv)
	fs.String(&s.Listen, "listen", "KUBECLIP_SANDBOXD_LISTEN", sandboxd.DefaultListen, "TLS listen address for the exec-worker (key and token derived from the lease seed, or with --unbound the bind seed: --seed-file, or "+execspec.SeedEnv+"); empty: none")
	fs.String(&s.Socket, "socket", "KUBECLIP_SANDBOXD_SOCKET", sandboxd.DefaultSocket, "unix socket for the pod's own processes and `sandboxd proxy` (no TLS, no token); empty: none")
	fs.String(&s.JournalDir, "journal-dir", "KUBECLIP_SANDBOXD_JOURNAL_DIR", sandboxd.DefaultJournalDir, "directory of the output journals (in the pod's emptyDir)")
	fs.Int(&s.MaxOutputBytes, "max-output-bytes", "KUBECLIP_SANDBOXD_MAX_OUTPUT_BYTES", sandboxd.DefaultMaxOutputBytes, "cap of each exec's journal (payload plus 14 bytes per chunk); past it output is dropped and the exit says truncated")
	fs.Int(&s.OutputBytesLimit, "output-bytes-limit", "KUBECLIP_SANDBOXD_OUTPUT_BYTES_LIMIT", sandboxd.DefaultOutputBytesLimit, "the largest cap a start's maxOutputBytes may set for its exec (a sync out of a large tree); at least --max-output-bytes")
	fs.Int(&s.JournalDiskBytes, "journal-disk-bytes", "KUBECLIP_SANDBOXD_JOURNAL_DISK_BYTES", sandboxd.DefaultJournalDisk, "bound of all journal files together (the run emptyDir's sizeLimit is 2 GiB); past it output is dropped and the exit says truncated")
	fs.Duration(&s.JournalTTL, "journal-ttl", "KUBECLIP_SANDBOXD_JOURNAL_TTL", sandboxd.DefaultJournalTTL, "how long an exited command's journal is kept when no client deletes it")
	fs.String(&s.SeedFile, "seed-file", "KUBECLIP_SANDBOXD_SEED_FILE", "", "file holding the lease seed (hex), removed once read; empty: "+execspec.SeedEnv)
	fs.Bool(&s.Unbound, "unbound", "KUBECLIP_SANDBOXD_UNBOUND", false, "start unbound, as a warm pod: the seed is the pod's bind seed and only POST /v1/bind (on --listen) is served until a bind installs the lease's seed and environment")
	fs.String(&s.LogLevel, "log-level", "KUBECLIP_LOG_LEVEL", "info", "log level: debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		fs.Usage(stdout, serveSummary)
		return s, cli.Usage(err)
	}
	var errs []error
	if s.Listen == "" && s.Socket == "" {
		errs = append(errs, fmt.Errorf("%s and %s are both empty: nothing to serve on", fs.Names("listen"), fs.Names("socket")))
	}
	if s.Unbound && s.Listen == "" {
		errs = append(errs, fmt.Errorf("%s needs %s: the bind is served there", fs.Names("unbound"), fs.Names("listen")))
	}
	if s.Listen != "" && s.SeedFile == "" {
		v, ok := lookupEnv(execspec.SeedEnv)
		seed, err := execspec.ParseSeed(v)
		switch {
		case !ok || v == "":
			errs = append(errs, fmt.Errorf("%s is not set: %s needs the lease seed (or %s)", execspec.SeedEnv, fs.Names("listen"), fs.Names("seed-file")))
		case err != nil:
			errs = append(errs, fmt.Errorf("%s: %w", execspec.SeedEnv, err))
		default:
			s.Seed = seed
		}
	}
	if s.JournalDir == "" {
		errs = append(errs, fmt.Errorf("%s must not be empty", fs.Names("journal-dir")))
	}
	if s.MaxOutputBytes < 1024 {
		errs = append(errs, fmt.Errorf("%s must be >= 1024", fs.Names("max-output-bytes")))
	}
	if s.OutputBytesLimit < s.MaxOutputBytes {
		errs = append(errs, fmt.Errorf("%s must be >= %s", fs.Names("output-bytes-limit"), fs.Names("max-output-bytes")))
	}
	if s.JournalDiskBytes < 1<<20 {
		errs = append(errs, fmt.Errorf("%s must be >= 1 MiB", fs.Names("journal-disk-bytes")))
	}
	if s.JournalTTL <= 0 {
		errs = append(errs, fmt.Errorf("%s must be > 0", fs.Names("journal-ttl")))
	}
	if _, err := zerolog.ParseLevel(s.LogLevel); err != nil || s.LogLevel == "" {
		errs = append(errs, fmt.Errorf("%s: unknown level %q", fs.Names("log-level"), s.LogLevel))
	}
	if err := errors.Join(errs...); err != nil {
		return s, &cli.UsageError{Err: err}
	}
	return s, nil
}

func serve(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout, stderr io.Writer) error {
	s, err := parseServe(args, lookupEnv, stdout)
	if err != nil {
		return err
	}
	// Non-dumpable before the seed is in memory: the agent's commands run as this user.
	if err := sandboxd.ForgetSeedEnv(); err != nil {
		return err
	}
	if s.SeedFile != "" {
		if s.Seed, err = readSeedFile(s.SeedFile); err != nil {
			return err
		}
	}
	log := cli.NewLogger(stderr, s.LogLevel, "sandboxd")
	reaper, err := sandboxd.NewReaper(log)
	if err != nil {
		return err
	}
	// The reaper outlives the server: commands still exiting while it drains must be reaped.
	reaperCtx, stopReaper := context.WithCancel(context.WithoutCancel(ctx))
	reaped := make(chan struct{})
	go func() { _ = reaper.Run(reaperCtx); close(reaped) }()
	defer func() { stopReaper(); <-reaped }()

	srv, err := sandboxd.New(sandboxd.Options{
		Logger: log, Reaper: reaper, Seed: s.Seed, Unbound: s.Unbound,
		TCPAddr: s.Listen, SocketPath: s.Socket, JournalDir: s.JournalDir,
		MaxOutputBytes: int64(s.MaxOutputBytes), OutputBytesLimit: int64(s.OutputBytesLimit),
		JournalDisk: int64(s.JournalDiskBytes), JournalTTL: s.JournalTTL,
		Env: os.Environ(),
	})
	clear(s.Seed) // the server keeps only what it derived from it
	if err != nil {
		return err
	}
	return srv.Run(ctx)
}
