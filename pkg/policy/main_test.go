package policy_test

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// checkGolden compares obj, as YAML, with testdata/<name>; -update rewrites the file.
func checkGolden(t *testing.T, name string, obj any) {
	t.Helper()
	got, err := yaml.Marshal(obj)
	if err != nil {
		t.Fatalf("marshalling %s: %v", name, err)
	}
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden %s (run with -update to create it): %v", path, err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("%s mismatch (-want +got), run with -update if intended:\n%s", path, diff)
	}
}

// checkGoldenUnstructured converts a rendered typed object as the appliers do and compares it.
func checkGoldenUnstructured(t *testing.T, name string, obj runtime.Object) {
	t.Helper()
	u, err := policy.ToUnstructured(obj)
	if err != nil {
		t.Fatalf("converting %s: %v", name, err)
	}
	checkGolden(t, name, u.Object)
}
