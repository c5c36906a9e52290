package paperclip

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/api"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// sandboxImage is the local cluster's Paperclip sandbox: a Debian userland, node, the claude
// stub (hack/cluster/sandbox-image.sh).
const sandboxImage = "kubeclip.local/sandbox:dev"

// runTimeout bounds one agent run on this shared 2-core machine: a pod start, ~90 commands, the
// stub's ~5 s, a release.
const runTimeout = 5 * time.Minute

// stubPause is the stub's pause between its lines (CLAUDE_STUB_INTERVAL's default).
const stubPause = time.Second

// providerConfig is the kubeclip part of an environment config: an exec-capable backend on the
// sandbox image, with room for node (Paperclip's bridge) and the stub.
func providerConfig(backend string) map[string]any {
	return map[string]any{
		"backend":                backend,
		"podActivityDeadlineSec": 900,
		"adapters": []any{map[string]any{
			"adapterType":  "claude_local",
			"runtimeImage": sandboxImage,
			"envKeys":      []string{"ANTHROPIC_API_KEY"},
			"allowFqdns":   []string{"api.anthropic.com"},
		}},
		"defaultResources": map[string]any{
			"requests": map[string]string{"cpu": "100m", "memory": "128Mi"},
			"limits":   map[string]string{"cpu": "1", "memory": "512Mi"},
		},
	}
}

// environmentConfig is a whole environment config: the provider config and Paperclip's
// streamRunLogs: false (live output through the plugin's execute.log) unless tailLogs asks for
// Paperclip's default (tail polling). kubeclip's NATS is no part of it: the connection is the
// plugin settings' (pluginSettings), the operator's.
func environmentConfig(backend string, tailLogs bool) map[string]any {
	c := providerConfig(backend)
	if !tailLogs {
		c["streamRunLogs"] = false
	}
	return c
}

