package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/internal/cli"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// binary is sandboxd built the way the images build it (static), in TestMain.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sandboxd-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// Readable by the unprivileged user TestServe runs the daemon as.
	if err := os.Chmod(dir, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "sandboxd")
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", binary, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building sandboxd: %v\n%s", err, out)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func env(kv map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := kv[k]; return v, ok }
}

var testSeed = execspec.DeriveSeed([]byte("master"), "tenant", "run")

// TestServeSettings pins serve's defaults (the paths the pod layout relies on) and its checks.
func TestServeSettings(t *testing.T) {
	seedHex := hex.EncodeToString(testSeed)
	for _, tc := range []struct {
		name     string
		args     []string
		env      map[string]string
		want     serveSettings
		wantCode int
		wantErr  string
	}{
		{"defaults", nil, map[string]string{execspec.SeedEnv: seedHex}, serveSettings{
			Listen: ":7070", Socket: "/kubeclip/run/sandboxd.sock", JournalDir: "/kubeclip/run/journal",
			MaxOutputBytes: 256 << 20, OutputBytesLimit: 1280 << 20, JournalDiskBytes: 1536 << 20, JournalTTL: 10 * time.Minute, LogLevel: "info", Seed: testSeed,
		}, 0, ""},
		{"socket only needs no seed", []string{"--listen="}, nil, serveSettings{
			Socket: "/kubeclip/run/sandboxd.sock", JournalDir: "/kubeclip/run/journal",
			MaxOutputBytes: 256 << 20, OutputBytesLimit: 1280 << 20, JournalDiskBytes: 1536 << 20, JournalTTL: 10 * time.Minute, LogLevel: "info",
		}, 0, ""},
		{"environment", nil, map[string]string{execspec.SeedEnv: seedHex, "KUBECLIP_SANDBOXD_JOURNAL_TTL": "30s", "KUBECLIP_SANDBOXD_LISTEN": ":9000"}, serveSettings{
			Listen: ":9000", Socket: "/kubeclip/run/sandboxd.sock", JournalDir: "/kubeclip/run/journal",
			MaxOutputBytes: 256 << 20, OutputBytesLimit: 1280 << 20, JournalDiskBytes: 1536 << 20, JournalTTL: 30 * time.Second, LogLevel: "info", Seed: testSeed,
		}, 0, ""},
		{"unbound", []string{"--unbound"}, map[string]string{execspec.SeedEnv: seedHex}, serveSettings{
			Listen: ":7070", Socket: "/kubeclip/run/sandboxd.sock", JournalDir: "/kubeclip/run/journal",
			MaxOutputBytes: 256 << 20, OutputBytesLimit: 1280 << 20, JournalDiskBytes: 1536 << 20, JournalTTL: 10 * time.Minute, LogLevel: "info", Seed: testSeed, Unbound: true,
		}, 0, ""},
		{"unbound from the environment", nil, map[string]string{execspec.SeedEnv: seedHex, "KUBECLIP_SANDBOXD_UNBOUND": "true"}, serveSettings{
			Listen: ":7070", Socket: "/kubeclip/run/sandboxd.sock", JournalDir: "/kubeclip/run/journal",
			MaxOutputBytes: 256 << 20, OutputBytesLimit: 1280 << 20, JournalDiskBytes: 1536 << 20, JournalTTL: 10 * time.Minute, LogLevel: "info", Seed: testSeed, Unbound: true,
		}, 0, ""},
		{"unbound without the TLS listener", []string{"--unbound", "--listen="}, nil, serveSettings{}, 2, "--unbound (KUBECLIP_SANDBOXD_UNBOUND) needs --listen (KUBECLIP_SANDBOXD_LISTEN)"},
		{"unbound not a boolean", nil, map[string]string{execspec.SeedEnv: seedHex, "KUBECLIP_SANDBOXD_UNBOUND": "maybe"}, serveSettings{}, 2, "KUBECLIP_SANDBOXD_UNBOUND"},
		{"no seed", nil, nil, serveSettings{}, 2, "KUBECLIP_SANDBOXD_SEED is not set"},
		{"bad seed", nil, map[string]string{execspec.SeedEnv: "abc"}, serveSettings{}, 2, "KUBECLIP_SANDBOXD_SEED"},
		{"nothing to serve on", []string{"--listen=", "--socket="}, nil, serveSettings{}, 2, "nothing to serve on"},
		{"cap too small", []string{"--listen=", "--max-output-bytes=10"}, nil, serveSettings{}, 2, "--max-output-bytes (KUBECLIP_SANDBOXD_MAX_OUTPUT_BYTES) must be >= 1024"},
		{"limit below the cap", []string{"--listen=", "--output-bytes-limit=1048576"}, nil, serveSettings{}, 2, "--output-bytes-limit (KUBECLIP_SANDBOXD_OUTPUT_BYTES_LIMIT) must be >= --max-output-bytes"},
		{"journal disk", []string{"--listen=", "--journal-disk-bytes=1000"}, nil, serveSettings{}, 2, "--journal-disk-bytes (KUBECLIP_SANDBOXD_JOURNAL_DISK_BYTES) must be >= 1 MiB"},
		{"ttl", []string{"--listen=", "--journal-ttl=0s"}, nil, serveSettings{}, 2, "--journal-ttl"},
		{"log level", []string{"--listen=", "--log-level=loud"}, nil, serveSettings{}, 2, "--log-level"},
		{"unknown flag", []string{"--shell"}, nil, serveSettings{}, 2, "flag provided but not defined"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseServe(tc.args, env(tc.env), io.Discard)
			if code := cli.ExitCode(err); code != tc.wantCode || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("error %v (exit %d), want exit %d with %q", err, code, tc.wantCode, tc.wantErr)
			}
			if err == nil {
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("settings (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want int
	}{
		{"no command", nil, 2},
		{"unknown command", []string{"shell"}, 2},
		{"help", []string{"--help"}, 0},
		{"serve help", []string{"serve", "--help"}, 0},
		{"install without dst", []string{"install"}, 2},
		{"install with a flag", []string{"install", "--force"}, 2},
		{"install with a flag after dst", []string{"install", "/tmp/x", "--seed"}, 2},
		{"install with three paths", []string{"install", "/tmp/a", "/tmp/b", "/tmp/c"}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := run(t.Context(), tc.args, env(nil), io.Discard, io.Discard)
			if got := cli.ExitCode(err); got != tc.want {
				t.Errorf("exit %d (%v), want %d", got, err, tc.want)
			}
		})
	}
}

// TestInstall copies the executable, creating the directories, with mode 0755: in-process (the
// test binary is the executable) and as the init container runs it.
func TestInstall(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		src  string
		run  func(dst string) error
	}{
		{"in process", self, func(dst string) error {
			return run(t.Context(), []string{"install", dst}, env(nil), io.Discard, io.Discard)
		}},
		{"built binary", binary, func(dst string) error {
			out, err := exec.Command(binary, "install", dst).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%w: %s", err, out)
			}
			return nil
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "kubeclip", "bin", "sandboxd")
			for range 2 { // over an existing copy too
				if err := tc.run(dst); err != nil {
					t.Fatal(err)
				}
			}
			want, _ := os.ReadFile(tc.src)
			got, err := os.ReadFile(dst)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("%s is not a copy of %s (%v)", dst, tc.src, err)
			}
			if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o755 {
				t.Errorf("mode %v, want 0755", fi.Mode().Perm())
			}
			if entries, _ := os.ReadDir(filepath.Dir(dst)); len(entries) != 1 {
				t.Errorf("%d files beside the copy, want none (temporary files left?)", len(entries)-1)
			}
		})
	}
}

