package deploy_test

import (
	"fmt"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// access is one request a worker's ServiceAccount makes, or must not be able to make.
type access struct {
	verb, group, resource, subresource, namespace string
	name                                          string // optional
}

func (a access) String() string {
	r := a.resource
	if a.group != "" {
		r += "." + a.group
	}
	if a.subresource != "" {
		r += "/" + a.subresource
	}
	ns := a.namespace
	if ns == "" {
		ns = "(cluster)"
	}
	if a.name != "" {
		r += " " + a.name
	}
	return fmt.Sprintf("%s %s in %s", a.verb, r, ns)
}

// TestRBACAllowsWhatTheCodeDoesAndNothingElse applies the overlay's RBAC and admission
// policies, and a tenant namespace as the tenant-worker renders it (with the workers'
// per-tenant RoleBindings), then asks the API server (SubjectAccessReview, as the
// ServiceAccounts) about every request each worker's code makes and about representative
// requests it must not be able to make: in the tenant, in another namespace, cluster-wide.
func TestRBACAllowsWhatTheCodeDoesAndNothingElse(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	id := shortID()
	ns := "kubeclip-rbac-" + id
	suffix := "-" + id
	objs := render(t, rendering{overlay: "dev", namespace: ns, suffix: suffix})
	c.deleteAtEnd(t, ns, objs)
	applyRBAC(t, c, objs)
	tenantNS := applyTenant(t, c, ns, suffix, "co-"+id)
	other := "kubeclip-rbac-other-" + id // a namespace that is no tenant of this installation
	c.deleteAtEnd(t, other, nil)
	if _, err := c.cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// What each worker's code calls is internal/app's table (the self-check asks about the same
	// accesses at start); tenant accesses are asked about in the tenant, the rest cluster-wide.
	tests := []struct {
		worker string
		denied []access
	}{
		{
			worker: "tenant-worker",
			denied: []access{
				{"get", "", "secrets", "", "kube-system", ""},
				{"list", "", "secrets", "", tenantNS, ""},
				{"delete", "", "namespaces", "", "", ""},
				{"create", "", "pods", "", tenantNS, ""},
				{"create", "batch", "jobs", "", tenantNS, ""},
				{"escalate", "rbac.authorization.k8s.io", "roles", "", tenantNS, ""},
				{"bind", "rbac.authorization.k8s.io", "roles", "", tenantNS, "admin"},
				{"bind", "rbac.authorization.k8s.io", "clusterroles", "", "", "cluster-admin"},
				{"create", "rbac.authorization.k8s.io", "clusterroles", "", "", ""},
				{"get", "", "pods", "", tenantNS, ""},
				// Issue 15 item 20: no pod's log anywhere (it held get pods/log cluster-wide only
				// to grant the tenant Role, which is gone), and no Role to write or bind.
				{"get", "", "pods", "log", "kube-system", ""}, {"get", "", "pods", "log", tenantNS, ""},
				{"get", "", "pods", "log", "", ""},
				{"create", "rbac.authorization.k8s.io", "roles", "", tenantNS, ""},
				{"patch", "rbac.authorization.k8s.io", "roles", "", tenantNS, ""},
				{"bind", "rbac.authorization.k8s.io", "roles", "", tenantNS, "paperclip-tenant-role"},
			},
		},
		{
			worker: "dispatcher",
			denied: []access{
				{"create", "", "namespaces", "", "", ""},
				// Issue 8.14: no longer anywhere, only in its tenants.
				{"get", "", "secrets", "", "kube-system", ""}, {"get", "", "secrets", "", other, ""},
				{"create", "batch", "jobs", "", "default", ""}, {"delete", "batch", "jobs", "", other, ""},
				{"delete", "", "pods", "", "kube-system", ""}, {"delete", "", "pods", "", ns, ""},
				{"update", "", "pods", "", "kube-system", ""}, {"update", "", "pods", "", other, ""},
				{"list", "", "secrets", "", tenantNS, ""},
				{"watch", "", "secrets", "", tenantNS, ""},
				{"get", "", "pods", "log", tenantNS, ""},
				{"create", "", "pods", "exec", tenantNS, ""},
				{"update", "batch", "jobs", "", tenantNS, ""},
				{"create", "rbac.authorization.k8s.io", "rolebindings", "", tenantNS, ""},
				{"delete", "networking.k8s.io", "networkpolicies", "", tenantNS, ""},
			},
		},
		{
			worker: "run-watcher",
			denied: []access{
				{"create", "batch", "jobs", "", tenantNS, ""},
				{"delete", "batch", "jobs", "", tenantNS, ""},
				{"delete", "", "pods", "", tenantNS, ""},
				{"get", "", "secrets", "", tenantNS, ""},
				{"create", "", "pods", "exec", tenantNS, ""},
				{"patch", "", "pods", "", tenantNS, ""},
				// Issue 8.14: logs of its tenants' pods only.
				{"get", "", "pods", "log", "kube-system", ""}, {"get", "", "pods", "log", other, ""},
			},
		},
		{
			worker: "exec-worker",
			denied: []access{
				// Exec in its tenants only: not in Kubernetes', kubeclip's or anyone else's pods.
				{"create", "", "pods", "exec", "kube-system", ""}, {"get", "", "pods", "exec", "kube-system", ""},
				{"create", "", "pods", "exec", "default", ""}, {"create", "", "pods", "exec", ns, ""},
				{"create", "", "pods", "exec", other, ""}, {"create", "", "pods", "exec", "", ""},
				{"create", "", "pods", "attach", tenantNS, ""}, {"create", "", "pods", "portforward", tenantNS, ""},
				{"get", "", "pods", "log", tenantNS, ""}, {"get", "", "pods", "", "kube-system", ""},
				{"create", "", "pods", "", tenantNS, ""}, {"patch", "", "pods", "", tenantNS, ""},
				{"delete", "", "pods", "", tenantNS, ""},
				{"get", "", "secrets", "", tenantNS, ""}, {"list", "", "secrets", "", "", ""},
				{"create", "batch", "jobs", "", tenantNS, ""},
			},
		},
		{
			// Issue 27: NATS only. internal/app lists no Kubernetes access for it, so all it is
			// asked about is denied: not even its own Secret through the API.
			worker: "credential-broker",
			denied: []access{
				{"get", "", "secrets", "", ns, "kubeclip-broker"}, {"list", "", "secrets", "", ns, ""},
				{"get", "", "secrets", "", tenantNS, ""}, {"list", "", "pods", "", "", ""},
				{"get", "", "pods", "", tenantNS, ""}, {"create", "", "pods", "exec", tenantNS, ""},
				{"list", "", "namespaces", "", "", ""}, {"create", "", "serviceaccounts", "token", ns, "credential-broker"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.worker, func(t *testing.T) {
			user := fmt.Sprintf("system:serviceaccount:%s:%s%s", ns, tc.worker, suffix)
			for _, a := range app.KubernetesAccesses(tc.worker, suffix) {
				where := ""
				if a.Tenant {
					where = tenantNS
				}
				if ok, reason := c.canI(t, user, ns, access{a.Verb, a.Group, a.Resource, a.Subresource, where, a.Name}); !ok {
					t.Errorf("%s cannot %s, which its code does (%s)", tc.worker, a, reason)
				}
			}
			for _, a := range tc.denied {
				if ok, reason := c.canI(t, user, ns, a); ok {
					t.Errorf("%s can %s, which it must not (%s)", tc.worker, a, reason)
				}
			}
		})
	}

	// The escalation check for real: as the tenant-worker, no Role can be written at all, not
	// even upstream's tenant Role (get pods/log), which kubeclip no longer renders.
	t.Run("tenant-worker cannot escalate", func(t *testing.T) {
		as := c.impersonate(t, fmt.Sprintf("system:serviceaccount:%s:tenant-worker%s", ns, suffix), ns)
		ctx := t.Context()
		for _, rule := range []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods/log"}, Verbs: []string{"get"}},
			{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get"}},
		} {
			role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: tenantNS}, Rules: []rbacv1.PolicyRule{rule}}
			_, err := as.RbacV1().Roles(tenantNS).Create(ctx, role, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			if !apierrors.IsForbidden(err) {
				t.Errorf("creating a Role granting %v %v as the tenant-worker: %v, want Forbidden", rule.Verbs, rule.Resources, err)
			}
		}
	})
}

// applyRBAC applies the overlay's ServiceAccounts, RBAC and admission policies.
func applyRBAC(t *testing.T, c *cluster, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		switch o.GetKind() {
		case "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
		default:
			continue
		}
		if err := c.apply(t.Context(), t, o, false); err != nil {
			t.Fatal(err)
		}
	}
}

// applyTenant creates company's tenant namespace as the tenant-worker would (its objects
// rendered by pkg/policy for an installation in kubeclipNS) and returns its name.
func applyTenant(t *testing.T, c *cluster, kubeclipNS, suffix, company string) string {
	t.Helper()
	return applyTenantWith(t, c, kubeclipNS, suffix, company, func(*policy.Tenant) {})
}

// applyTenantWith is applyTenant with the rendered tenant changed by edit first (as an
// administrator could change it behind kubeclip's back).
func applyTenantWith(t *testing.T, c *cluster, kubeclipNS, suffix, company string, edit func(*policy.Tenant)) string {
	t.Helper()
	op := policy.DefaultOperator()
	op.KubeclipNamespace, op.RBACNameSuffix = kubeclipNS, suffix
	ten, err := policy.RenderTenant(policy.DefaultConfig(), company, op)
	if err != nil {
		t.Fatal(err)
	}
	edit(&ten)
	objs, err := ten.Objects()
	if err != nil {
		t.Fatal(err)
	}
	c.deleteAtEnd(t, ten.Namespace.Name, nil)
	for _, o := range objs {
		if err := c.apply(t.Context(), t, o, false); err != nil {
			t.Fatal(err)
		}
	}
	return ten.Namespace.Name
}

func (c *cluster) canI(t *testing.T, user, saNamespace string, a access) (bool, string) {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + saNamespace, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource, Namespace: a.namespace, Name: a.name,
		},
	}}
	got, err := c.cs.AuthorizationV1().SubjectAccessReviews().Create(t.Context(), sar, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("SubjectAccessReview %s: %v", a, err)
	}
	return got.Status.Allowed, got.Status.Reason
}

// impersonate returns a clientset acting as the ServiceAccount user.
func (c *cluster) impersonate(t *testing.T, user, saNamespace string) kubernetes.Interface {
	t.Helper()
	cfg := rest.CopyConfig(c.cfg)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: user,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + saNamespace, "system:authenticated"},
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// impersonateDynamic returns a dynamic client acting as the ServiceAccount user.
func (c *cluster) impersonateDynamic(t *testing.T, user, saNamespace string) dynamic.Interface {
	t.Helper()
	cfg := rest.CopyConfig(c.cfg)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: user,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + saNamespace, "system:authenticated"},
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return dyn
}
