package clustertest

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
)

// Kubectl returns the path of kubectl: $KUBECTL, then PATH, then the one the cluster harness
// builds (make cluster-up) into the cache for the Kubernetes version hack/k8s/go.mod pins, read
// under the repository root root. kustomize is kubectl's (kubectl kustomize).
func Kubectl(t testing.TB, root string) string {
	t.Helper()
	if p := os.Getenv("KUBECTL"); p != "" {
		return p
	}
	if p, err := exec.LookPath("kubectl"); err == nil {
		return p
	}
	gomod, err := os.ReadFile(filepath.Join(root, "hack/k8s/go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`k8s\.io/kubernetes (v[0-9][^\s]*)`).FindSubmatch(gomod)
	if m == nil {
		t.Fatal("no k8s.io/kubernetes version in hack/k8s/go.mod")
	}
	cache := os.Getenv("KUBECLIP_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache/kubeclip")
	}
	p := filepath.Join(cache, "k8s", string(m[1]), "bin/kubectl")
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("kubectl not found (%v): `make cluster-up` builds it, or put kubectl on PATH or in $KUBECTL", err)
	}
	return p
}