// TestDependencies: sandboxd goes into every exec-capable pod; it must not link the NATS server
// or client, nor client-go.
func TestDependencies(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{"github.com/nats-io/", "k8s.io/", "github.com/prometheus/"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("sandboxd depends on %s", dep)
			}
		}
	}
}

// TestServe runs the built binary as an unprivileged user, as in a pod: commands run through TLS
// and through `sandboxd proxy`, never see the seed (neither in their environment nor in the
// daemon's /proc entry), and SIGTERM stops an idle daemon with status 0.
func TestServe(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 { // root has CAP_SYS_PTRACE and would read any /proc entry
		cred = &syscall.Credential{Uid: 65532, Gid: 65532}
		if err := os.Chown(dir, 65532, 65532); err != nil {
			t.Fatal(err)
		}
	}
	socket := filepath.Join(dir, "run", "sandboxd.sock")
	daemon := exec.Command(binary, "serve", "--listen=127.0.0.1:0", "--socket="+socket, "--journal-dir="+filepath.Join(dir, "journal"), "--log-level=debug")
	daemon.Env = []string{"PATH=/usr/bin:/bin", execspec.SeedEnv + "=" + hex.EncodeToString(testSeed)}
	daemon.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	logs, err := daemon.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = daemon.Process.Kill(); _ = daemon.Wait() })
	addr, logDone := serving(t, logs)

	tlsClient, err := sandboxd.NewClient(sandboxd.ClientOptions{Dial: sandboxd.DialTCP(addr), TLS: sandboxd.ClientTLSConfig(testSeed), Token: sandboxd.ClientToken(testSeed)})
	if err != nil {
		t.Fatal(err)
	}
	defer tlsClient.Close()
	var proxies []*exec.Cmd
	proxyClient, err := sandboxd.NewClient(sandboxd.ClientOptions{Dial: func(ctx context.Context) (net.Conn, error) {
		p := exec.Command(binary, "proxy", "--socket="+socket)
		p.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		proxies = append(proxies, p)
		return startPipeConn(p)
	}})
	if err != nil {
		t.Fatal(err)
	}

	// The seed in /proc/<daemon>/environ: unset in the daemon's environment, but the kernel keeps
	// the original block; only a non-dumpable daemon hides it from its own user.
	script := `printf '%s|' "${KUBECLIP_SANDBOXD_SEED-unset}"; if cat /proc/$PPID/environ >/dev/null 2>&1; then echo readable; else echo hidden; fi`
	for name, c := range map[string]*sandboxd.Client{"tls": tlsClient, "proxy": proxyClient} {
		t.Run(name, func(t *testing.T) {
			stdout, exit := collect(t, c, sandboxd.Spec{ID: "seed-" + name, Command: "sh", Args: []string{"-c", script}})
			if stdout != "unset|hidden\n" || exit.ExitCode == nil || *exit.ExitCode != 0 {
				t.Errorf("stdout %q, exit %+v; want the seed unset and the daemon's environ hidden", stdout, exit)
			}
		})
	}
	proxyClient.Close() // ends each proxy: stdin closes, the daemon closes the connection
	for _, p := range proxies {
		if err := p.Wait(); err != nil {
			t.Errorf("proxy: %v", err)
		}
	}

	if err := daemon.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	<-logDone
	if err := daemon.Wait(); err != nil {
		t.Errorf("sandboxd after SIGTERM: %v, want exit status 0", err)
	}
}

