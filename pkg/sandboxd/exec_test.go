package sandboxd_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

func TestExecs(t *testing.T) {
	h := startServer(t, nil)
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "hello"), []byte("#!/bin/sh\necho hello from PATH\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "plain"), []byte("not a program\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		spec sandboxd.Spec
		want result
	}{
		{"cwd", sandboxd.Spec{Command: "pwd", Cwd: dir}, result{Stdout: dir + "\n", ExitCode: intp(0)}},
		{"env over the daemon's, without its seed",
			sandboxd.Spec{Command: "sh", Args: sh(`printf '%s|%s|%s' "$FOO" "$BASEVAR" "${KUBECLIP_SANDBOXD_SEED-unset}"`), Env: map[string]string{"FOO": "bar"}},
			result{Stdout: "bar|base|unset", ExitCode: intp(0)}},
		{"env replaces a daemon variable",
			sandboxd.Spec{Command: "sh", Args: sh(`printf %s "$BASEVAR"`), Env: map[string]string{"BASEVAR": "mine"}},
			result{Stdout: "mine", ExitCode: intp(0)}},
		{"PATH from the request finds the command",
			sandboxd.Spec{Command: "hello", Env: map[string]string{"PATH": bin + ":/usr/bin:/bin"}},
			result{Stdout: "hello from PATH\n", ExitCode: intp(0)}},
		{"args are not split", sandboxd.Spec{Command: "printf", Args: []string{"%s|", "a b", "$HOME"}},
			result{Stdout: "a b|$HOME|", ExitCode: intp(0)}},
		{"exit 0", sandboxd.Spec{Command: "true"}, result{ExitCode: intp(0)}},
		{"exit 3", sandboxd.Spec{Command: "sh", Args: sh("exit 3")}, result{ExitCode: intp(3)}},
		{"stderr is its own stream", sandboxd.Spec{Command: "sh", Args: sh("echo out; echo err >&2")},
			result{Stdout: "out\n", Stderr: "err\n", ExitCode: intp(0)}},
		{"killed by a signal", sandboxd.Spec{Command: "sh", Args: sh("kill -TERM $$")},
			result{Signal: strp("SIGTERM")}},
		{"missing command exits 127", sandboxd.Spec{Command: "no-such-command-kubeclip"},
			result{Stderr: "sandboxd: no-such-command-kubeclip: command not found\n", ExitCode: intp(127),
				Error: "no-such-command-kubeclip: command not found"}},
		{"missing command with a path exits 127", sandboxd.Spec{Command: "/nonexistent/cmd"},
			result{Stderr: "sandboxd: /nonexistent/cmd: no such file or directory\n", ExitCode: intp(127),
				Error: "/nonexistent/cmd: no such file or directory"}},
		{"not executable exits 126", sandboxd.Spec{Command: "./plain", Cwd: dir},
			result{Stderr: "sandboxd: ./plain: permission denied\n", ExitCode: intp(126), Error: "./plain: permission denied"}},
		{"missing cwd exits 126", sandboxd.Spec{Command: "true", Cwd: "/nonexistent-cwd"},
			result{Stderr: "sandboxd: cwd /nonexistent-cwd: no such file or directory\n", ExitCode: intp(126),
				Error: "cwd /nonexistent-cwd: no such file or directory"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := run(t, h.tls, tc.spec, nil)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("result (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStdinRoundTrip sends 8 MiB of stdin in offset chunks and gets it back byte for byte.
func TestStdinRoundTrip(t *testing.T) {
	h := startServer(t, nil)
	data := make([]byte, 8<<20)
	rng := rand.NewChaCha8([32]byte{1})
	_, _ = rng.Read(data)
	sum := sha256.Sum256(data)
	for _, tc := range []struct {
		name    string
		command string
		check   func(t *testing.T, stdout string)
	}{
		{"sha256sum", "sha256sum", func(t *testing.T, stdout string) {
			if want := hex.EncodeToString(sum[:]) + "  -\n"; stdout != want {
				t.Errorf("sha256sum printed %q, want %q", stdout, want)
			}
		}},
		{"cat", "cat", func(t *testing.T, stdout string) {
			if got := sha256.Sum256([]byte(stdout)); got != sum || len(stdout) != len(data) {
				t.Errorf("cat returned %d bytes with another sha256", len(stdout))
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			id := newID()
			if _, err := h.tls.Start(ctx, sandboxd.Spec{ID: id, Command: tc.command, Stdin: true}); err != nil {
				t.Fatal(err)
			}
			const chunk = 3 << 20 // 3 MiB: three writes, the last one short
			var off int64
			for off < int64(len(data)) {
				end := min(off+chunk, int64(len(data)))
				next, err := h.tls.WriteStdin(ctx, id, off, data[off:end], end == int64(len(data)))
				if err != nil {
					t.Fatal(err)
				}
				if next != end {
					t.Fatalf("offset after writing [%d,%d) is %d", off, end, next)
				}
				off = next
			}
			chunks, exit, err := output(ctx, h.tls, id, 1)
			if err != nil {
				t.Fatal(err)
			}
			got := summarize(t, chunks, exit)
			if got.ExitCode == nil || *got.ExitCode != 0 || got.Stderr != "" {
				t.Fatalf("exit %+v, stderr %q", exit, got.Stderr)
			}
			tc.check(t, got.Stdout)
		})
	}
}

// TestLargeStdout: 16 MiB of stdout arrive complete, in order, as contiguous chunks.
func TestLargeStdout(t *testing.T) {
	h := startServer(t, nil)
	data := make([]byte, 16<<20)
	rng := rand.NewChaCha8([32]byte{2})
	_, _ = rng.Read(data)
	file := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	got := run(t, h.tls, sandboxd.Spec{Command: "cat", Args: []string{file}}, nil)
	if len(got.Stdout) != len(data) || !bytes.Equal([]byte(got.Stdout), data) {
		t.Fatalf("stdout is %d bytes, want the file's %d", len(got.Stdout), len(data))
	}
	if got.ExitCode == nil || *got.ExitCode != 0 || got.Truncated {
		t.Fatalf("result %+v", got)
	}
}

// TestOutputCap: past the exec's cap output is read and dropped; the command is not blocked.
func TestOutputCap(t *testing.T) {
	h := startServer(t, nil)
	const limit = 1000
	got := run(t, h.tls, sandboxd.Spec{Command: "head", Args: []string{"-c", "1000000", "/dev/zero"}, MaxOutputBytes: limit}, nil)
	if !got.Truncated || len(got.Stdout) == 0 || len(got.Stdout) > limit-14 {
		t.Fatalf("truncated=%v with %d bytes of stdout, want truncated with at most %d", got.Truncated, len(got.Stdout), limit-14)
	}
	if got.ExitCode == nil || *got.ExitCode != 0 {
		t.Fatalf("exit code %v, want 0", got.ExitCode)
	}
}

// TestConcurrent: 32 commands run at once. Each waits until all 32 have started, so fewer
// slots would deadlock into their timeout.
func TestConcurrent(t *testing.T) {
	h := startServer(t, nil)
	const n = 32
	barrier := t.TempDir()
	script := `d=$1 i=$2; touch "$d/$i"; while set -- "$d"/*; [ $# -lt ` + strconv.Itoa(n) + ` ]; do sleep 0.1; done; echo "$i"`
	var wg sync.WaitGroup
	results := make([]result, n)
	for i := range n {
		wg.Go(func() {
			c := h.tls
			if i%2 == 1 {
				c = h.unix
			}
			results[i] = run(t, c, sandboxd.Spec{Command: "sh", Args: []string{"-c", script, "sh", barrier, strconv.Itoa(i)}, TimeoutMs: 60_000}, nil)
		})
	}
	wg.Wait()
	for i, got := range results {
		if diff := cmp.Diff(result{Stdout: strconv.Itoa(i) + "\n", ExitCode: intp(0)}, got); diff != "" {
			t.Errorf("exec %d (-want +got):\n%s", i, diff)
		}
	}
}

// TestIdempotentStart: the same id and spec started three times (two at once) runs once.
func TestIdempotentStart(t *testing.T) {
	h := startServer(t, nil)
	ctx := t.Context()
	runs := filepath.Join(t.TempDir(), "runs")
	spec := sandboxd.Spec{ID: newID(), Command: "sh", Args: []string{"-c", `echo run >> "$1"; sleep 0.3`, "sh", runs}}
	starts := make([]sandboxd.StartResult, 3)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			var err error
			if starts[i], err = h.tls.Start(ctx, spec); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	var err error
	if starts[2], err = h.unix.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	created := 0
	for _, s := range starts {
		if s.Created {
			created++
		}
		if s.PID != starts[0].PID || s.PID == 0 || !s.StartedAt.Equal(starts[0].StartedAt) {
			t.Errorf("start results differ: %+v", starts)
		}
	}
	if created != 1 {
		t.Errorf("%d starts created the exec, want 1", created)
	}
	if _, _, err := output(ctx, h.tls, spec.ID, 1); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(runs); err != nil || string(b) != "run\n" {
		t.Errorf("the command ran %q times (%v), want once", b, err)
	}

	other := spec
	other.Args = []string{"-c", "true"}
	if _, err := h.tls.Start(ctx, other); !errors.Is(err, sandboxd.ErrSpecMismatch) {
		t.Errorf("start with the same id and another spec: %v, want ErrSpecMismatch", err)
	}
}

func TestSignal(t *testing.T) {
	h := startServer(t, nil)
	ctx := t.Context()
	id := newID()
	if _, err := h.tls.Start(ctx, sandboxd.Spec{ID: id, Command: "sleep", Args: []string{"30"}}); err != nil {
		t.Fatal(err)
	}
	if err := h.tls.Signal(ctx, id, "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	chunks, exit, err := output(ctx, h.tls, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(result{Signal: strp("SIGTERM")}, summarize(t, chunks, exit)); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
	// The group is gone with its only process.
	if err := h.tls.Signal(ctx, id, "SIGTERM"); !errors.Is(err, sandboxd.ErrExited) {
		t.Errorf("signal after exit: %v, want ErrExited", err)
	}
}
