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

// TestWarmPoolSettings pins the warm pool flags' refusals, which happen before anything
// connects: each names the flag and its environment variable, and exits 2.
func TestWarmPoolSettings(t *testing.T) {
	key := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(key, []byte(strings.Repeat("ab", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
	}{
		{name: "negative max", args: []string{"--warm-pool-max", "-1"}, wantErr: "--warm-pool-max (KUBECLIP_WARM_POOL_MAX) must be >= 0"},
		{name: "no sandbox key", args: []string{"--warm-pool-max", "2"}, wantErr: "--warm-pool-max (KUBECLIP_WARM_POOL_MAX) needs --sandbox-key-file (KUBECLIP_SANDBOX_KEY_FILE)"},
		{name: "no idle window", args: []string{"--sandbox-key-file", key, "--warm-pool-max", "2", "--warm-pool-idle", "0s"}, wantErr: "--warm-pool-idle (KUBECLIP_WARM_POOL_IDLE) must be > 0"},
		{name: "minimum not company=N", args: []string{"--sandbox-key-file", key, "--warm-pool-max", "2", "--warm-pool-min", "acme"}, wantErr: `--warm-pool-min (KUBECLIP_WARM_POOL_MIN): "acme" is not company=N`},
		{name: "minimum over max", env: map[string]string{"KUBECLIP_SANDBOX_KEY_FILE": key, "KUBECLIP_WARM_POOL_MAX": "2", "KUBECLIP_WARM_POOL_MIN": "acme=1,beta=3"},
			wantErr: `--warm-pool-min (KUBECLIP_WARM_POOL_MIN): the minimum of company beta must be a count from 0 to --warm-pool-max (KUBECLIP_WARM_POOL_MAX) (2), got "3"`},
		{name: "minimum not a number", args: []string{"--sandbox-key-file", key, "--warm-pool-max", "2", "--warm-pool-min", "acme=x"}, wantErr: `the minimum of company acme must be a count`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			err := run(t.Context(), tc.args, lookup, &stdout, &stderr)
			if got := app.ExitCode(err); got != 2 {
				t.Fatalf("exit %d (%v), want 2", got, err)
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %v, want it to say %q", err, tc.wantErr)
			}
		})
	}
}

// TestBrokeredKeysSettings: --brokered-keys is read as the exec-worker's (broker.KeyNames): a
// name no environment key can have, or one named twice, is refused before anything connects,
// naming the flag and its environment variable.
func TestBrokeredKeysSettings(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
	}{
		{name: "a name with =", args: []string{"--brokered-keys", "ANTHROPIC_API_KEY,A=B"}, wantErr: `--brokered-keys (KUBECLIP_BROKERED_KEYS): brokered key "A=B" must be a non-empty environment key`},
		{name: "a name twice", env: map[string]string{"KUBECLIP_BROKERED_KEYS": "ANTHROPIC_API_KEY, OPENAI_API_KEY,ANTHROPIC_API_KEY"}, wantErr: `--brokered-keys (KUBECLIP_BROKERED_KEYS): brokered key "ANTHROPIC_API_KEY" is named twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			lookup := func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }
			err := run(t.Context(), tc.args, lookup, &stdout, &stderr)
			if got := app.ExitCode(err); got != 2 {
				t.Fatalf("exit %d (%v), want 2", got, err)
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %v, want it to say %q", err, tc.wantErr)
			}
		})
	}
}
