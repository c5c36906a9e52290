package app_test

import (
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/ops"
)

func TestAccessNames(t *testing.T) {
	tests := []struct {
		a    app.Access
		want string
	}{
		{app.Access{Verb: "watch", Resource: "events"}, "watch events in all namespaces"},
		{app.Access{Verb: "list", Group: "batch", Resource: "jobs"}, "list jobs.batch in all namespaces"},
		{app.Access{Verb: "create", Resource: "namespaces"}, "create namespaces cluster-wide"},
		{app.Access{Verb: "create", Resource: "pods", Subresource: "exec", Tenant: true}, "create pods/exec in tenant namespaces"},
		{app.Access{Verb: "bind", Group: "rbac.authorization.k8s.io", Resource: "clusterroles", Name: "kubeclip-tenant-dispatcher-x"},
			"bind clusterroles.rbac.authorization.k8s.io kubeclip-tenant-dispatcher-x cluster-wide"},
	}
	for _, tc := range tests {
		if got := tc.a.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.a, got, tc.want)
		}
	}
}

// TestTenantWorkerBindsTheSuffixedTenantRoles: the tenant-worker's self-check asks about binding
// the ClusterRoles its RoleBindings name, with the operator's suffix.
func TestTenantWorkerBindsTheSuffixedTenantRoles(t *testing.T) {
	var binds []string
	for _, a := range app.KubernetesAccesses("tenant-worker", "-x") {
		if a.Verb == "bind" {
			binds = append(binds, a.Name)
		}
	}
	want := []string{"kubeclip-tenant-dispatcher-x", "kubeclip-tenant-run-watcher-x", "kubeclip-tenant-exec-worker-x"}
	if !slices.Equal(binds, want) {
		t.Errorf("binds %v, want %v", binds, want)
	}
}

// TestEveryWorkerHasASelfCheck: each worker's permissions, Kubernetes and NATS, make a valid
// self-check (no name twice, each kind known) with something of each kind to check (the
// credential broker, which has no Kubernetes client, NATS only).
func TestEveryWorkerHasASelfCheck(t *testing.T) {
	for worker := range workerUsers {
		t.Run(worker, func(t *testing.T) {
			c := workerCommon(t, worker, "nats://127.0.0.1:1")
			s, err := c.Subjects()
			if err != nil {
				t.Fatal(err)
			}
			probes := c.NATSProbes(worker)
			defer probes.Close()
			perms := c.NATSPermissions(worker, s, probes)
			kube := 0
			for _, a := range app.KubernetesAccesses(worker, "") {
				if !a.Tenant {
					perms = append(perms, ops.KubernetesAccess(nil, a.String(), a.Attributes()))
					kube++
				}
			}
			if kube == 0 && worker != "credential-broker" {
				t.Errorf("%s checks no Kubernetes access at start", worker)
			}
			if _, err := ops.NewSelfCheck(ops.SelfCheckOptions{Permissions: perms, Registerer: prometheus.NewRegistry()}); err != nil {
				t.Error(err)
			}
		})
	}
}
