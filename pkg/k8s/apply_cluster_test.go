package k8s

import (
	"errors"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

func mustObject(t *testing.T, y string) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(y), &u.Object); err != nil {
		t.Fatal(err)
	}
	return u
}

func TestClusterApplier(t *testing.T) {
	t.Parallel()
	c := newTestClients(t, clusterConfig(t))
	ctx := t.Context()
	ns := testNamespace(ctx, t, c.cs)
	a, err := NewApplier(ApplierOptions{Dynamic: c.dyn, Mapper: NewRESTMapper(c.dc)})
	if err != nil {
		t.Fatal(err)
	}

	objs := []*unstructured.Unstructured{
		mustObject(t, `
apiVersion: v1
kind: ServiceAccount
metadata: {name: paperclip-tenant-sa, namespace: `+ns+`, labels: {paperclip.io/managed-by: kubeclip}}
`),
		mustObject(t, `
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: paperclip-tenant-role, namespace: `+ns+`}
rules: [{apiGroups: [""], resources: [pods/log], verbs: [get]}]
`),
		mustObject(t, `
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: paperclip-egress-allow, namespace: `+ns+`, labels: {paperclip.io/managed-by: kubeclip}}
spec:
  podSelector: {matchLabels: {paperclip.io/role: agent}}
  policyTypes: [Egress]
  egress:
  - to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}, podSelector: {matchLabels: {k8s-app: kube-dns}}}]
    ports: [{protocol: UDP, port: 53}, {protocol: TCP, port: 53}]
`),
		// Cluster-scoped, to check the scope comes from the mapper.
		mustObject(t, `
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: `+ns+`-reader, labels: {paperclip.io/managed-by: kubeclip-test}}
rules: [{apiGroups: [""], resources: [pods], verbs: [get]}]
`),
	}
	t.Cleanup(func() {
		// The namespace takes the rest with it; the ClusterRole must go explicitly.
		ctx, cancel := cleanupContext(ctx)
		defer cancel()
		if err := a.Delete(ctx, schema.GroupVersionKind{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "ClusterRole"}, "", ns+"-reader"); err != nil {
			t.Errorf("deleting ClusterRole: %v", err)
		}
	})

	if err := a.Apply(ctx, objs...); err != nil {
		t.Fatalf("first apply: %v", err)
	}
	versions := func() []string {
		var rvs []string
		for _, o := range objs {
			got := getObject(t, a, o)
			rvs = append(rvs, got.GetResourceVersion())
		}
		return rvs
	}
	first := versions()
	if err := a.Apply(ctx, objs...); err != nil {
		t.Fatalf("second apply: %v", err)
	}
	if second := versions(); strings.Join(first, ",") != strings.Join(second, ",") {
		t.Errorf("second apply of unchanged objects wrote them: resourceVersions %v then %v", first, second)
	}

	// Every object records kubeclip as its Apply manager.
	for _, o := range objs {
		got := getObject(t, a, o)
		var found bool
		for _, mf := range got.GetManagedFields() {
			if mf.Manager == "kubeclip" && mf.Operation == metav1.ManagedFieldsOperationApply {
				found = true
			}
		}
		if !found {
			t.Errorf("%s %s: no Apply managed-fields entry for kubeclip: %+v", o.GetKind(), o.GetName(), got.GetManagedFields())
		}
	}

	// A changed object is written; Force takes fields over from another manager.
	np := objs[2].DeepCopy()
	if err := unstructured.SetNestedStringMap(np.Object, map[string]string{"paperclip.io/role": "agent", "x": "y"}, "spec", "podSelector", "matchLabels"); err != nil {
		t.Fatal(err)
	}
	other := np.DeepCopy()
	other.SetLabels(map[string]string{"paperclip.io/managed-by": "someone-else"})
	if _, err := c.dyn.Resource(schema.GroupVersionResource{Group: "networking.k8s.io", Version: "v1", Resource: "networkpolicies"}).
		Namespace(ns).Apply(ctx, other.GetName(), other, metav1.ApplyOptions{FieldManager: "someone-else", Force: true}); err != nil {
		t.Fatalf("apply as another manager: %v", err)
	}
	if err := a.Apply(ctx, np); err != nil {
		t.Fatalf("apply after another manager took a field: %v", err)
	}
	if got := getObject(t, a, np).GetLabels()["paperclip.io/managed-by"]; got != "kubeclip" {
		t.Errorf("label after forced apply = %q, want kubeclip", got)
	}

	// API errors keep their status and name the object.
	bad := mustObject(t, `
apiVersion: v1
kind: ConfigMap
metadata: {name: Not_A_Valid_Name, namespace: `+ns+`}
`)
	err = a.Apply(ctx, bad)
	if !apierrors.IsInvalid(err) {
		t.Errorf("apply of an invalid name: %v, want an Invalid status error", err)
	}
	if want := "applying ConfigMap " + ns + "/Not_A_Valid_Name: "; err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %q does not start with %q", err, want)
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Code != 422 {
		t.Errorf("error %v: APIStatus not reachable with errors.As", err)
	}

	// A kind without a CRD.
	widget := mustObject(t, `
apiVersion: example.kubeclip.test/v1
kind: Widget
metadata: {name: w, namespace: `+ns+`}
`)
	if err := a.Apply(ctx, widget); !meta.IsNoMatchError(err) {
		t.Errorf("apply of a kind without CRD: %v, want a NoMatch error", err)
	}

	// Delete: present, then missing, then a kind without CRD.
	sa := schema.GroupVersionKind{Version: "v1", Kind: "ServiceAccount"}
	if err := a.Delete(ctx, sa, ns, "paperclip-tenant-sa"); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := c.cs.CoreV1().ServiceAccounts(ns).Get(ctx, "paperclip-tenant-sa", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after delete, get = %v, want NotFound", err)
	}
	if err := a.Delete(ctx, sa, ns, "paperclip-tenant-sa"); err != nil {
		t.Errorf("delete of a missing object: %v, want nil", err)
	}
	if err := a.Delete(ctx, widget.GroupVersionKind(), ns, "w"); err != nil {
		t.Errorf("delete of a kind without CRD: %v, want nil", err)
	}
	// The Cilium CRD is installed by the cluster harness: its kind maps, the object is missing.
	cnp := schema.GroupVersionKind{Group: "cilium.io", Version: "v2", Kind: "CiliumNetworkPolicy"}
	if err := a.Delete(ctx, cnp, ns, "paperclip-egress-fqdn"); err != nil {
		t.Errorf("delete of a missing CiliumNetworkPolicy: %v, want nil", err)
	}
}

func getObject(t *testing.T, a *Applier, o *unstructured.Unstructured) *unstructured.Unstructured {
	t.Helper()
	m, err := a.mapping(o.GroupVersionKind())
	if err != nil {
		t.Fatal(err)
	}
	ri := a.dyn.Resource(m.Resource)
	var got *unstructured.Unstructured
	if o.GetNamespace() != "" {
		got, err = ri.Namespace(o.GetNamespace()).Get(t.Context(), o.GetName(), metav1.GetOptions{})
	} else {
		got, err = ri.Get(t.Context(), o.GetName(), metav1.GetOptions{})
	}
	if err != nil {
		t.Fatalf("getting %s %s: %v", o.GetKind(), o.GetName(), err)
	}
	return got
}
