package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// stateVar turns on the stub's state between runs (any non-empty value): what a test of
// reusable leases needs to see that a run found what an earlier one left in the pod.
const stateVar = "KUBECLIP_STUB_STATE"

// sessionsDir is where the stub keeps its sessions under $HOME, as Claude Code keeps its own in
// ~/.claude: a session resumed in a later run is found only if $HOME survived.
const sessionsDir = ".claude/kubeclip-stub/sessions"

// runsFile is the file each run appends its run id to, in the workspace and in $HOME.
const runsFile = ".kubeclip-stub-runs"

// keepState records this run in the workspace (cwd) and $HOME and keeps session id's run count
// under $HOME; it returns the stderr line that says what earlier runs left: the resumed
// session's count (or that it was not there), the other sessions kept, and the run ids found in
// each place.
func keepState(home, cwd, runID, session string, resumed bool) (string, error) {
	if home == "" {
		return "", &usageError{stateVar + " needs HOME"}
	}
	dir := filepath.Join(home, sessionsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("keeping the session: %w", err)
	}
	kept, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("listing the sessions: %w", err)
	}
	var others []string
	for _, e := range kept {
		if e.Name() != session {
			others = append(others, e.Name())
		}
	}
	path := filepath.Join(dir, session)
	runs := 0
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		runs, _ = strconv.Atoi(strings.TrimSpace(string(data)))
	case !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("reading the session: %w", err)
	}
	if err := os.WriteFile(path, []byte(strconv.Itoa(runs+1)+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("keeping the session: %w", err)
	}
	var b strings.Builder
	switch {
	case resumed && runs > 0:
		fmt.Fprintf(&b, "claude-stub: resumed session %s from $HOME (%d earlier runs)", session, runs)
	case resumed:
		fmt.Fprintf(&b, "claude-stub: session %s to resume is not in $HOME; continuing it afresh", session)
	default:
		fmt.Fprintf(&b, "claude-stub: new session %s", session)
	}
	fmt.Fprintf(&b, "; other sessions in $HOME: [%s]", strings.Join(others, " "))
	for _, place := range []struct{ name, dir string }{{"workspace", cwd}, {"home", home}} {
		earlier, err := appendRun(filepath.Join(place.dir, runsFile), runID)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "; %s runs before: [%s]", place.name, strings.Join(earlier, " "))
	}
	return b.String() + "\n", nil
}

// appendRun appends runID to the file at path and returns the ids it held before.
func appendRun(path, runID string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("recording the run: %w", err)
	}
	_, err = fmt.Fprintln(f, runID)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("recording the run in %s: %w", path, err)
	}
	return strings.Fields(string(data)), nil
}
