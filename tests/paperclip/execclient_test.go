package paperclip

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestExecClientAgainstExecWorkers runs the plugin's exec client (plugins/paperclip/src/exec.ts)
// against the real exec-workers on a real pod lease: the protocol-level cases the plugin's unit
// tests check against their fake (plugins/paperclip/test/real/exec.real.ts), here against
// pkg/execsvc and sandboxd.
func TestExecClientAgainstExecWorkers(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	cfg, err := json.Marshal(providerConfig("pod"))
	if err != nil {
		t.Fatal(err)
	}
	r := env.Acquire(t, company, pt.NewID("agent"), cfg)
	created := pt.WaitKind[events.RunCreatedEvent](r, runTimeout)

	cmd := exec.CommandContext(t.Context(), filepath.Join(root, "hack", "node", "node.sh"), "exec", "npm", "run", "--silent", "test:real")
	cmd.Dir = filepath.Join(root, "plugins", "paperclip")
	cmd.Env = append(os.Environ(),
		"KUBECLIP_REAL_NATS_URL="+env.NATS.URL(), "KUBECLIP_REAL_COMPANY_ID="+company,
		"KUBECLIP_REAL_RUN_ID="+r.RunID, "KUBECLIP_REAL_LEASE_ID="+created.ProviderLeaseID)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the plugin's exec client against the exec-workers: %v\n%s", err, lastLines(string(out), 80))
	}
	t.Logf("the plugin's exec client against the exec-workers:\n%s", lastLines(string(out), 20))
	// Issue 15 item 5: one 64 MiB execute through the plugin's hook, its figures for the report.
	m := regexp.MustCompile(`KUBECLIP_BIG_EXEC outputBytes=(\d+) held=(\d+) peakRSS=(\d+) baselineRSS=(\d+)`).FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("the 64 MiB execute printed no figures:\n%s", lastLines(string(out), 40))
	}
	bigExec.mu.Lock()
	bigExec.outputBytes, bigExec.held, bigExec.peakRSS, bigExec.baselineRSS = atoi(m[1]), atoi(m[2]), atoi(m[3]), atoi(m[4])
	bigExec.mu.Unlock()
	t.Logf("64 MiB execute: held %s bytes per stream, peak RSS %d MiB (baseline %d MiB)", m[2], atoi(m[3])>>20, atoi(m[4])>>20)

	// Issue 19 item 3: native sync through the plugin's hooks (test/real/sync.real.ts).
	if m := regexp.MustCompile(`KUBECLIP_SYNC bytes=(\d+) inMs=(\d+) outMs=(\d+) peakRSS=(\d+) baselineRSS=(\d+)`).FindStringSubmatch(string(out)); m == nil {
		t.Errorf("the native sync test printed no figures:\n%s", lastLines(string(out), 40))
	} else {
		mib, in, outMs := float64(atoi(m[1]))/(1<<20), atoi(m[2]), atoi(m[3])
		nativeSync = fmt.Sprintf("native sync of %.0f MiB (+ a small tree) through the plugin's hooks, real exec-workers and sandboxd: in %d ms (%.1f MiB/s), out %d ms (%.1f MiB/s); process peak RSS %d MiB (%d MiB before)",
			mib, in, mib/(float64(in)/1000), outMs, mib/(float64(outMs)/1000), atoi(m[4])>>20, atoi(m[5])>>20)
		t.Log(nativeSync)
	}

	r.Release(created.ProviderLeaseID, false)
	if released := pt.WaitKind[events.RunReleasedEvent](r, runTimeout); released.State != events.ReleaseStopped {
		t.Errorf("released %+v", released)
	}
}

func atoi(s string) int64 {
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}
