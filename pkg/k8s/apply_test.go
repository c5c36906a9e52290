package k8s

import (
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
)

var (
	gvkNamespace = schema.GroupVersionKind{Version: "v1", Kind: "Namespace"}
	gvkConfigMap = schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}
	gvkWidget    = schema.GroupVersionKind{Group: "example.kubeclip.test", Version: "v1", Kind: "Widget"}
)

// resettingMapper is a static mapper that learns Widget on its first Reset, like a discovery
// cache refreshed after a CRD was installed.
type resettingMapper struct {
	*meta.DefaultRESTMapper
	resets int
}

func newResettingMapper() *resettingMapper {
	m := meta.NewDefaultRESTMapper(nil)
	m.Add(gvkNamespace, meta.RESTScopeRoot)
	m.Add(gvkConfigMap, meta.RESTScopeNamespace)
	return &resettingMapper{DefaultRESTMapper: m}
}

func (m *resettingMapper) Reset() {
	m.resets++
	m.Add(gvkWidget, meta.RESTScopeNamespace)
}

var _ meta.ResettableRESTMapper = (*resettingMapper)(nil)

func obj(gvk schema.GroupVersionKind, ns, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	u.SetNamespace(ns)
	u.SetName(name)
	return u
}

func TestNewApplierValidates(t *testing.T) {
	dyn := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
	if _, err := NewApplier(ApplierOptions{Mapper: newResettingMapper()}); err == nil {
		t.Error("NewApplier without Dynamic succeeded")
	}
	if _, err := NewApplier(ApplierOptions{Dynamic: dyn}); err == nil {
		t.Error("NewApplier without Mapper succeeded")
	}
	a, err := NewApplier(ApplierOptions{Dynamic: dyn, Mapper: newResettingMapper()})
	if err != nil {
		t.Fatal(err)
	}
	if a.fieldManager != "kubeclip" {
		t.Errorf("default field manager = %q, want kubeclip", a.fieldManager)
	}
}

// TestApplyRefusesMalformedObjects checks what the Applier rejects before any request.
func TestApplyRefusesMalformedObjects(t *testing.T) {
	a, err := NewApplier(ApplierOptions{Dynamic: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()), Mapper: newResettingMapper()})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		obj  *unstructured.Unstructured
		want string
	}{
		{"nil", nil, "applying nil object: invalid object"},
		{"no name", obj(gvkConfigMap, "t-x", ""), "applying ConfigMap t-x/: apiVersion, kind and metadata.name are required: invalid object"},
		{"no kind", obj(schema.GroupVersionKind{Version: "v1"}, "t-x", "a"), "applying object t-x/a: apiVersion, kind and metadata.name are required: invalid object"},
		{"namespaced without namespace", obj(gvkConfigMap, "", "a"), "applying ConfigMap a: namespaced kind without metadata.namespace: invalid object"},
		{"cluster-scoped with namespace", obj(gvkNamespace, "t-x", "t-x"), "applying Namespace t-x/t-x: cluster-scoped kind with metadata.namespace: invalid object"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := a.Apply(t.Context(), tc.obj)
			if !errors.Is(err, ErrInvalidObject) {
				t.Fatalf("Apply error = %v, want ErrInvalidObject", err)
			}
			if err.Error() != tc.want {
				t.Errorf("Apply error = %q, want %q", err, tc.want)
			}
		})
	}
}

func TestMappingResetsOnceOnNoMatch(t *testing.T) {
	m := newResettingMapper()
	a, err := NewApplier(ApplierOptions{Dynamic: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()), Mapper: m})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.mapping(gvkConfigMap); err != nil || m.resets != 0 {
		t.Fatalf("known kind: err %v, resets %d; want nil, 0", err, m.resets)
	}
	if _, err := a.mapping(gvkWidget); err != nil || m.resets != 1 {
		t.Fatalf("kind installed since the cache was filled: err %v, resets %d; want nil, 1", err, m.resets)
	}
	unknown := schema.GroupVersionKind{Group: "nope.example", Version: "v1", Kind: "Nope"}
	if _, err := a.mapping(unknown); !meta.IsNoMatchError(err) || m.resets != 2 {
		t.Fatalf("unknown kind: err %v, resets %d; want a NoMatch error after one more reset", err, m.resets)
	}
}