// TestPaperclip is issue 10's end-to-end list, in order, against one Paperclip instance and
// one agent (kubeclip holds one run per agent at a time): the provider, validation and probe;
// runs by `paperclipai heartbeat run` and by an issue assignment with live output; a cancelled
// run; a run that loses its exec-worker; a run with Paperclip's default log tailing; a run on
// the sandbox-cr backend. It records what each run cost and prints it.
func TestPaperclip(t *testing.T) {
	cs := clustertest.Clientset(t)
	pc := startServer(t)
	pt.CleanupTenant(t, cs, pc.CompanyID)
	rep := &report{}
	t.Cleanup(func() { rep.print(t) })
	// The operator's settings: kubeclip's NATS (the suite's JetStream server).
	pc.configurePlugin(t, map[string]any{"natsUrl": env.NATS.URL()})

	t.Run("ProviderIsThePlugin", func(t *testing.T) {
		var caps struct {
			SandboxProviders map[string]struct {
				Status               string `json:"status"`
				Source               string `json:"source"`
				PluginKey            string `json:"pluginKey"`
				SupportsRunExecution bool   `json:"supportsRunExecution"`
			} `json:"sandboxProviders"`
			Adapters []struct {
				AdapterType      string            `json:"adapterType"`
				SandboxProviders map[string]string `json:"sandboxProviders"`
			} `json:"adapters"`
		}
		pc.must(t, http.MethodGet, "/companies/"+pc.CompanyID+"/environments/capabilities", nil, &caps)
		k, ok := caps.SandboxProviders["kubernetes"]
		if !ok || k.Status != "supported" || k.Source != "plugin" || k.PluginKey != "kubeclip.paperclip-sandbox-provider" || !k.SupportsRunExecution {
			t.Errorf("the kubernetes provider: %+v (present %v), want the plugin's, supported, running agents", k, ok)
		}
		for _, a := range caps.Adapters {
			if a.AdapterType == "claude_local" && a.SandboxProviders["kubernetes"] != "supported" {
				t.Errorf("claude_local on kubernetes: %q, want supported", a.SandboxProviders["kubernetes"])
			}
		}
	})

	t.Run("InvalidConfigRefusedWithKubeclipsMessage", func(t *testing.T) {
		// kubeclip's verdict (pkg/policy through the tenant-worker's api.validate) is the only
		// source: the expected message is computed by the same code, not written here.
		bad := providerConfig("pod")
		bad["egressAllowCidrs"] = []string{"10.0.0.0/33"}
		raw, err := json.Marshal(bad)
		if err != nil {
			t.Fatal(err)
		}
		verdict := api.Validate(raw, policy.DefaultOperator())
		if verdict.OK || len(verdict.Errors) == 0 {
			t.Fatalf("kubeclip accepts %s; the test needs a config it refuses", raw)
		}
		want := verdict.Errors[0].Field + ": " + verdict.Errors[0].Message
		bad["provider"] = "kubernetes"
		checkRefused(t, pc, bad, want)

		// The plugin's own refusals: a backend that cannot exec, and kubeclip out of reach.
		job := environmentConfig("job", false)
		job["provider"] = "kubernetes"
		checkRefused(t, pc, job, `config.backend: "job" runs the agent as a Job and cannot serve Paperclip's execute calls (a run is ~90 commands in a pod that stays up); use "pod" (any cluster) or "sandbox-cr" (clusters with agent-sandbox)`)
	})

	// Issue 15 item 1: a company's environment cannot choose where the plugin connects (with
	// the operator's credentials). Its natsUrl is refused, and the server it names hears nothing.
	t.Run("EnvironmentConnectionRefused", func(t *testing.T) {
		lst := startFakeNATS(t)
		// The operator's settings carry credentials, which must never reach the company's server.
		pc.configurePlugin(t, map[string]any{"natsUrl": env.NATS.URL(), "natsUser": "paperclip", "natsPassword": "operator-password-7c1d"})
		defer pc.configurePlugin(t, map[string]any{"natsUrl": env.NATS.URL()})
		for _, key := range []string{"natsUrl", "subjectPrefix", "inboxPrefix"} {
			cfg := environmentConfig("pod", false)
			cfg["provider"] = "kubernetes"
			cfg[key] = map[string]string{"natsUrl": lst.URL(), "subjectPrefix": "evil", "inboxPrefix": "_INBOX"}[key]
			checkRefusedLike(t, pc, cfg, regexp.MustCompile(`^config\.`+key+`: connection settings are the operator's: `))
		}
		// Nothing connects there, now or a little later.
		time.Sleep(time.Second)
		if n, got := lst.seen(); n != 0 || got != "" {
			t.Errorf("the company's server got %d connections and %q, want none", n, cut(got, 300))
		}
	})

	t.Run("ProbeReachesTheWorkers", func(t *testing.T) {
		cfg := environmentConfig("pod", false)
		cfg["provider"] = "kubernetes"
		var probe struct {
			OK      bool   `json:"ok"`
			Summary string `json:"summary"`
		}
		pc.must(t, http.MethodPost, "/companies/"+pc.CompanyID+"/environments/probe-config", map[string]any{"driver": "sandbox", "config": cfg}, &probe)
		if !probe.OK {
			t.Errorf("probe: %+v", probe)
		}
		for _, w := range []string{"tenant-worker×1", "dispatcher×1", "run-watcher×1", "exec-worker×2"} {
			if !strings.Contains(probe.Summary, w) {
				t.Errorf("probe summary %q does not name %s", probe.Summary, w)
			}
		}
	})

	live := pc.createEnvironment(t, "kubeclip", environmentConfig("pod", false))
	// The stored config is kubeclip's normalized one: its defaults were applied by pkg/policy.
	raw, _ := json.Marshal(providerConfig("pod"))
	if v := api.Validate(raw, policy.DefaultOperator()); !v.OK || live.Config["namespacePrefix"] != v.NormalizedConfig.NamespacePrefix {
		t.Errorf("the environment's config %v is not kubeclip's normalized config (namespacePrefix %q)", live.Config, v.NormalizedConfig.NamespacePrefix)
	}
	pc.useEnvironment(t, live.ID)

	// Everything the plugin sends to kubeclip during the first run, to look for Paperclip's
	// server secrets in it (issue 15 item 2).
	wireLog := watchWire(t)
	var cliRun string

	t.Run("HeartbeatRunCLI", func(t *testing.T) {
		out, err := pc.sh(t.Context(), "cli", "heartbeat", "run", "-a", pc.AgentID, "--timeout-ms", fmt.Sprint(runTimeout.Milliseconds()))
		if err != nil {
			t.Fatalf("paperclipai heartbeat run: %v\n%s", err, lastLines(out, 40))
		}
		m := regexp.MustCompile(`Run ([0-9a-f-]{36}) completed with status (\w+)`).FindStringSubmatch(out)
		if m == nil || m[2] != "succeeded" {
			t.Fatalf("paperclipai heartbeat run did not report a succeeded run:\n%s", lastLines(out, 40))
		}
		// The CLI streamed the run's log: the stub's last assistant line is in it.
		if !strings.Contains(out, "assistant: Done.") {
			t.Errorf("the CLI's live log lacks the stub's lines:\n%s", lastLines(out, 20))
		}
		cliRun = m[1]
		rep.add(checkRun(t, pc, cs, m[1], runWant{name: "heartbeat run (CLI)", env: live, source: "on_demand", backend: "pod", live: true}))
	})

	// Issue 15 item 2: Paperclip's host sends its server's own environment with some executes
	// (its JWT and signing secrets among it); none of it reaches a pod. A pod's commands get
	// their environment only from the exec requests on kubeclip's NATS: none carries a server
	// secret, by name or by value, while the agent's own keys arrive.
	t.Run("NoServerSecretReachesThePod", func(t *testing.T) {
		if cliRun == "" {
			t.Fatal("HeartbeatRunCLI's run did not succeed: nothing to check")
		}
		_ = wireLog.sub.Unsubscribe()
		msgs := wireLog.messages()
		starts, agentEnv := 0, map[string]any{}
		for _, m := range msgs {
			for name, v := range serverSecrets {
				if bytes.Contains(m.Data, []byte(v)) || strings.Contains(fmt.Sprint(m.Header), v) {
					t.Errorf("%s's value went to kubeclip on %s%s", name, m.Subject, carriedBy(m.Data, v))
				}
			}
			if !strings.HasPrefix(m.Subject, "paperclip.exec.") || !strings.HasSuffix(m.Subject, ".start") || !strings.Contains(m.Subject, cliRun) {
				continue
			}
			starts++
			var req struct {
				Env    map[string]any `json:"env"`
				Record bool           `json:"record"`
			}
			if err := json.Unmarshal(m.Data, &req); err != nil {
				t.Fatalf("exec start on %s: %v", m.Subject, err)
			}
			for k := range serverSecrets {
				if _, ok := req.Env[k]; ok {
					t.Errorf("exec start on %s carries %s", m.Subject, k)
				}
			}
			if req.Record {
				agentEnv = req.Env
			}
		}
		if starts < 20 {
			t.Fatalf("saw %d exec starts of run %s on the wire, want the ~90 of a run", starts, cliRun)
		}
		for _, k := range []string{"PAPERCLIP_API_URL", "PAPERCLIP_API_KEY", "PAPERCLIP_RUN_ID", "PAPERCLIP_AGENT_ID", "PAPERCLIP_COMPANY_ID"} {
			if _, ok := agentEnv[k]; !ok {
				t.Errorf("the agent command's env lacks %s (has %d keys)", k, len(agentEnv))
			}
		}
		// The host did send them: the plugin dropped them by name (and logged only names).
		dropped := map[string]bool{}
		for _, rec := range pc.pluginLog(t, "execute env keys dropped", cliRun) {
			keys, _ := rec["keys"].([]any)
			for _, k := range keys {
				dropped[fmt.Sprint(k)] = true
			}
		}
		t.Logf("run %s: %d exec starts on the wire; the plugin dropped %d distinct env keys Paperclip's host sent: %v", cliRun, starts, len(dropped), slices.Sorted(maps.Keys(dropped)))
		for k := range serverSecrets {
			if !dropped[k] {
				t.Errorf("the plugin logged no drop of %s: Paperclip's host did not send it this time, so this test proved nothing about it", k)
			}
		}
		data, err := os.ReadFile(pc.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			for _, v := range serverSecrets {
				if strings.Contains(line, "[plugin]") && strings.Contains(line, v) {
					t.Errorf("a server secret's value is in a plugin log line")
				}
			}
		}
		checkPodEnvironments(t, pc, cliRun)
	})

	t.Run("IssueAssignmentRun", func(t *testing.T) {
		var issue struct {
			ID         string `json:"id"`
			Identifier string `json:"identifier"`
		}
		pc.must(t, http.MethodPost, "/companies/"+pc.CompanyID+"/issues", map[string]any{"title": "Say hello", "assigneeAgentId": pc.AgentID, "status": "todo"}, &issue)
		var runID string
		pt.Eventually(t, time.Minute, "the assignment's run", func() bool {
			var runs []struct {
				RunID            string `json:"runId"`
				InvocationSource string `json:"invocationSource"`
			}
			pc.must(t, http.MethodGet, "/issues/"+issue.ID+"/runs", nil, &runs)
			for _, r := range runs {
				if r.InvocationSource == "assignment" {
					runID = r.RunID
					return true
				}
			}
			return false
		})
		rep.add(checkRun(t, pc, cs, runID, runWant{name: "issue " + issue.Identifier, env: live, source: "assignment", issueID: issue.ID, backend: "pod", live: true, apiCalls: 2}))
		// The stub closed its issue through Paperclip's bridge in the sandbox.
		var got struct {
			Status string `json:"status"`
		}
		pc.must(t, http.MethodGet, "/issues/"+issue.ID, nil, &got)
		if got.Status != "done" {
			t.Errorf("issue %s is %s, want done (the stub's PATCH through the bridge)", issue.Identifier, got.Status)
		}
		pc.waitIdle(t, runTimeout)
	})

	t.Run("CancelMidRun", func(t *testing.T) {
		runID := pc.invoke(t)
		// Mid-run: the agent command printed its first line.
		pt.Eventually(t, runTimeout, "the stub's first line in the run log", func() bool {
			return len(stubLines(stdoutChunks(pc.runLog(t, runID)))) > 0
		})
		pc.must(t, http.MethodPost, "/heartbeat-runs/"+runID+"/cancel", map[string]any{}, nil)
		rec := pc.waitRun(t, runID, runTimeout)
		if rec.Status != "cancelled" {
			t.Errorf("run %s is %s after the cancel, want cancelled", runID, rec.Status)
		}
		// Paperclip lets the agent command end, then releases: the lease ends with kubeclip's
		// receipt, the pod is gone and nothing of the run is left in the namespace.
		lease := pc.leaseOf(t, live.ID, runID, runTimeout)
		checkReceipt(t, lease, "released", "expired")
		r := follow(t, pc, runID)
		released := pt.WaitKind[events.RunReleasedEvent](r, runTimeout)
		if released.ProviderLeaseID != lease.ProviderLeaseID || released.State != events.ReleaseStopped {
			t.Errorf("released %+v, want lease %s stopped", released, lease.ProviderLeaseID)
		}
		checkPodGone(t, cs, lease.Metadata.Kubeclip.Namespace, lease.Metadata.Kubeclip.WorkloadName)
		pods, err := cs.CoreV1().Pods(lease.Metadata.Kubeclip.Namespace).List(t.Context(), metav1.ListOptions{})
		if err != nil || len(pods.Items) != 0 {
			t.Errorf("pods left in %s after the cancelled run: %d (%v)", lease.Metadata.Kubeclip.Namespace, len(pods.Items), err)
		}
		rep.add(runStats{name: "cancelled", status: rec.Status, wall: wall(rec)})
		pc.waitIdle(t, runTimeout)
	})

	t.Run("ExecWorkerKilledDuringAgent", func(t *testing.T) {
		runID := pc.invoke(t)
		// The replica serving the agent command: the one that started its recorded exec.
		var serving, agentExec string
		pt.Eventually(t, runTimeout, "the agent command's exec", func() bool {
			recs, err := env.Records(pt.ExecWorker, func(r pt.LogRecord) bool {
				return r.RunID == runID && r.Message == "exec started" && r.Record
			})
			if err != nil {
				t.Fatal(err)
			}
			for _, rs := range recs {
				serving, agentExec = rs[0].Replica, rs[0].ExecID
				return true
			}
			return false
		})
		w := env.Worker(serving)
		if w == nil {
			t.Fatalf("exec-worker %s, serving the agent command, is not running", serving)
		}
		if err := w.Kill(); err != nil {
			t.Fatal(err)
		}
		killedAt := time.Now()
		t.Cleanup(func() {
			// Two replicas again for the tests after this one.
			if _, err := env.StartWorker(pt.ExecWorker); err != nil {
				t.Error(err)
			}
		})
		// Not live across the kill: the lines printed meanwhile arrive together once the client
		// attached through the other replica (after 3 s of silence). Complete, once each, in order.
		st := checkRun(t, pc, cs, runID, runWant{name: "exec-worker killed", env: live, source: "on_demand", backend: "pod"})
		if !st.resultPrinted.After(killedAt) {
			t.Errorf("the stub printed its result at %s, before the kill at %s: the kill was not during the agent command", st.resultPrinted, killedAt)
		}
		// Another replica took the agent's stream over and saw its exit.
		exited, err := env.Records(pt.ExecWorker, func(r pt.LogRecord) bool { return r.ExecID == agentExec && r.Message == "exec exited" })
		if err != nil {
			t.Fatal(err)
		}
		var by []string
		for id, rs := range exited {
			for range rs {
				by = append(by, id)
			}
		}
		if len(by) != 1 || by[0] == serving {
			t.Errorf("the agent command's exit was served by %v, want once, by a replica other than %s", by, serving)
		}
		rep.add(st)
	})

	t.Run("DefaultStreamRunLogs", func(t *testing.T) {
		tail := pc.createEnvironment(t, "kubeclip-tail", environmentConfig("pod", true))
		pc.useEnvironment(t, tail.ID)
		defer pc.useEnvironment(t, live.ID)
		rep.add(checkRun(t, pc, cs, pc.invoke(t), runWant{name: "default streamRunLogs", env: tail, source: "on_demand", backend: "pod"}))
	})

	// Issue 15 item 5: the plugin worker's peak RSS over every run above, from /proc (taken by
	// LargeOutputRun before it resets the peak, when it runs).
	t.Cleanup(func() {
		if rep.pluginPeakRSS != 0 {
			return
		}
		if pid, peak := pluginWorkerPeakRSS(t); pid != 0 {
			rep.pluginPeakRSS = peak
			t.Logf("the plugin worker (pid %d) peak RSS: %d MiB", pid, peak>>20)
		}
	})

	t.Run("SandboxCRBackend", func(t *testing.T) {
		// agent-sandbox's own controller (hack/cluster/cluster.sh runs it) makes the pod.
		clustertest.RequireSandboxController(t)
		sbx := pc.createEnvironment(t, "kubeclip-sandbox-cr", environmentConfig("sandbox-cr", false))
		pc.useEnvironment(t, sbx.ID)
		defer pc.useEnvironment(t, live.ID)
		rep.add(checkRun(t, pc, cs, pc.invoke(t), runWant{name: "sandbox-cr backend", env: sbx, source: "on_demand", backend: "sandbox-cr", live: true}))
	})

	// Issue 15 item 5: an agent command that prints 64 MiB. The plugin holds a bounded part of
	// it (the head with the init line, the tail with the result) while it streams all of it to
	// Paperclip's live log; the run completes with the stub's result parsed, and the plugin
	// worker's peak RSS over this run (its process's VmHWM, reset before) stays bounded.
	// Issue 26 item 16: the output is over sandboxd's cap, which keeps its head and its tail.
	t.Run("LargeOutputRun", func(t *testing.T) {
		pid, before := pluginWorkerPeakRSS(t)
		if pid == 0 {
			t.Fatal("no plugin worker process under Paperclip")
		}
		rep.pluginPeakRSS = before
		resetPeakRSS(t, pid)
		pc.setAgentEnv(t, map[string]string{"KUBECLIP_STUB_FILLER_BYTES": fmt.Sprint(largeOutput)})
		defer pc.setAgentEnv(t, map[string]string{"KUBECLIP_STUB_FILLER_BYTES": ""})
		runID := pc.invoke(t)
		rec := pc.waitRun(t, runID, runTimeout)
		if rec.Status != "succeeded" || rec.ExitCode == nil || *rec.ExitCode != 0 {
			var raw map[string]any
			pc.must(t, http.MethodGet, "/heartbeat-runs/"+runID, nil, &raw)
			dbg, _ := json.Marshal(raw)
			t.Fatalf("run %s: status %s, exit %v, error %v; want succeeded with exit 0\n%s", runID, rec.Status, deref(rec.ExitCode), deref(rec.Error), cut(string(dbg), 6000))
		}
		// Paperclip parsed the stub's result line, printed after the 64 MiB (the adapter found it
		// in the returned stdout's tail) and the session of its init line (in the head).
		wantSummary := fmt.Sprintf("printed %d bytes of filler and finished", largeOutput)
		switch {
		case rec.Result == nil || rec.Result.Subtype != "success" || !strings.Contains(rec.Result.Result, wantSummary):
			t.Errorf("run %s: Paperclip's result %+v, want the stub's success saying %q", runID, rec.Result, wantSummary)
		case deref(rec.SessionIDAfter) == "" || rec.Result.SessionID != deref(rec.SessionIDAfter):
			t.Errorf("run %s: session %q, result's %q; want the stub's init session in both", runID, deref(rec.SessionIDAfter), rec.Result.SessionID)
		case rec.Usage == nil || rec.Usage.InputTokens == 0 || rec.Usage.CostUSD <= 0:
			t.Errorf("run %s: usage %+v, want the stub's", runID, rec.Usage)
		}
		pid2, peak := pluginWorkerPeakRSS(t)
		if pid2 != pid {
			t.Fatalf("the plugin worker is pid %d now, %d before the run: it restarted", pid2, pid)
		}
		rep.largeRun = largeRunStats{bytes: largeOutput, peakRSS: peak, wall: wall(rec)}
		t.Logf("run %s: %.1f MiB of output in %s; the plugin worker's peak RSS %d MiB over it (%d MiB over the runs before)", runID, float64(largeOutput)/(1<<20), wall(rec).Round(time.Second), peak>>20, before>>20)
		if peak > before+largeRunRSSGrowth {
			t.Errorf("the plugin worker's peak RSS over a %.1f MiB execute: %d MiB, %d MiB over its %d MiB before; want at most %d MiB over", float64(largeOutput)/(1<<20), peak>>20, (peak-before)>>20, before>>20, largeRunRSSGrowth>>20)
		}
		pc.waitIdle(t, runTimeout)
	})
}

