package k8s

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const secretToken = "s3cr3t-t0ken-do-not-print"

func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	content := `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: ` + server + `
users:
- name: u
  user:
    token: ` + secretToken + `
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// notInCluster makes rest.InClusterConfig fail the way it does outside a pod.
func notInCluster(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
}

func TestRESTConfigExplicitPath(t *testing.T) {
	path := writeKubeconfig(t, "https://explicit.example:6443")
	t.Setenv("KUBECONFIG", writeKubeconfig(t, "https://from-env.example:6443"))

	cfg, err := RESTConfig(path, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://explicit.example:6443" {
		t.Errorf("Host = %q, want the explicit file's server", cfg.Host)
	}
	// Pins DefaultQPS/DefaultBurst (see their comment for why they are above client-go's 5/10).
	if cfg.QPS != 300 || cfg.Burst != 600 {
		t.Errorf("QPS/Burst = %v/%d, want 300/600", cfg.QPS, cfg.Burst)
	}
	if cfg.UserAgent != "kubeclip" {
		t.Errorf("UserAgent = %q, want kubeclip", cfg.UserAgent)
	}

	cfg, err = RESTConfig(path, 7, 9)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.QPS != 7 || cfg.Burst != 9 {
		t.Errorf("QPS/Burst = %v/%d, want 7/9", cfg.QPS, cfg.Burst)
	}

	c := ForComponent(cfg, "dispatcher")
	if c.UserAgent != "kubeclip/dispatcher" || cfg.UserAgent != "kubeclip" {
		t.Errorf("ForComponent: UserAgent = %q (original %q), want kubeclip/dispatcher (original unchanged)", c.UserAgent, cfg.UserAgent)
	}
}

func TestRESTConfigDefaultRules(t *testing.T) {
	notInCluster(t)
	t.Setenv("KUBECONFIG", writeKubeconfig(t, "https://from-env.example:6443"))
	cfg, err := RESTConfig("", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://from-env.example:6443" {
		t.Errorf("Host = %q, want $KUBECONFIG's server", cfg.Host)
	}
}

func TestRESTConfigBrokenInClusterFallsBack(t *testing.T) {
	// In a pod (service env set) whose token is not mounted, a kubeconfig still works.
	t.Setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
	t.Setenv("KUBERNETES_SERVICE_PORT", "443")
	if _, err := os.Stat("/var/run/secrets/kubernetes.io/serviceaccount/token"); err == nil {
		t.Fatal("this test needs a machine without a mounted service-account token")
	}
	t.Setenv("KUBECONFIG", writeKubeconfig(t, "https://from-env.example:6443"))
	cfg, err := RESTConfig("", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://from-env.example:6443" {
		t.Errorf("Host = %q, want $KUBECONFIG's server", cfg.Host)
	}
}

func TestRESTConfigErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name     string
		path     string
		env      string // $KUBECONFIG when path is ""
		wantIs   error
		wantTest func(error) bool
	}{
		{name: "missing explicit file", path: filepath.Join(dir, "nope"), wantIs: fs.ErrNotExist},
		{name: "directory", path: dir, wantTest: func(err error) bool { return isPathError(err) }},
		{
			name:   "unparsable YAML quoting a token",
			path:   write("bad-yaml", "users:\n- name: u\n  user:\n    token: "+secretToken+": : :\n  ["),
			wantIs: errKubeconfigUnparsable,
		},
		{
			name:   "wrong type next to a token",
			path:   write("bad-type", "users:\n- name: u\n  user:\n    token: ["+secretToken+"]\n"),
			wantIs: errKubeconfigUnparsable,
		},
		{
			name:   "no current context",
			path:   write("no-context", "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    token: "+secretToken+"\n"),
			wantIs: ErrNoConfig,
		},
		{name: "nothing configured", env: filepath.Join(dir, "nope"), wantIs: ErrNoConfig},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			notInCluster(t)
			t.Setenv("HOME", t.TempDir())
			t.Setenv("KUBECONFIG", tc.env)
			_, err := RESTConfig(tc.path, 0, 0)
			if err == nil {
				t.Fatal("RESTConfig succeeded, want an error")
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("error %q is not %v", err, tc.wantIs)
			}
			if tc.wantTest != nil && !tc.wantTest(err) {
				t.Errorf("error %q (%T) has the wrong kind", err, err)
			}
			if strings.Contains(err.Error(), secretToken) {
				t.Errorf("error leaks the token: %q", err)
			}
			if tc.path != "" && !strings.Contains(err.Error(), tc.path) {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}
