package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// The stub's environment report (KUBECLIP_STUB_ENV_DUMP): an agent that dumps its environment,
// and an image whose `sh` does, as a hostile company's image may. Values never leave the
// process: a report names each variable and gives the SHA-256 of its value, so that a test can
// look for a known secret without printing any.
//
// The sh wrapper: the image installs the stub as /usr/local/bin/sh too (hack/cluster/sandbox-image.sh),
// ahead of /bin/sh on the usual search paths, so that `sh -c …` execute calls (Paperclip's
// `command -v claude` probes among them) start it. Run as sh, the stub writes its report into
// envDir (when KUBECLIP_STUB_ENV_DUMP is set) and execs /bin/sh with the same arguments and
// environment; without the variable it only execs /bin/sh. The agent (`claude --print`) prints
// its own report and then each report the wrapper left.

const (
	// envDumpVar turns the reports on (any non-empty value).
	envDumpVar = "KUBECLIP_STUB_ENV_DUMP"
	// envDirVar overrides envDir (tests).
	envDirVar = "KUBECLIP_STUB_ENV_DIR"
	// defaultEnvDir is where the sh wrapper leaves its reports: /tmp is the pod's own emptyDir.
	defaultEnvDir = "/tmp/kubeclip-stub-env"
	// realShell is what the wrapper runs.
	realShell = "/bin/sh"
	// maxShellReports bounds the reports the agent prints (the wrapper keeps one per distinct
	// environment, so a run leaves a handful).
	maxShellReports = 64
)

// envEvent is one process's environment report: a stream-json system line that Paperclip's
// parser ignores. SHA256 holds [name, hex] pairs rather than an object, so that Paperclip's log
// redaction (which blanks the values of secret-looking JSON keys) leaves the hashes readable.
type envEvent struct {
	stamped
	Type    string      `json:"type"`
	Subtype string      `json:"subtype"`
	Source  string      `json:"source"` // "claude" (the agent's own) or "sh" (the wrapper's)
	Keys    []string    `json:"keys"`
	SHA256  [][2]string `json:"sha256"`
}

// envReport reports environ (NAME=VALUE entries) from source.
func envReport(source string, environ []string) *envEvent {
	ev := &envEvent{Type: "system", Subtype: "kubeclip_env", Source: source, Keys: []string{}, SHA256: [][2]string{}}
	slices.Sort(environ)
	for _, kv := range environ {
		name, value, _ := strings.Cut(kv, "=")
		sum := sha256.Sum256([]byte(value))
		ev.Keys = append(ev.Keys, name)
		ev.SHA256 = append(ev.SHA256, [2]string{name, hex.EncodeToString(sum[:])})
	}
	return ev
}

// isShell says whether the stub was started as the sh wrapper.
func isShell(argv0 string) bool {
	name := strings.TrimPrefix(filepath.Base(argv0), "-")
	return name == "sh"
}

// shellMain is the sh wrapper: leave a report when asked, then become /bin/sh. It never fails
// the command for the report's sake.
func shellMain(args, environ []string, stderr io.Writer) int {
	if lookup(environ, envDumpVar) != "" {
		if err := leaveReport(envDir(environ), environ); err != nil {
			fmt.Fprintf(stderr, "claude-stub (sh): the environment report: %v\n", err)
		}
	}
	err := syscall.Exec(realShell, args, environ)
	fmt.Fprintf(stderr, "claude-stub (sh): exec %s: %v\n", realShell, err)
	return 127
}

// leaveReport writes environ's report into dir, one file per distinct environment.
func leaveReport(dir string, environ []string) error {
	b, err := json.Marshal(envReport("sh", slices.Clone(environ)))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	f, err := os.OpenFile(filepath.Join(dir, hex.EncodeToString(sum[:8])+".json"), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if os.IsExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// shellReports are the reports the wrapper left in dir, at most maxShellReports, in name order.
func shellReports(dir string) ([]*envEvent, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var out []*envEvent
	for _, n := range names[:min(len(names), maxShellReports)] {
		b, err := os.ReadFile(n)
		if err != nil {
			return nil, err
		}
		var ev envEvent
		if err := json.Unmarshal(b, &ev); err != nil {
			return nil, fmt.Errorf("%s: %w", n, err)
		}
		out = append(out, &ev)
	}
	return out, nil
}

func envDir(environ []string) string {
	if d := lookup(environ, envDirVar); d != "" {
		return d
	}
	return defaultEnvDir
}

// lookup is the value of name in environ (the last entry wins, as getenv's).
func lookup(environ []string, name string) string {
	v := ""
	for _, kv := range environ {
		if k, val, ok := strings.Cut(kv, "="); ok && k == name {
			v = val
		}
	}
	return v
}