// largeOutput is the filler LargeOutputRun's agent prints (the stub's KUBECLIP_STUB_FILLER_BYTES):
// 64 MiB + 1 KiB, over the 64 MiB kubeclip sends of one command's output (the plugin's
// maxOutputBytes, sandboxd's journal cap), so the result line arrives only because sandboxd
// keeps the tail of what it cannot send whole (issue 26 item 16; pkg/sandboxd/tail.go).
const largeOutput = 64<<20 + 1<<10

// largeRunRSSGrowth bounds how far the plugin worker's peak RSS over LargeOutputRun may rise
// above its peak over the runs before (the held head and tail, and the live log's chunks in
// flight). Measured in full `make test` runs and alone: 121, 175 and 198 MiB over a 159-166 MiB
// before (287, 339, 357 MiB peaks on unchanged plugin code); without the live log's backpressure
// (livelog.ts) 346-365 MiB peaks over 120-160 MiB, and 490 MiB and growing while Paperclip's
// host stalled. Node's garbage collector moves the figure by tens of MiB from run to run, so the
// bound catches a plugin whose memory follows the output (64 MiB and more held, or growing), not
// every lost backpressure. (An absolute bound of 336 MiB failed at 339 MiB.)
const largeRunRSSGrowth = 256 << 20

// checkPodEnvironments checks what the processes in run runID's pod got, as they reported it in
// Paperclip's run log (tests/images/claude-stub/envdump.go): the agent command's own environment,
// and the environment of every `sh -c` execute before it (the image's sh wrapper: a company image
// whose shell dumps its environment). No report names a server secret or carries the hash of
// its value; the agent has the keys it needs; the sh reports include Paperclip's probes, the
// executes the host sends with its server's whole environment (serverMarker, a key only the
// server's environment has, which the operator allows); and no report carries a key of the
// server's environment the operator did not allow (DO_NOT_TRACK, hack/paperclip/paperclip.sh:
// the plugin's execute env is an allowlist, issue 26 item 8).
func checkPodEnvironments(t *testing.T, pc *server, runID string) {
	t.Helper()
	reports, err := envReports(stubLines(stdoutChunks(pc.runLog(t, runID))))
	if err != nil {
		t.Fatalf("run %s: an environment report: %v", runID, err)
	}
	secretOf := map[string]string{} // hex(sha256(value)) → name
	for name, v := range serverSecrets {
		sum := sha256.Sum256([]byte(v))
		secretOf[hex.EncodeToString(sum[:])] = name
	}
	var agentKeys []string
	agents, shells, probes := 0, 0, 0
	for _, r := range reports {
		for _, k := range r.Keys {
			if _, ok := serverSecrets[k]; ok {
				t.Errorf("run %s: a process in the pod (%s) got %s", runID, r.Source, k)
			}
		}
		for _, kv := range r.SHA256 {
			if name, ok := secretOf[kv[1]]; ok {
				t.Errorf("run %s: a process in the pod (%s) got %s's value, as %s", runID, r.Source, name, kv[0])
			}
		}
		switch r.Source {
		case "claude":
			agents++
			agentKeys = r.Keys
		case "sh":
			shells++
			if slices.Contains(r.Keys, serverMarker) {
				probes++
			}
		}
		if slices.Contains(r.Keys, "DO_NOT_TRACK") {
			t.Errorf("run %s: a process in the pod (%s) got DO_NOT_TRACK, a key of Paperclip's server the operator did not allow", runID, r.Source)
		}
	}
	t.Logf("run %s: %d environment reports from the pod (the agent's %d keys; %d sh environments, %d of them the server's)", runID, len(reports), len(agentKeys), shells, probes)
	if agents != 1 || probes == 0 {
		t.Fatalf("run %s: %d reports of the agent, %d sh environments with the server's keys; want the agent's one and Paperclip's probes (is the cluster's sandbox image older than tests/images/claude-stub? hack/cluster/cluster.sh images)", runID, agents, probes)
	}
	// What an agent needs: Paperclip's API through the bridge, its run token, the adapter's key.
	for _, k := range []string{"PAPERCLIP_API_URL", "PAPERCLIP_API_KEY", "PAPERCLIP_RUN_ID", "ANTHROPIC_API_KEY"} {
		if !slices.Contains(agentKeys, k) {
			t.Errorf("run %s: the agent command's environment lacks %s (has %v)", runID, k, agentKeys)
		}
	}
}

