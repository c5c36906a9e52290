package exec

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// TestCLILease follows a reusable pod lease through the CLI: acquired with --reuse-lease,
// released (kept: `lease show` says retained), resumed at once, released again, suspended once
// the dispatcher's idle window is over (pod gone, claim kept), resumed on a new pod that finds
// the files on its volume, refused for another company's run (exit 1, the code and field), and
// destroyed (pod and claim gone). The claude stub run with --resume on the new pod continues the
// session the first pod started, found under $HOME.
func TestCLILease(t *testing.T) {
	execWorkers(t, execsvc.RouteDaemon, 1)
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	ns := pt.NamespaceOf(t, company)
	cfg := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(cfg, podConfig(), 0o600); err != nil {
		t.Fatal(err)
	}
	ok := func(args ...string) string {
		t.Helper()
		out, errOut, code := cli(t, "", args...)
		if code != 0 {
			t.Fatalf("kubeclip %s: exit %d, stdout %q, stderr %q", strings.Join(args, " "), code, out, errOut)
		}
		return out
	}
	has := func(what, out string, want ...string) {
		t.Helper()
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("%s: %q missing in\n%s", what, w, out)
			}
		}
	}

	out := ok("acquire", "--company", company, "--agent", pt.NewID("agent"), "--config", cfg, "--reuse-lease")
	m := regexp.MustCompile(`run (\S+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("acquire printed no run id: %q", out)
	}
	runID := m[1]
	r := collect(t, company, runID)
	name := pt.WaitKind[events.RunCreatedEvent](r, runTimeout).ProviderLeaseID
	(&lease{run: r}).waitReady(t)
	claim := policy.LeaseClaimName(name)
	show := func() string { return ok("lease", "show", "--company", company, "--run", runID) }
	podUID := func() types.UID {
		t.Helper()
		pod, err := cs.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the lease's pod: %v", err)
		}
		return pod.UID
	}
	gone := func(what string, get func() error) {
		t.Helper()
		pt.Eventually(t, 2*time.Minute, what+" deleted", func() bool { return apierrors.IsNotFound(get()) })
	}
	getPod := func() error { _, err := cs.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{}); return err }
	getClaim := func() error {
		_, err := cs.CoreV1().PersistentVolumeClaims(ns).Get(t.Context(), claim, metav1.GetOptions{})
		return err
	}

	ok("exec", runID, "--company", company, "--", "sh", "-c", `echo workspace > /workspace/kept && echo home > "$HOME/kept"`)
	// The claude stub keeps its session under $HOME, as Claude Code keeps its own in ~/.claude.
	claude := func(runLabel string, resume ...string) (session, note string) {
		t.Helper()
		args := append([]string{"exec", runID, "--company", company, "--cwd", "/workspace",
			"-e", "KUBECLIP_STUB_STATE=1", "-e", "CLAUDE_STUB_INTERVAL=0", "-e", "PAPERCLIP_RUN_ID=" + runLabel,
			"--", "claude", "--print", "--output-format", "stream-json", "--verbose"}, resume...)
		out, errOut, code := cli(t, "", append(args, "say hello")...)
		id := regexp.MustCompile(`"session_id":"([0-9a-f-]{36})"`).FindStringSubmatch(out)
		line := regexp.MustCompile(`claude-stub: (?:new|resumed|session) .*`).FindString(errOut)
		if code != 0 || id == nil || line == "" {
			t.Fatalf("claude %v: exit %d, stdout %q, stderr %q", resume, code, out, errOut)
		}
		return id[1], line
	}
	firstSession, note := claude("run-a")
	if want := "claude-stub: new session " + firstSession; !strings.HasPrefix(note, want) {
		t.Errorf("the first claude run said %q, want %q…", note, want)
	}
	first := podUID()
	has("show of the created lease", show(), "lease       "+name, "state       created", "reusable    yes", "backend     pod, namespace "+ns,
		"volume      "+claim, "generation  0 (resumes 0)")

	// A release keeps the lease and its pod; a resume takes it back at once.
	has("release", ok("release", "--company", company, "--run", runID, "--cancel=false", "--wait"), "[released] lease "+name+" stopped")
	has("show of the retained lease", show(), "state       retained", "retained    ", "[released] lease "+name+" stopped")
	has("resume of the retained lease", ok("lease", "resume", "--company", company, "--run", runID),
		"[resumed] lease "+name+" from retained: generation 0, resume 1")
	if podUID() != first {
		t.Error("a resume of the retained lease made a new pod")
	}
	has("show of the resumed lease", show(), "state       created", "generation  0 (resumes 1)")

	// The second release (its own releaseId: not dropped as the first's repeat), then the idle
	// window: suspended, pod gone, claim kept.
	has("second release", ok("release", "--company", company, "--run", runID, "--cancel=false", "--wait"), "[released] lease "+name+" stopped")
	pt.WaitKind[events.RunSuspendedEvent](r, leaseIdleWindow+2*time.Minute)
	has("show of the suspended lease", show(), "state       suspended", "suspended   ",
		"[suspended] lease "+name+": pod of generation 0 deleted, volume "+claim+" kept")
	gone("the suspended lease's pod", getPod)
	if err := getClaim(); err != nil {
		t.Fatalf("the suspended lease's claim: %v", err)
	}

	// A resume makes a new pod on the same volume.
	has("resume of the suspended lease", ok("lease", "resume", "--company", company, "--run", runID, "--lease", name),
		"[resumed] lease "+name+" from suspended: generation 1, resume 2")
	second := podUID()
	if second == first {
		t.Error("the suspended lease was resumed on its old pod")
	}
	has("show of the lease resumed from suspended", show(), "state       created", "generation  1 (resumes 2)")
	if got := ok("exec", runID, "--company", company, "--", "sh", "-c", `cat /workspace/kept "$HOME/kept"`); got != "workspace\nhome\n" {
		t.Errorf("the resumed pod's files: %q, want what the first pod wrote", got)
	}
	// On the new pod, claude --resume finds the first pod's session in $HOME and continues it.
	// (Paperclip's claude_local adapter does not ask for it on a resumed lease: a host rule,
	// docs/reuse.md, The host's rules; tests/paperclip pins the host's refusal.)
	resumedSession, note := claude("run-b", "--resume", firstSession)
	if want := "claude-stub: resumed session " + firstSession + " from $HOME (1 earlier runs); other sessions in $HOME: []; workspace runs before: [run-a]; home runs before: [run-a]"; resumedSession != firstSession || note != want {
		t.Errorf("claude --resume on the resumed lease's new pod: session %s, said %q; want session %s, %q", resumedSession, note, firstSession, want)
	}

	// Another company cannot resume this company's run.
	other := pt.NewID("co")
	out, errOut, code := cli(t, "", "lease", "resume", "--company", other, "--run", runID, "--lease", name)
	if code != 1 || !strings.Contains(errOut, "resume of run "+runID+" refused: lease_not_found (field runId)") || !regexp.MustCompile(`\[failed\] +lease_not_found field=runId`).MatchString(out) {
		t.Errorf("another company's resume: exit %d, stdout %q, stderr %q; want 1 and lease_not_found (field runId)", code, out, errOut)
	}
	if podUID() != second {
		t.Error("the refused resume changed the pod")
	}

	// Destroy removes pod and claim; a second destroy finds it done.
	has("destroy", ok("lease", "destroy", "--company", company, "--run", runID), "[released] lease "+name+" destroyed")
	gone("the destroyed lease's pod", getPod)
	gone("the destroyed lease's claim", getClaim)
	has("show of the destroyed lease", show(), "state       destroyed")
	has("second destroy", ok("lease", "destroy", "--company", company, "--run", runID), "released already", "[released] lease "+name+" destroyed")
}
