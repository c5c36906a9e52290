package main

import (
	"strings"
	"testing"
)

// A second run that resumes the first's session finds it under $HOME and the first run's id in
// the workspace and in $HOME; a new session lists the ones kept; a run on a fresh $HOME says the
// session to resume is not there.
func TestStateSurvivesInHomeAndWorkspace(t *testing.T) {
	home, work := t.TempDir(), t.TempDir()
	t.Chdir(work)
	env := map[string]string{stateVar: "1", "HOME": home, "PAPERCLIP_RUN_ID": "run-a"}
	stdout, stderr, err := stubRun(t, paperclipArgs, env, prompt)
	if err != nil {
		t.Fatalf("first run: %v\n%s", err, stderr)
	}
	evs, _ := parse(t, stdout)
	session := evs[0].SessionID
	if want := "claude-stub: new session " + session + "; other sessions in $HOME: []; workspace runs before: []; home runs before: []\n"; !strings.HasSuffix(stderr, want) {
		t.Errorf("first run's stderr %q, want it to end %q", stderr, want)
	}

	env["PAPERCLIP_RUN_ID"] = "run-b"
	_, stderr, err = stubRun(t, append([]string{"--resume", session}, paperclipArgs...), env, prompt)
	if err != nil {
		t.Fatalf("second run: %v\n%s", err, stderr)
	}
	if want := "claude-stub: resumed session " + session + " from $HOME (1 earlier runs); other sessions in $HOME: []; workspace runs before: [run-a]; home runs before: [run-a]\n"; !strings.HasSuffix(stderr, want) {
		t.Errorf("second run's stderr %q, want it to end %q", stderr, want)
	}

	env["PAPERCLIP_RUN_ID"] = "run-c"
	stdout, stderr, err = stubRun(t, paperclipArgs, env, prompt)
	if err != nil {
		t.Fatalf("third run: %v\n%s", err, stderr)
	}
	evs, _ = parse(t, stdout)
	if want := "claude-stub: new session " + evs[0].SessionID + "; other sessions in $HOME: [" + session + "]; workspace runs before: [run-a run-b]; home runs before: [run-a run-b]\n"; !strings.HasSuffix(stderr, want) {
		t.Errorf("third run's stderr %q, want it to end %q", stderr, want)
	}

	env["HOME"], env["PAPERCLIP_RUN_ID"] = t.TempDir(), "run-d"
	_, stderr, err = stubRun(t, append([]string{"--resume", session}, paperclipArgs...), env, prompt)
	if err != nil {
		t.Fatalf("fourth run: %v\n%s", err, stderr)
	}
	if want := "claude-stub: session " + session + " to resume is not in $HOME; continuing it afresh; other sessions in $HOME: []; workspace runs before: [run-a run-b run-c]; home runs before: []\n"; !strings.HasSuffix(stderr, want) {
		t.Errorf("fourth run's stderr %q, want it to end %q", stderr, want)
	}
}