// checkRefused creates an environment with config and expects Paperclip's 422 with message.
func checkRefused(t *testing.T, pc *server, config map[string]any, message string) {
	t.Helper()
	checkRefusedLike(t, pc, config, regexp.MustCompile("^"+regexp.QuoteMeta(message)+"$"))
}

func checkRefusedLike(t *testing.T, pc *server, config map[string]any, message *regexp.Regexp) {
	t.Helper()
	err := pc.call(t.Context(), http.MethodPost, "/companies/"+pc.CompanyID+"/environments", map[string]any{"name": "refused", "driver": "sandbox", "config": config}, nil)
	var ae *apiError
	if !errors.As(err, &ae) || ae.Status != http.StatusUnprocessableEntity {
		t.Fatalf("creating an environment with %v: %v, want HTTP 422", config, err)
	}
	var body struct {
		Error string `json:"error"`
	}
	if err := json.Unmarshal([]byte(ae.Body), &body); err != nil || !message.MatchString(body.Error) {
		t.Errorf("Paperclip's refusal %q, want %s", ae.Body, message)
	}
}

// runWant is what a successful run must show.
type runWant struct {
	name    string
	env     environment
	source  string // Paperclip's invocationSource
	issueID string
	backend string
	// live: streamRunLogs false, so each stub line reaches the run log as the stub prints it.
	live bool
	// apiCalls is how many Paperclip API calls the stub makes through the bridge (1: GET
	// /api/agents/me; 2 with an issue: and its PATCH).
	apiCalls int
}

