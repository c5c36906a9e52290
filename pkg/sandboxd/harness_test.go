package sandboxd_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/oklog/ulid/v2"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// testSeed is the lease seed of the test servers.
var testSeed = execspec.DeriveSeed([]byte("test master key"), "tenant-test", "run-test")

// testEnv is the environment test servers start commands from: a seed that must never reach a
// command, and a variable that requests lay theirs over.
var testEnv = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "BASEVAR=base", execspec.SeedEnv + "=" + strings.Repeat("ab", 32)}

type harness struct {
	srv     *sandboxd.Server
	tls     *sandboxd.Client // TCP, TLS pinned to testSeed, token
	unix    *sandboxd.Client // unix socket, no TLS, no token
	addr    string
	socket  string
	journal string
	stop    context.CancelFunc
	done    chan error // Run's result
}

// startServer runs a server on 127.0.0.1:0 and a unix socket, sharing the test binary's reaper.
// Cleanup stops it and waits for Run.
func startServer(tb testing.TB, mod func(*sandboxd.Options)) *harness {
	tb.Helper()
	// Unix socket paths are limited to 108 bytes; t.TempDir() holds the test's name.
	sockDir, err := os.MkdirTemp("", "sbd")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(sockDir) })
	opts := sandboxd.Options{
		Logger:         zerolog.New(zerolog.NewTestWriter(tb)).Level(zerolog.DebugLevel),
		Reaper:         sandboxd.TestReaper,
		Seed:           testSeed,
		TCPAddr:        "127.0.0.1:0",
		SocketPath:     filepath.Join(sockDir, "sandboxd.sock"),
		JournalDir:     filepath.Join(tb.TempDir(), "journal"),
		MaxOutputBytes: sandboxd.DefaultMaxOutputBytes,
		JournalTTL:     time.Minute,
		Env:            testEnv,
	}
	if mod != nil {
		mod(&opts)
	}
	srv, err := sandboxd.New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(tb.Context())) // ends in Cleanup, after the test's own context
	h := &harness{srv: srv, socket: opts.SocketPath, journal: opts.JournalDir, stop: cancel, done: make(chan error, 1)}
	go func() { h.done <- srv.Run(ctx) }()
	h.addr = srv.TCPAddr().String()
	h.tls = newClient(tb, sandboxd.ClientOptions{Dial: sandboxd.DialTCP(h.addr), TLS: sandboxd.ClientTLSConfig(testSeed), Token: sandboxd.ClientToken(testSeed)})
	h.unix = newClient(tb, sandboxd.ClientOptions{Dial: sandboxd.DialUnix(opts.SocketPath)})
	tb.Cleanup(func() {
		cancel()
		select {
		case err := <-h.done:
			h.done <- err
		case <-time.After(30 * time.Second):
			tb.Error("sandboxd did not stop within 30s of its context's end")
		}
	})
	return h
}

func newClient(tb testing.TB, o sandboxd.ClientOptions) *sandboxd.Client {
	tb.Helper()
	c, err := sandboxd.NewClient(o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

func newID() string { return ulid.Make().String() }

// result is what a caller of an exec ends up with.
type result struct {
	Stdout, Stderr string
	ExitCode       *int
	Signal         *string
	TimedOut       bool
	Truncated      bool
	Error          string
}

func intp(i int) *int           { return &i }
func strp(s string) *string     { return &s }
func sh(script string) []string { return []string{"-c", script} }

// output reads an exec's frames from seq from until its exit frame.
func output(ctx context.Context, c *sandboxd.Client, id string, from uint64) ([]*sandboxd.Chunk, *execspec.Exit, error) {
	s, err := c.Output(ctx, id, from)
	if err != nil {
		return nil, nil, err
	}
	defer s.Close()
	var chunks []*sandboxd.Chunk
	for {
		f, err := s.Next()
		if err != nil {
			return chunks, nil, err
		}
		switch f := f.(type) {
		case *sandboxd.Chunk:
			chunks = append(chunks, f)
		case *execspec.Exit:
			if _, err := s.Next(); !errors.Is(err, io.EOF) {
				return chunks, f, fmt.Errorf("after the exit frame: %w, want io.EOF", err)
			}
			return chunks, f, nil
		}
	}
}

// summarize checks that chunks are seqs 1..n and folds them into a result.
func summarize(tb testing.TB, chunks []*sandboxd.Chunk, exit *execspec.Exit) result {
	tb.Helper()
	var out, errb strings.Builder
	for i, c := range chunks {
		if c.Seq != uint64(i+1) {
			tb.Fatalf("chunk %d has seq %d: gap or duplicate", i+1, c.Seq)
		}
		if c.Stream == sandboxd.Stdout {
			out.Write(c.Data)
		} else {
			errb.Write(c.Data)
		}
	}
	if exit.LastSeq != uint64(len(chunks)) || exit.StdoutBytes != int64(out.Len()) || exit.StderrBytes != int64(errb.Len()) {
		tb.Fatalf("exit frame %+v does not match %d chunks, %d+%d bytes", exit, len(chunks), out.Len(), errb.Len())
	}
	return result{Stdout: out.String(), Stderr: errb.String(), ExitCode: exit.ExitCode, Signal: exit.Signal,
		TimedOut: exit.TimedOut, Truncated: exit.Truncated, Error: exit.Error}
}

// run starts spec (a fresh id unless set), sends stdin if any, and returns its result.
func run(tb testing.TB, c *sandboxd.Client, spec sandboxd.Spec, stdin []byte) result {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if spec.ID == "" {
		spec.ID = newID()
	}
	if _, err := c.Start(ctx, spec); err != nil {
		tb.Fatal(err)
	}
	if spec.Stdin {
		if _, err := c.WriteStdin(ctx, spec.ID, 0, stdin, true); err != nil {
			tb.Fatal(err)
		}
	}
	chunks, exit, err := output(ctx, c, spec.ID, 1)
	if err != nil {
		tb.Fatal(err)
	}
	return summarize(tb, chunks, exit)
}

// eventually polls cond every 20 ms until it holds or 15 s pass.
func eventually(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			tb.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// processGone reports whether pid no longer exists, zombies included: a zombie keeps its /proc
// entry until it is reaped.
func processGone(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return errors.Is(err, os.ErrNotExist)
}

var sortStrings = cmpopts.SortSlices(func(a, b string) bool { return a < b })