// serving reads the daemon's JSON logs until it serves and returns its TCP address; the rest of
// the log is drained (and shown with -v) until done closes.
func serving(t *testing.T, logs io.Reader) (string, <-chan struct{}) {
	t.Helper()
	lines := bufio.NewScanner(logs)
	addr := make(chan string, 1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for lines.Scan() {
			t.Log(lines.Text())
			var l struct{ Message, Addr string }
			if json.Unmarshal(lines.Bytes(), &l) == nil && l.Message == "sandboxd serving" {
				addr <- l.Addr
			}
		}
	}()
	select {
	case a := <-addr:
		return a, done
	case <-done:
		t.Fatal("sandboxd exited before serving")
	case <-time.After(30 * time.Second):
		t.Fatal("sandboxd did not start serving within 30s")
	}
	return "", nil
}

func collect(t *testing.T, c *sandboxd.Client, spec sandboxd.Spec) (string, *execspec.Exit) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := c.Start(ctx, spec); err != nil {
		t.Fatal(err)
	}
	s, err := c.Output(ctx, spec.ID, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var stdout strings.Builder
	for {
		f, err := s.Next()
		if err != nil {
			t.Fatal(err)
		}
		switch f := f.(type) {
		case *sandboxd.Chunk:
			if f.Stream == sandboxd.Stdout {
				stdout.Write(f.Data)
			}
		case *execspec.Exit:
			return stdout.String(), f
		}
	}
}

// pipeConn is a net.Conn over a child's stdin and stdout, as a Kubernetes exec stream is.
type pipeConn struct {
	io.Reader
	w io.WriteCloser
}

func startPipeConn(p *exec.Cmd) (net.Conn, error) {
	in, err := p.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := p.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := p.Start(); err != nil {
		return nil, err
	}
	return &pipeConn{Reader: out, w: in}, nil
}

func (c *pipeConn) Write(b []byte) (int, error)      { return c.w.Write(b) }
func (c *pipeConn) Close() error                     { return c.w.Close() }
func (c *pipeConn) LocalAddr() net.Addr              { return pipeAddr{} }
func (c *pipeConn) RemoteAddr() net.Addr             { return pipeAddr{} }
func (c *pipeConn) SetDeadline(time.Time) error      { return errors.ErrUnsupported }
func (c *pipeConn) SetReadDeadline(time.Time) error  { return errors.ErrUnsupported }
func (c *pipeConn) SetWriteDeadline(time.Time) error { return errors.ErrUnsupported }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "sandboxd proxy" }

