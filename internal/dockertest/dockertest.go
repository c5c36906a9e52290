// Package dockertest gives tests a Docker engine with kubeclip's production images loaded into
// it: the engine hack/docker/docker.sh runs (it installs Debian's docker.io when missing and
// starts a private dockerd, since there is no systemd) and the FROM-scratch images
// hack/images/images.sh builds from this checkout. No registry is reachable where the tests run,
// so nothing is ever pulled.
//
// It never skips: when no engine can be brought up it returns an error (or fails the test) that
// says how to get one.
//
// go test runs test packages in parallel, so several test processes may use the engine at once.
// Each holds a shared lock on a file next to the engine's state while it does, and the last one
// to let go stops the engine, but only if a test started it.
package dockertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/internal/clustertest"
)

const (
	// UID is the user every kubeclip image runs as (distroless' "nonroot"; hack/images/images.sh).
	UID = 65532
	// User is the images' configured user, as Docker reports it.
	User = "65532:65532"
	// PublishedHost is where a test reaches a container's published ports: the engine is the
	// one on this machine's /var/run/docker.sock, and Docker publishes on every address.
	PublishedHost = "127.0.0.1"
)

// Image returns the reference of one of kubeclip's images ("nats", "run-watcher", ...) as
// hack/images/images.sh tags it.
func Image(name string) string {
	repo := envOr("KUBECLIP_IMAGE_REPO", "kubeclip.local")
	tag := envOr("KUBECLIP_IMAGE_TAG", "dev")
	return repo + "/" + name + ":" + tag
}

// Engine is the Docker engine this process uses, from Up until Release.
type Engine struct {
	root  string   // the repository checkout
	state string   // hack/docker/docker.sh's state directory
	users *os.File // holds the shared lock
}

// Up makes sure a Docker engine answers on /var/run/docker.sock (starting one with
// hack/docker/docker.sh up when none does) and loads kubeclip's images into it (hack/images/images.sh
// load). Call Release when done.
func Up(ctx context.Context) (*Engine, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	e := &Engine{root: root, state: envOr("KUBECLIP_DOCKER_DIR", "/var/lib/kubeclip/docker")}
	if err := os.MkdirAll(e.state, 0o755); err != nil {
		return nil, fmt.Errorf("creating the Docker state directory: %w (run the tests as root)", err)
	}
	// Shared while in use; blocks while the last user of a previous round stops the engine.
	e.users, err = os.OpenFile(e.usersLock(), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening the Docker users lock: %w", err)
	}
	if err := syscall.Flock(int(e.users.Fd()), syscall.LOCK_SH); err != nil {
		e.users.Close()
		return nil, fmt.Errorf("locking %s: %w", e.usersLock(), err)
	}
	if err := e.start(ctx); err != nil {
		_ = e.Release(context.WithoutCancel(ctx))
		return nil, err
	}
	return e, nil
}

func (e *Engine) start(ctx context.Context) error {
	script := filepath.Join(e.root, "hack/docker/docker.sh")
	status, err := e.script(ctx, script, "status")
	if err != nil {
		return err
	}
	if _, err := e.script(ctx, script, "up"); err != nil {
		return fmt.Errorf("%w\nhack/docker/docker.sh installs Debian's docker.io and starts dockerd; it needs root (or start a Docker engine on /var/run/docker.sock yourself)", err)
	}
	if strings.HasPrefix(status, "no Docker engine") {
		// Ours to stop when the last test process lets go (an engine that was already there is not).
		if err := os.WriteFile(e.startedMark(), nil, 0o644); err != nil {
			return fmt.Errorf("marking the Docker engine as started by the tests: %w", err)
		}
	}
	_, err = e.script(ctx, filepath.Join(e.root, "hack/images/images.sh"), "load")
	return err
}

// Release lets go of the engine and stops it if this was its last user and a test started it.
// Pass a context that is still live: a test's own has ended by the time its cleanups run.
func (e *Engine) Release(ctx context.Context) error {
	// Dropping the shared lock and asking for the exclusive one leaves a gap another process may
	// enter; then the exclusive lock fails and that process is the last user instead.
	e.users.Close()
	f, err := os.OpenFile(e.usersLock(), os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("opening the Docker users lock: %w", err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); errors.Is(err, syscall.EWOULDBLOCK) {
		return nil // another test process still uses the engine
	} else if err != nil {
		return fmt.Errorf("locking %s: %w", e.usersLock(), err)
	}
	if _, err := os.Stat(e.startedMark()); err != nil {
		return nil // not started by a test: leave it running
	}
	// docker.sh down waits up to 30s for dockerd to stop, then kills it.
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if _, err := e.script(ctx, filepath.Join(e.root, "hack/docker/docker.sh"), "down"); err != nil {
		return err
	}
	return os.Remove(e.startedMark())
}

// Start is Up for one test: it fails t when the engine cannot be brought up and releases it
// when t ends.
func Start(t testing.TB) {
	t.Helper()
	e, err := Up(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Release(context.WithoutCancel(t.Context())); err != nil {
			t.Errorf("releasing the Docker engine: %v", err)
		}
	})
}

// Kubeconfig copies the test cluster's kubeconfig (clustertest.Kubeconfig) to a file the images'
// user can read, for a read-only bind mount into a container. The local cluster's admin
// kubeconfig names the API server by the node's address, which containers reach.
func Kubeconfig(t testing.TB) string {
	t.Helper()
	data, err := os.ReadFile(clustertest.Kubeconfig())
	if err != nil {
		t.Fatalf("reading the cluster's kubeconfig: %v", err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, data, 0o400); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, UID, UID); err != nil {
		t.Fatalf("handing the kubeconfig to uid %d: %v", UID, err)
	}
	return path
}

func (e *Engine) usersLock() string   { return filepath.Join(e.state, "test-users.lock") }
func (e *Engine) startedMark() string { return filepath.Join(e.state, "started-by-tests") }

// script runs one of the repository's scripts and returns its standard output.
func (e *Engine) script(ctx context.Context, path string, arg string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", path, arg)
	cmd.Dir = e.root
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		rel, _ := filepath.Rel(e.root, path)
		return "", fmt.Errorf("%s %s: %w\n%s%s", rel, arg, err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// repoRoot is the directory of go.mod above the working directory (a test's package directory).
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "hack/docker/docker.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("dockertest: no kubeclip checkout (hack/docker/docker.sh) above the working directory")
		}
		dir = parent
	}
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
