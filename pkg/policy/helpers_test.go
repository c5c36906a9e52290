package policy_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"
)

func typeMeta(apiVersion, kind string) metav1.TypeMeta {
	return metav1.TypeMeta{APIVersion: apiVersion, Kind: kind}
}

func typesUID(s string) types.UID { return types.UID(s) }

// crdDir holds the CRDs the test cluster installs from the repo (hack/cluster/cluster.sh up);
// testCRDDir the CRDs only these tests read: agent-sandbox v0.5.6's Sandbox, the last to serve
// v1alpha1 too, which RenderSandbox still renders. The cluster installs agent-sandbox's CRDs
// from the module of the controller it runs (v1.0.3: v1beta1 only), which tests/dryrun checks
// v1beta1 against.
var (
	crdDir     = filepath.Join("..", "..", "hack", "cluster", "crds")
	testCRDDir = filepath.Join("testdata", "crds")
)

// loadCRDSchemas returns the openAPIV3Schema of each version of a CRD in crdDir, or in
// testCRDDir when it is not there.
func loadCRDSchemas(t *testing.T, file string) map[string]map[string]any {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(crdDir, file))
	if errors.Is(err, fs.ErrNotExist) {
		data, err = os.ReadFile(filepath.Join(testCRDDir, file))
	}
	if err != nil {
		t.Fatalf("reading the CRD the test cluster installs: %v", err)
	}
	var crd map[string]any
	if err := yaml.Unmarshal(data, &crd); err != nil {
		t.Fatal(err)
	}
	schemas := map[string]map[string]any{}
	for _, v := range crd["spec"].(map[string]any)["versions"].([]any) {
		ver := v.(map[string]any)
		schemas[ver["name"].(string)] = ver["schema"].(map[string]any)["openAPIV3Schema"].(map[string]any)
	}
	return schemas
}

// checkSchema walks v against a structural OpenAPI v3 schema: unknown fields (which the API
// server would prune or, with strict field validation, reject), types, enums, required
// fields, string patterns and lengths. oneOf/anyOf are left to the API server.
func checkSchema(path string, v any, s map[string]any, problems *[]string) {
	add := func(msg string) { *problems = append(*problems, path+": "+msg) }
	if s["x-kubernetes-preserve-unknown-fields"] == true {
		return
	}
	if s["x-kubernetes-int-or-string"] == true {
		switch v.(type) {
		case int64, string:
		default:
			add(fmt.Sprintf("want int-or-string, got %T", v))
		}
		return
	}
	if enum, ok := s["enum"].([]any); ok && !slices.Contains(enum, v) {
		add(fmt.Sprintf("%v not in enum %v", v, enum))
	}
	switch s["type"] {
	case "object":
		obj, ok := v.(map[string]any)
		if !ok {
			add(fmt.Sprintf("want object, got %T", v))
			return
		}
		props, hasProps := s["properties"].(map[string]any)
		addl, hasAddl := s["additionalProperties"].(map[string]any)
		for _, r := range asSlice(s["required"]) {
			if _, ok := obj[r.(string)]; !ok {
				add("missing required " + r.(string))
			}
		}
		if !hasProps && !hasAddl { // free-form (metadata)
			return
		}
		for k, fv := range obj {
			switch {
			case hasProps && props[k] != nil:
				checkSchema(path+"."+k, fv, props[k].(map[string]any), problems)
			case hasAddl:
				checkSchema(path+"."+k, fv, addl, problems)
			default:
				*problems = append(*problems, path+"."+k+": not in the schema")
			}
		}
	case "array":
		arr, ok := v.([]any)
		if !ok {
			add(fmt.Sprintf("want array, got %T", v))
			return
		}
		items, _ := s["items"].(map[string]any)
		for i, e := range arr {
			checkSchema(fmt.Sprintf("%s[%d]", path, i), e, items, problems)
		}
	case "string":
		str, ok := v.(string)
		if !ok {
			add(fmt.Sprintf("want string, got %T", v))
			return
		}
		if p, ok := s["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(str) {
			add(fmt.Sprintf("%q does not match %s", str, p))
		}
		if n, ok := s["maxLength"].(float64); ok && len(str) > int(n) {
			add(fmt.Sprintf("longer than %v", n))
		}
	case "integer":
		if _, ok := v.(int64); !ok {
			add(fmt.Sprintf("want integer, got %T", v))
		}
	case "boolean":
		if _, ok := v.(bool); !ok {
			add(fmt.Sprintf("want boolean, got %T", v))
		}
	}
}

func asSlice(v any) []any {
	s, _ := v.([]any)
	return s
}
