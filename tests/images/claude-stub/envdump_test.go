package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func sha(v string) string {
	sum := sha256.Sum256([]byte(v))
	return hex.EncodeToString(sum[:])
}

// envLines are stdout's system/kubeclip_env lines.
func envLines(t *testing.T, stdout string) []envEvent {
	t.Helper()
	var out []envEvent
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		var ev envEvent
		if err := json.Unmarshal([]byte(l), &ev); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		if ev.Subtype == "kubeclip_env" {
			out = append(out, ev)
		}
	}
	return out
}

// The agent reports its own environment and what the sh wrapper left, names and hashes only,
// right after the init line; Paperclip's parser still sees the same run.
func TestEnvDumpReportsNamesAndHashes(t *testing.T) {
	dir := t.TempDir()
	// What a probe's sh saw (twice the same environment: one report), and another environment.
	probe := []string{"PATH=/usr/bin", "SERVER_SECRET=hunter2", envDumpVar + "=1"}
	for _, env := range [][]string{probe, probe, {"PATH=/bin", envDumpVar + "=1"}} {
		if err := leaveReport(dir, env); err != nil {
			t.Fatal(err)
		}
	}
	stdout, stderr, err := stubRun(t, paperclipArgs, map[string]string{envDumpVar: "1", envDirVar: dir, "PAPERCLIP_RUN_ID": "run-1"}, prompt)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr)
	}
	if strings.Contains(stdout, "hunter2") {
		t.Fatal("a value is in the stub's output")
	}
	evs, p := parse(t, stdout)
	if diff := cmp.Diff([]string{"system/init", "system/kubeclip_env", "system/kubeclip_env", "system/kubeclip_env", "assistant/", "assistant/", "result/success"}, types(evs)); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if r := p.ResultWithExitCode(0); r == nil || r.SessionID != evs[0].SessionID {
		t.Errorf("parsed result %+v, want the init's session", r)
	}
	envs := envLines(t, stdout)
	own := envs[0]
	if own.Source != "claude" || !slices.Contains(own.Keys, "PAPERCLIP_RUN_ID") || !slices.Contains(own.SHA256, [2]string{"PAPERCLIP_RUN_ID", sha("run-1")}) {
		t.Errorf("the agent's own report %+v, want PAPERCLIP_RUN_ID with its hash", own)
	}
	var shells [][]string
	for _, ev := range envs[1:] {
		if ev.Source != "sh" {
			t.Errorf("report from %q, want sh", ev.Source)
		}
		shells = append(shells, ev.Keys)
	}
	slices.SortFunc(shells, func(a, b []string) int { return len(a) - len(b) })
	if diff := cmp.Diff([][]string{{envDumpVar, "PATH"}, {envDumpVar, "PATH", "SERVER_SECRET"}}, shells); diff != "" {
		t.Errorf("the sh reports' keys (-want +got):\n%s", diff)
	}
	if !slices.Contains(envs[2].SHA256, [2]string{"SERVER_SECRET", sha("hunter2")}) && !slices.Contains(envs[1].SHA256, [2]string{"SERVER_SECRET", sha("hunter2")}) {
		t.Errorf("no report carries SERVER_SECRET's hash: %+v", envs[1:])
	}

	// Off by default: no report, and the wrapper leaves none.
	stdout, _, err = stubRun(t, paperclipArgs, map[string]string{envDirVar: dir}, prompt)
	if err != nil || len(envLines(t, stdout)) != 0 {
		t.Errorf("without %s: %d reports (%v), want none", envDumpVar, len(envLines(t, stdout)), err)
	}
}

func TestShellWrapper(t *testing.T) {
	for argv0, want := range map[string]bool{"sh": true, "/usr/local/bin/sh": true, "-sh": true, "claude": false, "bash": false, "/usr/local/bin/claude": false} {
		if got := isShell(argv0); got != want {
			t.Errorf("isShell(%q) = %v, want %v", argv0, got, want)
		}
	}
	dir := t.TempDir()
	if err := leaveReport(dir, []string{"A=1"}); err != nil {
		t.Fatal(err)
	}
	names, _ := filepath.Glob(filepath.Join(dir, "*.json"))
	if len(names) != 1 {
		t.Fatalf("reports %v, want one", names)
	}
	if fi, err := os.Stat(names[0]); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("report %s: %v %v, want mode 0600", names[0], fi.Mode(), err)
	}
}

// The filler: about the asked bytes in lines of at most 64 KiB, between the first assistant line
// and the result, whose summary says so; the parser still finds the session and the result.
func TestFillerBytes(t *testing.T) {
	const n = 1061921
	stdout, _, err := stubRun(t, paperclipArgs, map[string]string{"KUBECLIP_STUB_FILLER_BYTES": "1061921"}, prompt)
	if err != nil {
		t.Fatal(err)
	}
	evs, p := parse(t, stdout)
	filler, longest := 0, 0
	for _, l := range strings.SplitAfter(stdout, "\n") {
		if strings.Contains(l, `"subtype":"kubeclip_filler"`) {
			filler += len(l)
			longest = max(longest, len(l))
		}
	}
	if filler < n || filler > n+200 || longest > fillerLine {
		t.Errorf("filler %d bytes (longest line %d), want %d to %d in lines of at most %d", filler, longest, n, n+200, fillerLine)
	}
	if got := types(evs); got[0] != "system/init" || got[1] != "assistant/" || got[2] != "system/kubeclip_filler" || got[len(got)-1] != "result/success" {
		t.Errorf("events %v…", got[:3])
	}
	if r := p.ResultWithExitCode(0); r == nil || !strings.Contains(r.Summary, "printed 1061921 bytes of filler") {
		t.Errorf("parsed result %+v, want the filler in its summary", r)
	}
	for _, bad := range []string{"-1", "x", "1073741825"} {
		if _, _, err := stubRun(t, paperclipArgs, map[string]string{"KUBECLIP_STUB_FILLER_BYTES": bad}, prompt); !isUsage(err) || !strings.Contains(err.Error(), "KUBECLIP_STUB_FILLER_BYTES") {
			t.Errorf("KUBECLIP_STUB_FILLER_BYTES=%s: %v, want a usage error naming it", bad, err)
		}
	}
}