// TestSeedFile runs the built binary as an exec-capable pod does: the init container's `sandboxd
// install <dst> <seed-file>` writes the seed from its environment to a file only its user reads,
// then `sandboxd serve --seed-file` (no seed in its environment) reads it, removes it and serves
// TLS with that seed. Without the seed, install fails and writes nothing.
func TestSeedFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		cred = &syscall.Credential{Uid: 65532, Gid: 65532}
		if err := os.Chown(dir, 65532, 65532); err != nil {
			t.Fatal(err)
		}
	}
	seedFile := filepath.Join(dir, "seed")
	install := func(env ...string) ([]byte, error) {
		c := exec.Command(binary, "install", filepath.Join(dir, "bin", "sandboxd"), seedFile)
		c.Env, c.SysProcAttr = env, &syscall.SysProcAttr{Credential: cred}
		return c.CombinedOutput()
	}
	if out, err := install(); err == nil || !strings.Contains(string(out), execspec.SeedEnv) {
		t.Errorf("install without the seed: %v, %s; want an error naming %s", err, out, execspec.SeedEnv)
	}
	if _, err := os.Stat(seedFile); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the seed file after a failed install: %v, want none", err)
	}
	if out, err := install(execspec.SeedEnv + "=" + hex.EncodeToString(testSeed)); err != nil {
		t.Fatalf("install: %v: %s", err, out)
	}
	fi, err := os.Stat(seedFile)
	if err != nil || fi.Mode().Perm() != 0o400 {
		t.Fatalf("the seed file: %v, %v; want mode 0400", fi, err)
	}

	daemon := exec.Command(binary, "serve", "--listen=127.0.0.1:0", "--socket="+filepath.Join(dir, "sandboxd.sock"),
		"--journal-dir="+filepath.Join(dir, "journal"), "--seed-file="+seedFile)
	daemon.Env = []string{"PATH=/usr/bin:/bin"}
	daemon.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	logs, err := daemon.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = daemon.Process.Kill(); _ = daemon.Wait() })
	addr, _ := serving(t, logs)
	if _, err := os.Stat(seedFile); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the seed file once sandboxd serves: %v, want removed", err)
	}
	c, err := sandboxd.NewClient(sandboxd.ClientOptions{Dial: sandboxd.DialTCP(addr), TLS: sandboxd.ClientTLSConfig(testSeed), Token: sandboxd.ClientToken(testSeed)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if stdout, exit := collect(t, c, sandboxd.Spec{ID: "seed-file", Command: "sh", Args: []string{"-c", "echo served"}}); stdout != "served\n" || exit.ExitCode == nil || *exit.ExitCode != 0 {
		t.Errorf("a command over TLS keyed by the file's seed: %q, %+v", stdout, exit)
	}
}

// TestServeUnbound runs the built binary as a warm pod's daemon: `serve --unbound` keyed by the
// pod's bind seed refuses every call on the socket, and serves a command over TLS keyed by the
// lease's seed once sandboxd.Bind installed it, with the bind's environment.
func TestServeUnbound(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		cred = &syscall.Credential{Uid: 65532, Gid: 65532}
		if err := os.Chown(dir, 65532, 65532); err != nil {
			t.Fatal(err)
		}
	}
	master := []byte("master")
	bindSeed := execspec.DeriveBindSeed(master, "tenant", "warm-1")
	socket := filepath.Join(dir, "sandboxd.sock")
	daemon := exec.Command(binary, "serve", "--unbound", "--listen=127.0.0.1:0", "--socket="+socket, "--journal-dir="+filepath.Join(dir, "journal"))
	daemon.Env = []string{"PATH=/usr/bin:/bin", execspec.SeedEnv + "=" + hex.EncodeToString(bindSeed)}
	daemon.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	logs, err := daemon.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = daemon.Process.Kill(); _ = daemon.Wait() })
	addr, _ := serving(t, logs)

	local, err := sandboxd.NewClient(sandboxd.ClientOptions{Dial: sandboxd.DialUnix(socket)})
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	if _, err := local.Start(t.Context(), sandboxd.Spec{ID: "early", Command: "true"}); !errors.Is(err, sandboxd.ErrNotBound) {
		t.Fatalf("a start on the socket before bind: %v, want ErrNotBound", err)
	}
	if err := sandboxd.Bind(t.Context(), sandboxd.DialTCP(addr), bindSeed, testSeed, map[string]string{"WARM": "bound"}); err != nil {
		t.Fatalf("Bind: %v", err)
	}
	c, err := sandboxd.NewClient(sandboxd.ClientOptions{Dial: sandboxd.DialTCP(addr), TLS: sandboxd.ClientTLSConfig(testSeed), Token: sandboxd.ClientToken(testSeed)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	script := `echo "$WARM ${KUBECLIP_SANDBOXD_SEED-unset}"`
	if stdout, exit := collect(t, c, sandboxd.Spec{ID: "bound", Command: "sh", Args: []string{"-c", script}}); stdout != "bound unset\n" || exit.ExitCode == nil || *exit.ExitCode != 0 {
		t.Errorf("a command over TLS keyed by the lease's seed: %q, %+v; want the bind's env and no seed", stdout, exit)
	}
}
