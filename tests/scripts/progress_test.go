// Package scripts tests the shell libraries under hack/lib by running them with bash.
package scripts

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// progress runs script in bash with hack/lib/progress.sh sourced and PROGRESS_EVERY=1, and
// returns its stderr and exit status.
func progress(t *testing.T, dir, script string, env ...string) (string, int) {
	t.Helper()
	lib, err := filepath.Abs("../../hack/lib/progress.sh")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(t.Context(), "bash", "-c", "set -Eeuo pipefail; . "+lib+"; "+script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), append([]string{"PROGRESS_EVERY=1"}, env...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err = cmd.Run()
	code := 0
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		code = exitErr.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return stderr.String(), code
}

// module writes a throwaway Go module whose main imports imports.
func module(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	for name, data := range map[string]string{"go.mod": "module progresstest\n\ngo 1.24\n", "main.go": body} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestGoProgressCountsPackages builds a small program with an empty build cache, so every
// package is compiled, and checks the lines say what is built and how far it is: the total from
// go list, counts that grow up to it, the package being compiled, and the end.
func TestGoProgressCountsPackages(t *testing.T) {
	t.Parallel()
	dir := module(t, "package main\n\nimport (\n\t\"encoding/json\"\n\t\"net/url\"\n\t\"os\"\n)\n\nfunc main() { json.NewEncoder(os.Stdout).Encode(url.Values{}) }\n")
	out, code := progress(t, dir, `go_progress "building the test program" . . -- go build -v -o "$PWD/prog" .`,
		"GOCACHE="+t.TempDir(), "GOFLAGS=-mod=mod")
	if code != 0 {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	steps := regexp.MustCompile(`building the test program: (\d+) of ≤ (\d+) packages compiled \(\d+ %\), last (\S+)`).FindAllStringSubmatch(out, -1)
	if len(steps) == 0 {
		t.Fatalf("no progress line with a total (an empty build cache takes seconds to fill):\n%s", out)
	}
	n, _ := strconv.Atoi(steps[0][2])
	if n < 20 {
		t.Errorf("total %d: go list -deps of encoding/json, net/url and os has more", n)
	}
	prev := 0
	for _, s := range steps {
		done, _ := strconv.Atoi(s[1])
		if done < prev || done > n || s[2] != steps[0][2] || s[3] == "…" {
			t.Errorf("progress line %q: want a count from %d to %d of ≤ %d and the package last compiled", s[0], prev, n, n)
		}
		prev = done
	}
	end := regexp.MustCompile(`building the test program: done, (\d+) packages compiled in \d+ s`).FindStringSubmatch(out)
	if end == nil {
		t.Fatalf("no end line:\n%s", out)
	}
	if compiled, _ := strconv.Atoi(end[1]); compiled < n/2 || compiled > n {
		t.Errorf("%d packages compiled of %d: with an empty cache nearly all of them are", compiled, n)
	}
	if _, err := os.Stat(filepath.Join(dir, "prog")); err != nil {
		t.Errorf("the program was not built: %v", err)
	}
}

// TestGoProgressIsQuietWhenQuick checks a build that ends before the first progress line
// (everything cached) adds no line to the scripts' output.
func TestGoProgressIsQuietWhenQuick(t *testing.T) {
	t.Parallel()
	dir := module(t, "package main\n\nfunc main() {}\n")
	out, code := progress(t, dir, `go build -o "$PWD/prog" . && PROGRESS_EVERY=60 go_progress "building it again" . . -- go build -v -o "$PWD/prog" .`)
	if code != 0 || out != "" {
		t.Errorf("exit %d, output %q; want 0 and nothing", code, out)
	}
}

// TestGoProgressFailsWithTheBuild checks a failed build returns its status and its error gets
// through, so the scripts' `|| die` still fires.
func TestGoProgressFailsWithTheBuild(t *testing.T) {
	t.Parallel()
	dir := module(t, "package main\n\nfunc main() { undefinedThing() }\n")
	out, code := progress(t, dir, `go_progress "building the broken program" . . -- go build -v -o "$PWD/prog" .`)
	if code == 0 {
		t.Fatalf("a broken build exited 0:\n%s", out)
	}
	if !strings.Contains(out, "undefined: undefinedThing") {
		t.Errorf("the compiler's error did not pass through:\n%s", out)
	}
}

// TestWithHeartbeat checks a silent step is reported while it runs, with the last line of its
// log, and its exit status is kept.
func TestWithHeartbeat(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out, code := progress(t, dir, `echo "fetched 3 of 7" > step.log; PROGRESS_TAIL=$PWD/step.log with_heartbeat "the slow step" sleep 2.5; with_heartbeat "the failing step" false`)
	if code != 1 {
		t.Errorf("exit %d, want the failing step's 1", code)
	}
	beats := regexp.MustCompile(`the slow step: still going after \d+ s; last: fetched 3 of 7`).FindAllString(out, -1)
	if len(beats) < 2 {
		t.Errorf("%d heartbeats in 2.5 s at one a second, want 2:\n%s", len(beats), out)
	}
	if strings.Contains(out, "the failing step: still going") {
		t.Errorf("a step that ended at once was reported as going:\n%s", out)
	}
}
