package execsvc_test

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// daemon is a sandboxd process.
type daemon struct {
	addr   string
	dir    string
	cmd    *exec.Cmd
	exited chan struct{}
}

func startDaemon(t *testing.T, seed []byte) *daemon {
	t.Helper()
	dir := t.TempDir()
	// Unix socket paths are limited to 108 bytes; t.TempDir() holds the test's name.
	sockDir, err := os.MkdirTemp("", "sbd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(sockDir) })
	cmd := exec.Command(sandboxdBin, "serve", "--listen=127.0.0.1:0", "--socket="+filepath.Join(sockDir, "s.sock"),
		"--journal-dir="+filepath.Join(dir, "journal"), "--log-level=info")
	cmd.Dir = dir
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dir, execspec.SeedEnv + "=" + hex.EncodeToString(seed)}
	logs, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &daemon{dir: dir, cmd: cmd, exited: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		defer close(d.exited)
		lines := bufio.NewScanner(logs)
		for lines.Scan() {
			var l struct{ Message, Addr string }
			if json.Unmarshal(lines.Bytes(), &l) == nil && l.Message == "sandboxd serving" {
				addr <- l.Addr
			}
		}
		_ = cmd.Wait()
	}()
	t.Cleanup(d.kill)
	select {
	case d.addr = <-addr:
	case <-time.After(30 * time.Second):
		t.Fatal("sandboxd did not start serving within 30s")
	}
	return d
}

// kill ends the daemon as a pod's deletion past its grace period would.
func (d *daemon) kill() {
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
}
