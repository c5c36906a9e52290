package execsvc_test

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/execclient"
)

func intp(i int) *int { return &i }

func TestCommands(t *testing.T) {
	e := newEnv(t, 1)
	l := e.newLease(newID("co"))
	bin := filepath.Join(l.daemon.dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bin, "hello"), []byte("#!/bin/sh\necho \"hello $WHO\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	workdir := t.TempDir()

	for _, tc := range []struct {
		name       string
		exec       execclient.Exec
		wantStdout string
		wantStderr string
		wantExit   *int
		wantSignal string
	}{
		{name: "true", exec: execclient.Exec{Command: "true"}, wantExit: intp(0)},
		{name: "exit 3", exec: execclient.Exec{Command: "sh", Args: []string{"-c", "exit 3"}}, wantExit: intp(3)},
		{name: "not found", exec: execclient.Exec{Command: "no-such-command"}, wantExit: intp(127), wantStderr: "*"},
		{name: "cwd", exec: execclient.Exec{Command: "pwd", Cwd: workdir}, wantStdout: workdir + "\n", wantExit: intp(0)},
		{name: "env and PATH", exec: execclient.Exec{Command: "hello", Env: map[string]string{"WHO": "kubeclip", "PATH": bin + ":/usr/bin:/bin"}}, wantStdout: "hello kubeclip\n", wantExit: intp(0)},
		{name: "stderr apart", exec: execclient.Exec{Command: "sh", Args: []string{"-c", "echo out; echo err >&2"}}, wantStdout: "out\n", wantStderr: "err\n", wantExit: intp(0)},
		{name: "killed by a signal", exec: execclient.Exec{Command: "sh", Args: []string{"-c", "kill -TERM $$"}}, wantSignal: "SIGTERM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := e.run(l, tc.exec)
			if diff := cmp.Diff(tc.wantExit, res.ExitCode); diff != "" {
				t.Errorf("exit code (-want +got):\n%s", diff)
			}
			if got := deref(res.Signal); got != tc.wantSignal {
				t.Errorf("signal = %q, want %q", got, tc.wantSignal)
			}
			if tc.wantStdout != "" && string(res.Stdout) != tc.wantStdout {
				t.Errorf("stdout = %q, want %q", res.Stdout, tc.wantStdout)
			}
			if tc.wantStderr == "*" && len(res.Stderr) == 0 || tc.wantStderr != "*" && string(res.Stderr) != tc.wantStderr {
				t.Errorf("stderr = %q, want %q", res.Stderr, tc.wantStderr)
			}
			if res.TimedOut {
				t.Error("timedOut set")
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// TestStdinRoundTrip sends 8 MiB through NATS to cat and checks both ways byte for byte.
func TestStdinRoundTrip(t *testing.T) {
	e := newEnv(t, 1)
	l := e.newLease(newID("co"))
	in := make([]byte, 8<<20)
	_, _ = rand.Read(in)
	res := e.run(l, execclient.Exec{Command: "sh", Args: []string{"-c", "tee /dev/stderr | sha256sum"}, Stdin: bytes.NewReader(in), StdinBytes: int64(len(in))})
	want := sha256.Sum256(in)
	if got := strings.Fields(string(res.Stdout)); len(got) == 0 || got[0] != hex.EncodeToString(want[:]) {
		t.Errorf("sha256 in the pod = %q, want %x", res.Stdout, want)
	}
	if got := sha256.Sum256(res.Stderr); got != want || len(res.Stderr) != len(in) {
		t.Errorf("the %d bytes echoed back differ from the %d sent", len(res.Stderr), len(in))
	}
	if res.ExitCode == nil || *res.ExitCode != 0 {
		t.Errorf("exit = %v", res.ExitCode)
	}
}

// TestStdinOfUnknownLength streams stdin whose size the client does not know (a pipe).
func TestStdinOfUnknownLength(t *testing.T) {
	e := newEnv(t, 1)
	l := e.newLease(newID("co"))
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for i := range 1000 {
			fmt.Fprintf(w, "line %d\n", i)
		}
		w.Close()
	}()
	res := e.run(l, execclient.Exec{Command: "wc", Args: []string{"-l"}, Stdin: r})
	r.Close()
	if strings.TrimSpace(string(res.Stdout)) != "1000" {
		t.Errorf("wc -l = %q, want 1000", res.Stdout)
	}
}

// TestStdinClosedEarly: a command that exits before reading all its stdin (head) ends the exec
// at once; the client stops sending when sandboxd answers that stdin is closed.
func TestStdinClosedEarly(t *testing.T) {
	e := newEnv(t, 1)
	l := e.newLease(newID("co"))
	in := bytes.Repeat([]byte("0123456789"), 800<<10) // 8 MB: more than the pipe holds
	start := time.Now()
	res := e.run(l, execclient.Exec{Command: "head", Args: []string{"-c", "10"}, Stdin: bytes.NewReader(in), StdinBytes: int64(len(in)), Timeout: time.Minute})
	if string(res.Stdout) != "0123456789" || res.ExitCode == nil || *res.ExitCode != 0 {
		t.Errorf("stdout %q exit %v", res.Stdout, res.ExitCode)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("took %s", took)
	}
}

// TestLargeOutput checks that 16 MiB of stdout arrive complete and in order.
func TestLargeOutput(t *testing.T) {
	e := newEnv(t, 1)
	l := e.newLease(newID("co"))
	data := make([]byte, 16<<20)
	_, _ = rand.Read(data)
	file := filepath.Join(l.daemon.dir, "big")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	res := e.run(l, execclient.Exec{Command: "cat", Args: []string{file}})
	if len(res.Stdout) != len(data) || !bytes.Equal(res.Stdout, data) || res.Truncated {
		t.Errorf("got %d bytes (truncated %v), want the %d of the file", len(res.Stdout), res.Truncated, len(data))
	}
}

// TestTimeoutKillsTheTree: a command past its timeout is killed with every process it started.
func TestTimeoutKillsTheTree(t *testing.T) {
	e := newEnv(t, 1)
	l := e.newLease(newID("co"))
	pids := filepath.Join(l.daemon.dir, "pids")
	script := fmt.Sprintf("sleep 60 & echo $! > %s; (sleep 60 & echo $! >> %s; wait) & wait", pids, pids)
	start := time.Now()
	res := e.run(l, execclient.Exec{Command: "sh", Args: []string{"-c", script}, Timeout: 500 * time.Millisecond})
	if !res.TimedOut || res.ExitCode != nil {
		t.Errorf("result = timedOut %v exit %v, want timedOut and no exit code", res.TimedOut, res.ExitCode)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("took %s", took)
	}
	data, err := os.ReadFile(pids)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(data)) {
		pid, _ := strconv.Atoi(f)
		eventually(t, "process "+f+" of the tree is gone", func() bool {
			_, err := os.Stat("/proc/" + strconv.Itoa(pid))
			return os.IsNotExist(err)
		})
	}
}

// TestSignal sends SIGTERM to a running command through the service.
func TestSignal(t *testing.T) {
	e := newEnv(t, 1)
	l := e.newLease(newID("co"))
	id := newID("x")
	done := make(chan execclient.Result, 1)
	go func() { done <- e.run(l, execclient.Exec{ID: id, Command: "sleep", Args: []string{"30"}}) }()
	e.serving()
	got, err := e.client.Signal(t.Context(), l.Lease, id, "SIGTERM")
	if err != nil || !got.Delivered {
		t.Fatalf("signal = %+v, %v", got, err)
	}
	res := <-done
	if deref(res.Signal) != "SIGTERM" || res.ExitCode != nil {
		t.Errorf("result = signal %v exit %v, want SIGTERM", res.Signal, res.ExitCode)
	}
	got, err = e.client.Signal(t.Context(), l.Lease, id, "SIGTERM")
	if err != nil || got.Delivered || got.Code == "" {
		t.Errorf("signal after exit = %+v, %v; want not delivered with a code", got, err)
	}
}

// TestConcurrentExecsOnOneLease runs 16 commands at once on one lease.
func TestConcurrentExecsOnOneLease(t *testing.T) {
	e := newEnv(t, 2)
	l := e.newLease(newID("co"))
	const n = 16
	var wg sync.WaitGroup
	results := make([]execclient.Result, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			results[i], errs[i] = e.try(l, execclient.Exec{
				Command: "sh", Args: []string{"-c", `sleep 0.5; echo "$0"; head -c 100000 /dev/zero | tr '\0' x`, strconv.Itoa(i)},
			})
		})
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Errorf("exec %d: %v", i, errs[i])
			continue
		}
		want := strconv.Itoa(i) + "\n" + strings.Repeat("x", 100000)
		if string(results[i].Stdout) != want || results[i].ExitCode == nil || *results[i].ExitCode != 0 {
			t.Errorf("exec %d: %d bytes, exit %v", i, len(results[i].Stdout), results[i].ExitCode)
		}
	}
}
