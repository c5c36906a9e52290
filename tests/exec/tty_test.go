package exec

import (
	"fmt"
	"math/rand/v2"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
)

// tmux drives a terminal the test reads like a user: a tmux server of its own (its socket in a
// temporary directory, no user configuration), one window.
type tmux struct {
	t      *testing.T
	socket string
}

func newTmux(t *testing.T) *tmux {
	t.Helper()
	if _, err := osexec.LookPath("tmux"); err != nil {
		t.Fatal("tmux is not installed: apt-get install tmux (hack/cluster/cluster.sh up installs it)")
	}
	// A unix socket path is at most 108 bytes; t.TempDir() holds the test's name.
	dir, err := os.MkdirTemp("", "kctmux")
	if err != nil {
		t.Fatal(err)
	}
	tm := &tmux{t: t, socket: filepath.Join(dir, "sock")}
	t.Cleanup(func() {
		_ = osexec.Command("tmux", "-S", tm.socket, "kill-server").Run()
		_ = os.RemoveAll(dir)
	})
	return tm
}

// run runs a tmux command and returns its output.
func (tm *tmux) run(args ...string) string {
	tm.t.Helper()
	out, err := osexec.Command("tmux", append([]string{"-S", tm.socket, "-f", "/dev/null"}, args...)...).CombinedOutput()
	if err != nil {
		tm.t.Fatalf("tmux %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// screen is the window's visible text, each line without its trailing spaces.
func (tm *tmux) screen() string { return tm.run("capture-pane", "-p", "-t", "kc") }

// shows waits until the screen holds want.
func (tm *tmux) shows(want string) {
	tm.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(tm.screen(), want) {
		if time.Now().After(deadline) {
			tm.t.Fatalf("the terminal never showed %q; it shows:\n%s", want, tm.screen())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// typeLine types s and Enter.
func (tm *tmux) typeLine(s string) { tm.run("send-keys", "-t", "kc", "-l", s+"\r") }

// TestCLITerminal runs an interactive shell in a pod lease with `kubeclip exec -t` in a tmux
// window of 80x24: typed lines run in the pod and their output shows, `stty size` is the
// window's, resizing the window resizes the pod's terminal (SIGWINCH reaches the shell's
// foreground job), TERM is the window's, and when the shell exits kubeclip exits with its status
// and the terminal is as it was before (out of raw mode). kubeclip exec -t from no terminal is
// refused.
func TestCLITerminal(t *testing.T) {
	execWorkers(t, execsvc.RouteDaemon, 1)
	l := acquire(t)
	kubeclip := filepath.Join(env.Bin, pt.CLI)

	_, errOut, code := cli(t, "", "exec", l.RunID, "--company", l.CompanyID, "-t", "--", "sh")
	if code != 2 || !strings.Contains(errOut, "-t: stdin is not a terminal") {
		t.Errorf("exec -t from a pipe: exit %d, stderr %q; want 2 saying stdin is not a terminal", code, errOut)
	}

	tm := newTmux(t)
	// The window's shell records the terminal's settings, runs kubeclip, and reports its exit
	// status and whether the settings are back.
	script := fmt.Sprintf(`before=$(stty -g); KUBECLIP_NATS_URL=%s %s exec %s --company %s -t -e 'PS1=kc> ' -- sh; status=$?; `+
		`[ "$(stty -g)" = "$before" ] && state=restored || state=raw; echo "kubeclip-exit=$status $state"; sleep 600`,
		env.NATS.URL(), kubeclip, l.RunID, l.CompanyID)
	tm.run("new-session", "-d", "-s", "kc", "-x", "80", "-y", "24", "sh", "-c", script)
	tm.shows("kc>") // capture-pane drops the space that ends the line

	// The terminal echoes what is typed: the quotes keep a marker out of the echo.
	n := rand.IntN(1 << 30)
	tm.typeLine(fmt.Sprintf(`echo hi-""%d; stty size; echo "term=$TERM"`, n))
	tm.shows(fmt.Sprintf("hi-%d", n))
	tm.shows("24 80")
	tm.shows("term=" + strings.TrimSpace(tm.run("show-options", "-gv", "default-terminal")))

	tm.typeLine(`sh -c 'trap "stty size; exit" WINCH; echo wait""ing; while :; do sleep 0.1; done'`)
	tm.shows("waiting")
	tm.run("resize-window", "-t", "kc", "-x", "100", "-y", "30")
	tm.shows("30 100")

	tm.typeLine("exit 3")
	tm.shows("kubeclip-exit=3 restored")
}
