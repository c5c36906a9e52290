package deploy_test

import (
	"testing"
)

// TestProductionOverlayPassesServerSideDryRun renders the production overlay and sends every
// object to the API server with a server-side dry-run and strict field validation: its schema
// validation, admission (Pod Security "restricted" warns about non-compliant pod templates) and
// defaulting judge the objects, and nothing is persisted but the namespace they need.
func TestProductionOverlayPassesServerSideDryRun(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	id := shortID()
	ns := "kubeclip-dryrun-" + id
	objs := render(t, rendering{overlay: "production", namespace: ns, suffix: "-" + id})

	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
	}
	want := map[string]int{
		// Per worker a Deployment, a ServiceAccount, a cluster-wide ClusterRole (and binding), and
		// a ClusterRole the tenant-worker binds in each tenant (none for the tenant-worker itself);
		// the credential broker has a Deployment, a ServiceAccount, a Service, a NetworkPolicy and
		// no RBAC.
		// No Secret: those are the operator's, per installation. Four admission policies, each
		// with its binding: workers write only in tenants, tenant namespaces, tenant
		// RoleBindings, tenant pods.
		"Namespace": 1, "ServiceAccount": 5, "ClusterRole": 7, "ClusterRoleBinding": 4, "ConfigMap": 3,
		"Service": 3, "Deployment": 5, "StatefulSet": 1, "PodDisruptionBudget": 6, "NetworkPolicy": 2, "Secret": 0, "RoleBinding": 0,
		"ValidatingAdmissionPolicy": 4, "ValidatingAdmissionPolicyBinding": 4,
	}
	for k, n := range want {
		if kinds[k] != n {
			t.Errorf("production overlay renders %d %s, want %d (all: %v)", kinds[k], k, n, kinds)
		}
	}

	// Namespaced objects need their namespace to exist, with its Pod Security labels.
	ctx := t.Context()
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			c.deleteAtEnd(t, ns, nil)
			if err := c.apply(ctx, t, o, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.warn.take()
	for _, o := range objs {
		if err := c.apply(ctx, t, o, true); err != nil {
			t.Errorf("server-side dry-run: %v", err)
		}
		if w := c.warn.take(); len(w) > 0 {
			t.Errorf("%s %s: the API server warned: %v", o.GetKind(), o.GetName(), w)
		}
	}

	// What the overlay is for: three of each, R3 streams.
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment", "StatefulSet":
			if n := unstructuredInt(o, "spec", "replicas"); n != 3 {
				t.Errorf("%s %s has %d replicas, want 3", o.GetKind(), o.GetName(), n)
			}
		case "ConfigMap":
			data, _ := o.Object["data"].(map[string]any)
			if v, ok := data["KUBECLIP_STREAM_REPLICAS"]; ok && v != "3" {
				t.Errorf("KUBECLIP_STREAM_REPLICAS = %v, want 3", v)
			}
		}
	}
}