// checkRun waits for run runID to end and checks it succeeded as Paperclip, kubeclip and the
// cluster each saw it; it returns the run's figures for the report.
func checkRun(t *testing.T, pc *server, cs kubernetes.Interface, runID string, want runWant) runStats {
	t.Helper()
	if want.apiCalls == 0 {
		want.apiCalls = 1
	}
	st := runStats{name: want.name}
	rec := pc.waitRun(t, runID, runTimeout)
	st.status, st.wall = rec.Status, wall(rec)
	if rec.Status != "succeeded" || rec.ExitCode == nil || *rec.ExitCode != 0 || rec.Error != nil {
		t.Fatalf("run %s: status %s, exit %v, error %v; want succeeded with exit 0\nlog:\n%s", runID, rec.Status, deref(rec.ExitCode), deref(rec.Error), logText(pc.runLog(t, runID)))
	}
	if rec.InvocationSource != want.source || rec.ContextSnapshot.IssueID != want.issueID {
		t.Errorf("run %s: source %s, issue %q; want %s, %q", runID, rec.InvocationSource, rec.ContextSnapshot.IssueID, want.source, want.issueID)
	}

	// Paperclip's record holds the session, usage and cost its parser took from the stub's
	// returned stdout, and they are the stub's own.
	log := pc.runLog(t, runID)
	lines := agentLines(stubLines(stdoutChunks(log)))
	wantKinds := []string{"system/init"}
	for i := range want.apiCalls + 2 {
		wantKinds = append(wantKinds, fmt.Sprintf("assistant/msg_stub_%02d", i+1))
	}
	wantKinds = append(wantKinds, "result/success")
	if got := kinds(lines); !slices.Equal(got, wantKinds) {
		t.Fatalf("run %s: the stub's lines in Paperclip's log are %v, want each of %v once, in order\nlog:\n%s", runID, got, wantKinds, logText(log))
	}
	var init, result stubEvent
	_ = json.Unmarshal([]byte(lines[0].Raw), &init)
	_ = json.Unmarshal([]byte(lines[len(lines)-1].Raw), &result)
	session := deref(rec.SessionIDAfter)
	switch {
	case rec.Usage == nil || rec.Result == nil:
		t.Errorf("run %s has no usage or result: %+v", runID, rec)
	case session == "" || session != init.SessionID || rec.Usage.PersistedSessionID != session || rec.Result.SessionID != session:
		t.Errorf("run %s: session %q, usage's %q, result's %q; want the stub's %q", runID, session, rec.Usage.PersistedSessionID, rec.Result.SessionID, init.SessionID)
	case rec.Usage.InputTokens != result.Usage.InputTokens || rec.Usage.OutputTokens != result.Usage.OutputTokens || rec.Usage.InputTokens == 0:
		t.Errorf("run %s: usage %d in / %d out, want the stub's %d / %d", runID, rec.Usage.InputTokens, rec.Usage.OutputTokens, result.Usage.InputTokens, result.Usage.OutputTokens)
	case rec.Usage.CostUSD != result.TotalCostUSD || rec.Usage.CostUSD <= 0:
		t.Errorf("run %s: cost %v, want the stub's %v", runID, rec.Usage.CostUSD, result.TotalCostUSD)
	}
	if !strings.Contains(stderrText(log), "claude-stub: working on a prompt of") {
		t.Errorf("run %s: the stub's stderr line is not in the run log", runID)
	}

	// Live: each line reached the run log as the stub printed it: before the stub, after its
	// pause, printed the next one. So the log's timestamps follow the stub's pauses.
	for _, l := range lines {
		if l.Printed.IsZero() {
			t.Fatalf("run %s: the stub's line %q has no timestamp: the cluster's sandbox image is older than tests/images/claude-stub (bash hack/cluster/cluster.sh up)", runID, cut(l.Raw, 120))
		}
	}
	st.firstLine = lines[0].Logged.Sub(lines[0].Printed)
	for _, l := range lines {
		st.maxLine = max(st.maxLine, l.Logged.Sub(l.Printed))
	}
	st.agent = lines[len(lines)-1].Printed.Sub(lines[0].Printed)
	st.resultPrinted = lines[len(lines)-1].Printed
	if want.live {
		for i := 1; i < len(lines); i++ {
			if pause := lines[i].Printed.Sub(lines[i-1].Printed); pause < stubPause {
				t.Errorf("run %s: the stub printed line %d %s after line %d, want its %s pause", runID, i+1, pause, i, stubPause)
			}
			if !lines[i-1].Logged.Before(lines[i].Printed) {
				t.Errorf("run %s: line %d reached the log at %s, after the stub printed line %d at %s: not live", runID, i, lines[i-1].Logged.Format("15:04:05.000"), i+1, lines[i].Printed.Format("15:04:05.000"))
			}
		}
	}

	// Paperclip's lease: released, with kubeclip's termination receipt.
	lease := pc.leaseOf(t, want.env.ID, runID, runTimeout)
	checkReceipt(t, lease, "released")
	if lease.Metadata.Kubeclip.RunID != runID || lease.Metadata.Kubeclip.Backend != want.backend || lease.Metadata.RemoteCwd != "/workspace" {
		t.Errorf("run %s: lease metadata %+v, want kubeclip's ids for this run on %s and remoteCwd /workspace", runID, lease.Metadata, want.backend)
	}

	// kubeclip's run stream: the lease's lifecycle and the agent's output.
	r := follow(t, pc, runID)
	released := pt.WaitKind[events.RunReleasedEvent](r, runTimeout)
	evs := r.Events()
	checkRunStream(t, evs, lease, released, lines, rec)
	checkRunResult(t, r, rec)
	st.streamEvents, st.streamBytes = len(evs), payloadBytes(t, evs)
	checkPodGone(t, cs, lease.Metadata.Kubeclip.Namespace, lease.Metadata.Kubeclip.WorkloadName)

	// What the lease cost, as the plugin measured it at its hooks, and the exec-workers' count.
	sums := pc.pluginLog(t, "lease released", runID)
	if len(sums) != 1 {
		t.Fatalf("run %s: %d 'lease released' records in Paperclip's log, want 1", runID, len(sums))
	}
	sum := sums[0]
	st.hooks, _ = sum["hooks"].(map[string]any)
	st.executes = int(num(sum["executes"]))
	st.p50, st.p99, st.pmax = ms(sum["execP50Ms"]), ms(sum["execP99Ms"]), ms(sum["execMaxMs"])
	st.release = ms(sum["releaseMs"])
	st.syncExecs, st.syncBytes = int(num(sum["syncExecs"])), int64(num(sum["syncBytes"]))
	if acq := pc.pluginLog(t, "lease acquired", runID); len(acq) == 1 {
		st.acquire = ms(acq[0]["acquireMs"])
	}
	if num(st.hooks["acquireLease"]) != 1 || num(st.hooks["realizeWorkspace"]) != 1 || num(st.hooks["releaseLease"]) != 1 || int(num(st.hooks["execute"])) != st.executes {
		t.Errorf("run %s: hook calls %v, want one acquire, realize and release and %d executes", runID, st.hooks, st.executes)
	}
	// An exec whose first replica was killed between sandboxd's start and its log line is
	// logged by the replica that answered the client's repeated start.
	started, err := env.Records(pt.ExecWorker, func(l pt.LogRecord) bool {
		return l.RunID == runID && (l.Message == "exec started" || l.Message == "exec start found it running")
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, rs := range started {
		for _, l := range rs {
			ids[l.ExecID] = true
		}
	}
	// Native sync's execs (sandboxd untar/tar, post-upload commands) are no execute call.
	if len(ids) != st.executes+st.syncExecs || st.executes < 20 {
		t.Errorf("run %s: the plugin counted %d executes and %d sync execs, the exec-workers started %d execs; want equal, and the ~90 of a run", runID, st.executes, st.syncExecs, len(ids))
	}
	return st
}

// checkReceipt checks that the lease ended in one of statuses with kubeclip's receipt.
func checkReceipt(t *testing.T, lease leaseRecord, statuses ...string) {
	t.Helper()
	term := lease.Metadata.Termination
	if !slices.Contains(statuses, lease.Status) || term == nil || term.State != "stopped" || term.ProviderLeaseID != lease.ProviderLeaseID {
		t.Errorf("lease %s: status %s, receipt %+v; want %v with a stopped receipt for %s", lease.ID, lease.Status, term, statuses, lease.ProviderLeaseID)
	}
}

// follow collects run runID's events from kubeclip's run stream until the test ends.
func follow(t *testing.T, pc *server, runID string) *pt.Run {
	r := env.NewRun(t, pc.CompanyID, pc.AgentID)
	r.RunID = runID
	r.Collect()
	return r
}

// checkRunStream checks kubeclip's run stream: created, the pod Ready, the agent command's
// recorded output (the same lines Paperclip logged, and the same parsed result), released.
func checkRunStream(t *testing.T, evs []events.Received, lease leaseRecord, released events.RunReleasedEvent, logged []stubLine, rec runRecord) {
	t.Helper()
	var order []string
	var created *events.RunCreatedEvent
	execs := map[string][]events.RunExecEvent{}
	for _, e := range evs {
		switch ev := e.Event.(type) {
		case events.RunCreatedEvent:
			created = &ev
			order = append(order, "created")
		case events.RunStatusEvent:
			if ev.Phase == events.PhaseRunning && ev.Reason == events.ReasonReady {
				order = append(order, "ready")
			}
		case events.RunExecEvent:
			if len(execs[ev.ExecID]) == 0 {
				order = append(order, "exec")
			}
			execs[ev.ExecID] = append(execs[ev.ExecID], ev)
		case events.RunReleasedEvent:
			order = append(order, "released")
		}
	}
	// A status may precede created (docs/contract.md, Ordering): a warm pod is Ready when an
	// acquire binds it, and the run-watcher may see it bound before the dispatcher publishes.
	if len(order) >= 2 && order[0] == "ready" && order[1] == "created" {
		order[0], order[1] = order[1], order[0]
	}
	if !slices.Equal(order, []string{"created", "ready", "exec", "released"}) {
		t.Errorf("run %s's stream: %v, want created, ready, the agent's exec, released\n%s", rec.ID, order, pt.Describe(evs))
		return
	}
	if created.ProviderLeaseID != lease.ProviderLeaseID || created.Namespace != lease.Metadata.Kubeclip.Namespace || created.ExpiresAt == nil {
		t.Errorf("created %+v, want Paperclip's lease %s with its expiry", created, lease.ProviderLeaseID)
	}
	if released.ProviderLeaseID != lease.ProviderLeaseID || released.State != events.ReleaseStopped {
		t.Errorf("released %+v, want lease %s stopped", released, lease.ProviderLeaseID)
	}
	for id, chunks := range execs {
		slices.SortFunc(chunks, func(a, b events.RunExecEvent) int { return int(a.Seq) - int(b.Seq) })
		var out []chunk
		var final *events.RunExecEvent
		for _, c := range chunks {
			if c.Exit != nil {
				final = &c
			} else if c.Stream == events.ExecStdout {
				out = append(out, chunk{at: c.At, text: c.Text})
			}
		}
		// The same lines: each is told by its kind and the stub's timestamp (Paperclip redacts
		// some values, such as apiKeySource, in what it logs).
		recorded := agentLines(stubLines(out))
		if !slices.Equal(identities(recorded), identities(logged)) {
			t.Errorf("exec %s in kubeclip's stream holds the stub lines %v, Paperclip logged %v", id, identities(recorded), identities(logged))
		}
		switch {
		case final == nil || final.Exit.ExitCode == nil || *final.Exit.ExitCode != 0:
			t.Errorf("exec %s: final event %+v, want exit 0", id, final)
		case final.Agent == nil || final.Agent.SessionID != deref(rec.SessionIDAfter) || final.Agent.CostUSD == nil || *final.Agent.CostUSD != rec.Usage.CostUSD:
			t.Errorf("exec %s: kubeclip parsed %+v; Paperclip recorded session %q cost %v", id, final.Agent, deref(rec.SessionIDAfter), rec.Usage.CostUSD)
		}
	}
}

func checkPodGone(t *testing.T, cs kubernetes.Interface, ns, name string) {
	t.Helper()
	if _, err := cs.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("pod %s/%s after the lease was released: %v, want NotFound", ns, name, err)
	}
}

// identities are lines' kinds with the stub's timestamps.
func identities(lines []stubLine) []string {
	out := kinds(lines)
	for i, l := range lines {
		out[i] += "@" + l.Printed.Format("15:04:05.000")
	}
	return out
}

func stderrText(log []logEntry) string {
	var b strings.Builder
	for _, e := range log {
		if e.Stream == "stderr" {
			b.WriteString(e.Chunk)
		}
	}
	return b.String()
}

func logText(log []logEntry) string {
	var b strings.Builder
	for _, e := range log {
		fmt.Fprintf(&b, "%s %s %s", e.TS.Format("15:04:05.000"), e.Stream, cut(e.Chunk, 300))
		if !strings.HasSuffix(e.Chunk, "\n") {
			b.WriteByte('\n')
		}
	}
	return lastLines(b.String(), 60)
}

func wall(r runRecord) time.Duration {
	if r.StartedAt == nil || r.FinishedAt == nil {
		return 0
	}
	return r.FinishedAt.Sub(*r.StartedAt)
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

func num(v any) float64 {
	f, _ := v.(float64)
	return f
}

func ms(v any) time.Duration { return time.Duration(num(v) * float64(time.Millisecond)) }

// payloadBytes is what the run's events weigh in kubeclip's stream: their JSON payloads, encoded
// as the publisher encodes them (headers not counted).
func payloadBytes(t *testing.T, evs []events.Received) int {
	t.Helper()
	n := 0
	for _, e := range evs {
		b, err := json.Marshal(e.Event)
		if err != nil {
			t.Fatalf("encoding %T: %v", e.Event, err)
		}
		n += len(b)
	}
	return n
}

// carriedBy names the env keys of an exec start request whose values contain v (never v).
func carriedBy(data []byte, v string) string {
	var req struct {
		Env map[string]string `json:"env"`
	}
	if json.Unmarshal(data, &req) != nil {
		return ""
	}
	var keys []string
	for k, val := range req.Env {
		if strings.Contains(val, v) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	if len(keys) == 0 {
		return " (not in env)"
	}
	return " in env " + strings.Join(keys, ", ")
}
