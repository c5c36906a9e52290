package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/internal/app"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestSettings pins the refusals that happen before anything connects: each names the flag and
// its environment variable, and exits 2.
func TestSettings(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "key")
	if err := os.WriteFile(key, []byte(strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("abcd"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		args     []string
		env      map[string]string
		wantCode int
		wantErr  string
	}{
		{name: "help", args: []string{"--help"}, wantCode: 0},
		{name: "no key file", wantCode: 2, wantErr: "--sandbox-key-file (KUBECLIP_SANDBOX_KEY_FILE) is required"},
		{name: "key too short", args: []string{"--sandbox-key-file", short}, wantCode: 2, wantErr: "at least 32 are needed"},
		{name: "missing key file", env: map[string]string{"KUBECLIP_SANDBOX_KEY_FILE": filepath.Join(dir, "none")}, wantCode: 2, wantErr: "--sandbox-key-file (KUBECLIP_SANDBOX_KEY_FILE)"},
		{name: "unknown route", args: []string{"--sandbox-key-file", key, "--exec-route", "ssh"}, wantCode: 2, wantErr: "--exec-route (KUBECLIP_EXEC_ROUTE) must be daemon or kube-exec"},
		{name: "negative streams", args: []string{"--sandbox-key-file", key, "--max-execs", "-1"}, wantCode: 2, wantErr: "--max-execs (KUBECLIP_MAX_EXECS) must be >= 0"},
		{name: "negative company streams", args: []string{"--sandbox-key-file", key, "--max-execs-per-company", "-1"}, wantCode: 2, wantErr: "--max-execs-per-company (KUBECLIP_MAX_EXECS_PER_COMPANY) must be >= 0"},
		{name: "unknown env policy", args: []string{"--sandbox-key-file", key, "--env-policy", "open"}, wantCode: 2, wantErr: "--env-policy (KUBECLIP_EXEC_ENV_POLICY)"},
		{name: "bad env glob", args: []string{"--sandbox-key-file", key, "--env-deny", "A=B"}, wantCode: 2, wantErr: `env glob "A=B"`},
		{name: "bad brokered key", args: []string{"--sandbox-key-file", key, "--brokered-keys", "ANTHROPIC_API_KEY,A=B"}, wantCode: 2, wantErr: `--brokered-keys (KUBECLIP_EXEC_BROKERED_KEYS): brokered key "A=B"`},
		{name: "brokered key twice", args: []string{"--sandbox-key-file", key}, env: map[string]string{"KUBECLIP_EXEC_BROKERED_KEYS": "OPENAI_API_KEY\nOPENAI_API_KEY"}, wantCode: 2, wantErr: `brokered key "OPENAI_API_KEY" is named twice`},
		{name: "bad env glob from the environment", args: []string{"--sandbox-key-file", key}, env: map[string]string{"KUBECLIP_EXEC_ENV_ALLOW": "OK\n=X"}, wantCode: 2, wantErr: "KUBECLIP_EXEC_ENV_ALLOW"},
		{name: "no self-check interval", args: []string{"--sandbox-key-file", key, "--self-check-interval", "0s"}, wantCode: 2, wantErr: "--self-check-interval (KUBECLIP_SELF_CHECK_INTERVAL) must be > 0"},
		{name: "no ready wait", args: []string{"--sandbox-key-file", key, "--ready-timeout", "0s"}, wantCode: 2, wantErr: "--ready-timeout (KUBECLIP_EXEC_READY_TIMEOUT) must be > 0"},
		// The old default, 1 GiB a company a day, does not fit the run stream for the 4 companies
		// the default 8 GiB store is sized for (docs/security.md, Budgets).
		{name: "company budget past the store", args: []string{"--sandbox-key-file", key, "--record-company-budget", "1073741824"}, wantCode: 2, wantErr: "--record-company-budget (KUBECLIP_RECORD_COMPANY_BUDGET) is 1073741824 bytes per 24h0m0s, but 4 companies"},
		{name: "companies past the store", args: []string{"--sandbox-key-file", key, "--record-company-budget", "34359733", "--store-companies", "5"}, wantCode: 2, wantErr: "fit the run stream's 5153960400 bytes only at 27487786 or less"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			err := run(t.Context(), tc.args, lookup, &stdout, &stderr)
			if got := app.ExitCode(err); got != tc.wantCode {
				t.Fatalf("exit %d (%v), want %d", got, err, tc.wantCode)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("error %v, want it to say %q", err, tc.wantErr)
			}
			if tc.wantCode == 0 && !strings.Contains(stdout.String(), "--exec-route") {
				t.Errorf("--help does not list --exec-route:\n%s", stdout.String())
			}
		})
	}
}
