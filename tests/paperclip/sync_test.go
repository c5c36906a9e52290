package paperclip

import (
	"fmt"
	"regexp"
	"testing"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
)

// TestPaperclipNativeSync is issue 19 item 3 through the real Paperclip server: the same agent
// run twice on one environment, first with the plugin's native sync turned off by the operator
// (settings.nativeSync: false: every lease says nativeFileSyncUnsupported, so the host moves the
// workspace and its assets as base64 over execute), then on (the host calls the plugin's
// environmentSyncIn/Out, which stream tars through sandboxd untar/tar). Each run's hook counts
// and execute calls go to the report, before and after.
//
// The pods' sandboxd must have the sync subcommands: the cluster's sandboxd image built from
// this checkout (bash hack/cluster/cluster.sh images), or one named by KUBECLIP_SANDBOXD_IMAGE,
// which the dispatcher reads from the suite's environment.
func TestPaperclipNativeSync(t *testing.T) {
	cs := clustertest.Clientset(t)
	pc := startServer(t)
	pt.CleanupTenant(t, cs, pc.CompanyID)
	rep := &report{}
	t.Cleanup(func() { rep.print(t) })

	pc.configurePlugin(t, map[string]any{"natsUrl": env.NATS.URL(), "nativeSync": false})
	e := pc.createEnvironment(t, "kubeclip-sync", environmentConfig("pod", false))
	pc.useEnvironment(t, e.ID)

	run := func(t *testing.T, name string) runStats {
		t.Helper()
		out, err := pc.sh(t.Context(), "cli", "heartbeat", "run", "-a", pc.AgentID, "--timeout-ms", fmt.Sprint(runTimeout.Milliseconds()))
		if err != nil {
			t.Fatalf("paperclipai heartbeat run: %v\n%s", err, lastLines(out, 40))
		}
		m := regexp.MustCompile(`Run ([0-9a-f-]{36}) completed with status (\w+)`).FindStringSubmatch(out)
		if m == nil || m[2] != "succeeded" {
			t.Fatalf("paperclipai heartbeat run did not report a succeeded run:\n%s", lastLines(out, 40))
		}
		st := checkRun(t, pc, cs, m[1], runWant{name: name, env: e, source: "on_demand", backend: "pod", live: true})
		rep.add(st)
		return st
	}

	base64 := run(t, "base64 (nativeSync off)")
	if n := num(base64.hooks["syncIn"]) + num(base64.hooks["syncOut"]); n != 0 || base64.syncExecs != 0 {
		t.Errorf("with settings.nativeSync false the host called the sync hooks %v times (%d sync execs), want its base64 route only", n, base64.syncExecs)
	}

	pc.configurePlugin(t, map[string]any{"natsUrl": env.NATS.URL(), "nativeSync": true})
	native := run(t, "native sync")
	if num(native.hooks["syncIn"]) < 1 || num(native.hooks["syncOut"]) < 1 {
		t.Errorf("native sync run: hook calls %v, want environmentSyncIn and environmentSyncOut from the host", native.hooks)
	}
	if native.syncExecs < 2 || native.syncBytes <= 0 {
		t.Errorf("native sync run: %d sync execs moving %d bytes, want the workspace and its assets moved through sandboxd", native.syncExecs, native.syncBytes)
	}
	if native.executes >= base64.executes {
		t.Errorf("native sync run: %d execute calls, want fewer than the base64 route's %d", native.executes, base64.executes)
	}
	rep.notes = append(rep.notes, fmt.Sprintf(
		"native sync (issue 19): execute calls per run %d with the host's base64 route → %d with native sync (plus %d sync execs moving %d bytes through sandboxd untar/tar); wall %s → %s",
		base64.executes, native.executes, native.syncExecs, native.syncBytes, round(base64.wall), round(native.wall)))
}
