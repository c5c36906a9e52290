package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/pkg/broker/ca"
)

// TestCACommand makes installation CAs with `credential-broker ca` (what hack/deploy/secrets.sh
// runs) and loads them as the broker does: by default the CA is constrained to exactly the
// built-in bindings' hosts, --host adds one, the key is private to its owner, an existing file
// is never overwritten, and the refusals name the flag.
func TestCACommand(t *testing.T) {
	defaults, err := loadBindings("")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		args      []string
		wantCode  int
		wantErr   string
		wantHosts []string
	}{
		{name: "built-in hosts", wantHosts: defaults.hosts()},
		{name: "and one more", args: []string{"--host", "API.Example.COM."}, wantHosts: append(defaults.hosts(), "api.example.com")},
		{name: "a host that is an address", args: []string{"--host", "10.0.0.1"}, wantCode: 2, wantErr: "--host (KUBECLIP_BROKER_CA_HOSTS): \"10.0.0.1\" is an IP address"},
		{name: "no validity", args: []string{"--validity", "0s"}, wantCode: 2, wantErr: "--validity (KUBECLIP_BROKER_CA_VALIDITY) must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cert, key := filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key")
			var stdout, stderr bytes.Buffer
			err := run(t.Context(), append([]string{"ca", "--out-cert", cert, "--out-key", key}, tc.args...), noEnv, &stdout, &stderr)
			if got := app.ExitCode(err); got != tc.wantCode {
				t.Fatalf("exit %d (%v), want %d", got, err, tc.wantCode)
			}
			if tc.wantCode != 0 {
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("error %v, want it to say %q", err, tc.wantErr)
				}
				if _, err := os.Stat(key); !os.IsNotExist(err) {
					t.Errorf("a refused ca left %s behind (%v)", key, err)
				}
				return
			}
			certPEM, keyPEM := read(t, cert), read(t, key)
			authority, err := ca.Parse(certPEM, keyPEM)
			if err != nil {
				t.Fatalf("the broker does not load the CA: %v", err)
			}
			if got := authority.Hosts(); !slices.Equal(got, tc.wantHosts) {
				t.Errorf("the CA is constrained to %v, want %v", got, tc.wantHosts)
			}
			if authority.Permits("example.org") {
				t.Error("the CA permits example.org, a host bound by nothing")
			}
			if fi, err := os.Stat(key); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("the key's file: %v (%v), want mode 0600", fi.Mode(), err)
			}
			if strings.Contains(stderr.String()+stdout.String(), "PRIVATE KEY") {
				t.Error("the command printed the key")
			}

			// Again into the same files: refused, and the first CA stays as it was.
			err = run(t.Context(), []string{"ca", "--out-cert", cert, "--out-key", key}, noEnv, &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), "--out-key") {
				t.Errorf("a second ca into the same files: %v, want a refusal naming --out-key", err)
			}
			if !bytes.Equal(read(t, cert), certPEM) || !bytes.Equal(read(t, key), keyPEM) {
				t.Error("a second ca changed the first CA's files")
			}
		})
	}

	t.Run("no output files", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		err := run(t.Context(), []string{"ca"}, noEnv, &stdout, &stderr)
		if got := app.ExitCode(err); got != 2 || !strings.Contains(err.Error(), "--out-cert (KUBECLIP_BROKER_CA_OUT_CERT) is required") || !strings.Contains(err.Error(), "--out-key (KUBECLIP_BROKER_CA_OUT_KEY) is required") {
			t.Errorf("exit %d: %v, want 2 naming --out-cert and --out-key", got, err)
		}
	})
}

func noEnv(string) (string, bool) { return "", false }

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
