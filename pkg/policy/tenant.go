package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// Names of a tenant's objects (tenant-orchestrator.ts, plugin.ts).
const (
	TenantServiceAccount = "paperclip-tenant-sa"
	TenantResourceQuota  = "paperclip-quota"
	TenantLimitRange     = "paperclip-limits"
)

// Tenant is everything a company's namespace holds before its first run. Exactly one of
// EgressAllow (standard mode) and EgressFQDN (cilium mode) is set.
//
// Upstream creates these once and never updates them ("frozen at first provisioning");
// kubeclip server-side applies them, and uses Hash to skip an unchanged tenant and Stale to
// delete the other egress mode's policy after a mode switch.
//
// Deviation: upstream also gives the tenant ServiceAccount a Role (paperclip-tenant-role, get
// pods/log) and its RoleBinding (paperclip-tenant-rb). kubeclip renders neither: every tenant
// pod runs with automountServiceAccountToken false (RenderRun), so nothing in a tenant can use
// them, and granting that Role required the tenant-worker to hold get pods/log cluster-wide
// (issue 15 item 20). Tenants provisioned before keep theirs; they grant nothing usable.
type Tenant struct {
	Namespace      *corev1.Namespace
	ServiceAccount *corev1.ServiceAccount
	ResourceQuota  *corev1.ResourceQuota
	LimitRange     *corev1.LimitRange
	// WorkerBindings grant kubeclip's workers what they do in this namespace, and only here
	// (the per-tenant half of their RBAC; see deploy/kustomize/base/rbac-*.yaml).
	WorkerBindings []*rbacv1.RoleBinding
	// BrokerCA is the installation CA's certificate that pods wired to the credential broker
	// mount (Operator.Broker; BrokerCAConfigMap); nil without the wiring.
	BrokerCA *corev1.ConfigMap
	DenyAll  *networkingv1.NetworkPolicy
	// SandboxdIngress admits kubeclip's exec-workers and dispatchers, and nothing else, to
	// sandboxd's port.
	SandboxdIngress *networkingv1.NetworkPolicy
	EgressAllow     *networkingv1.NetworkPolicy
	EgressFQDN      *unstructured.Unstructured
}

// The per-tenant RBAC of kubeclip's workers: a RoleBinding in each tenant namespace binds the
// worker's ServiceAccount (in the kubeclip namespace) to a ClusterRole holding what the worker
// does in a tenant, so no worker needs those rights cluster-wide.
var workerTenantRoles = []struct{ serviceAccount, clusterRole string }{
	{"dispatcher", "kubeclip-tenant-dispatcher"},
	{"run-watcher", "kubeclip-tenant-run-watcher"},
	{"exec-worker", "kubeclip-tenant-exec-worker"},
}

// WorkerTenantClusterRoles are the ClusterRoles each tenant's RoleBindings bind the workers to
// (with op's name suffix): the tenant-worker must be allowed to bind them.
func WorkerTenantClusterRoles(op Operator) []string {
	names := make([]string, 0, len(workerTenantRoles))
	for _, w := range workerTenantRoles {
		names = append(names, w.clusterRole+op.RBACNameSuffix)
	}
	return names
}

// Names and labels of the sandboxd ingress rule.
const (
	SandboxdIngressPolicyName = "paperclip-sandboxd-ingress"
	// ExecWorkerAppLabel is the app.kubernetes.io/name of the exec-worker's pods (the kustomize
	// base's), admitted to sandboxd.
	ExecWorkerAppLabel = "exec-worker"
	// DispatcherAppLabel is the app.kubernetes.io/name of the dispatcher's pods, admitted to
	// sandboxd for the bind call of warm pods.
	DispatcherAppLabel = "dispatcher"
)

// RenderTenant renders a company's tenant objects (tenant-orchestrator.ts, with managed-by
// "kubeclip" and that label on every object). The egress allow-list is the FQDNs of the given
// adapters followed by the config's egressAllowFqdns, and the config's egressAllowCidrs.
// Deviation: duplicate FQDNs are dropped (upstream concatenated the lists).
//
// Upstream passes the FQDNs of the acquiring run's adapter only. With server-side apply that
// would make a tenant's policy flap between adapters, so pass every adapter the tenant may run
// (at least the config's default adapter); the variadic form lets callers pass one.
//
// op names the namespace kubeclip runs in: the tenant binds the workers' ServiceAccounts there
// and admits sandboxd traffic from its exec-workers only. When op wires pods to the credential
// broker (op.Broker), the tenant holds the installation CA's certificate (BrokerCA), its egress
// policy admits the broker, and the bound hosts are left out of its FQDNs (so the cilium mode
// never allows them directly, and a pattern covering one is left out whole: Cilium would allow
// whatever a DNS query for the bound host returns); the pods reach them through the broker.
func RenderTenant(cfg Config, companyID string, op Operator, adapters ...AdapterDefaults) (Tenant, error) {
	if err := cfg.Validate(); err != nil {
		return Tenant{}, err
	}
	// The ServiceAccount's annotations (cloud identities) are the operator's to allow; checked
	// here too, where they are rendered, whoever called.
	if err := op.checkKnobs(cfg); err != nil {
		return Tenant{}, err
	}
	ns, err := TenantNamespace(cfg, companyID)
	if err != nil {
		return Tenant{}, err
	}
	var fqdns []string
	for _, a := range adapters {
		fqdns = appendUnique(fqdns, a.AllowFqdns...)
	}
	fqdns = op.Broker.unbound(appendUnique(fqdns, cfg.EgressAllowFqdns...))

	t := Tenant{
		Namespace: &corev1.Namespace{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
			ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{
				LabelCompanyID:  companyID,
				LabelManagedBy:  ManagedBy,
				labelPSSEnforce: pssRestricted,
				labelPSSAudit:   pssRestricted,
				labelPSSWarn:    pssRestricted,
			}},
		},
		ServiceAccount: &corev1.ServiceAccount{
			TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
			ObjectMeta: metav1.ObjectMeta{
				Name: TenantServiceAccount, Namespace: ns, Labels: managedByLabels(),
				Annotations: nilIfEmpty(cfg.ServiceAccountAnnotations),
			},
		},
		ResourceQuota: &corev1.ResourceQuota{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ResourceQuota"},
			ObjectMeta: metav1.ObjectMeta{Name: TenantResourceQuota, Namespace: ns, Labels: managedByLabels()},
			Spec:       corev1.ResourceQuotaSpec{Hard: op.tenantQuota()},
		},
		LimitRange: &corev1.LimitRange{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "LimitRange"},
			ObjectMeta: metav1.ObjectMeta{Name: TenantLimitRange, Namespace: ns, Labels: managedByLabels()},
			Spec: corev1.LimitRangeSpec{Limits: []corev1.LimitRangeItem{{
				Type:           corev1.LimitTypeContainer,
				Max:            withEphemeralStorage(cpuMem(limitRangeMax), AgentEphemeralStorageLimit),
				Min:            cpuMem(limitRangeMin),
				Default:        withEphemeralStorage(cpuMem(limitRangeDef), limitRangeDefEphemeral),
				DefaultRequest: withEphemeralStorage(cpuMem(limitRangeDefRq), limitRangeDefRqEphemeral),
			}, op.claimLimits()}},
		},
		BrokerCA:        op.Broker.caConfigMap(ns),
		DenyAll:         denyAllPolicy(ns),
		SandboxdIngress: sandboxdIngressPolicy(ns, op.KubeclipNamespace),
	}
	for _, w := range workerTenantRoles {
		t.WorkerBindings = append(t.WorkerBindings, &rbacv1.RoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: "kubeclip-" + w.serviceAccount, Namespace: ns, Labels: managedByLabels()},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: w.clusterRole + op.RBACNameSuffix},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: w.serviceAccount + op.RBACNameSuffix, Namespace: op.KubeclipNamespace}},
		})
	}
	in := egressInput{
		namespace:   ns,
		selector:    map[string]string{LabelRole: RoleAgent},
		fqdns:       fqdns,
		cidrs:       slices.Clone(cfg.EgressAllowCidrs),
		includeBase: true,
		serverNS:    cfg.PaperclipServerNamespace,
		serverPods:  cfg.PaperclipServerPodLabels,
		denyCIDRs:   op.EgressDenyCIDRs(),
		broker:      op.Broker.egress(op.KubeclipNamespace),
	}
	if cfg.EgressMode == EgressCilium {
		in.name = EgressFQDNPolicyName
		t.EgressFQDN = ciliumPolicy(in)
	} else {
		in.name = EgressAllowPolicyName
		t.EgressAllow = egressNetworkPolicy(in)
	}
	return t, nil
}

// Objects returns the tenant's objects in apply order (Namespace, ServiceAccount, the workers'
// RoleBindings, ResourceQuota, LimitRange, the broker's CA when wired, deny-all, sandboxd
// ingress, egress policy), with apiVersion and kind set, ready for server-side apply. They are
// copies.
func (t Tenant) Objects() ([]*unstructured.Unstructured, error) {
	typed := []runtime.Object{t.Namespace, t.ServiceAccount}
	for _, b := range t.WorkerBindings {
		typed = append(typed, b)
	}
	typed = append(typed, t.ResourceQuota, t.LimitRange)
	if t.BrokerCA != nil {
		typed = append(typed, t.BrokerCA)
	}
	typed = append(typed, t.DenyAll)
	if t.SandboxdIngress != nil {
		typed = append(typed, t.SandboxdIngress)
	}
	if t.EgressAllow != nil {
		typed = append(typed, t.EgressAllow)
	}
	out := make([]*unstructured.Unstructured, 0, len(typed)+1)
	for _, o := range typed {
		u, err := toUnstructured(o)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	if t.EgressFQDN != nil {
		out = append(out, t.EgressFQDN.DeepCopy())
	}
	return out, nil
}

// Hash is the hex sha256 of the canonical JSON of Objects (keys sorted, objects in apply
// order). A tenant whose hash matches the last applied one need not be applied again. If the
// objects cannot be encoded it returns "", which matches no recorded hash, so the caller
// re-applies and meets the error from Objects.
func (t Tenant) Hash() string {
	objs, err := t.Objects()
	if err != nil {
		return ""
	}
	h := sha256.New()
	for _, o := range objs {
		data, err := json.Marshal(o.Object) // encoding/json sorts map keys
		if err != nil {
			return ""
		}
		h.Write(data)
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Stale names the egress policy of the other egress mode, which a tenant that switched mode
// must delete (upstream left it in place). NotFound, and a missing Cilium CRD when deleting the
// CiliumNetworkPolicy, both mean there is nothing to delete.
func (t Tenant) Stale() []ObjectRef {
	if t.Namespace == nil {
		return nil
	}
	ns := t.Namespace.Name
	if t.EgressFQDN != nil {
		return []ObjectRef{{GVK: NetworkPolicyGVK, GVR: NetworkPolicyGVR, Namespace: ns, Name: EgressAllowPolicyName}}
	}
	return []ObjectRef{{GVK: CiliumNetworkPolicyGVK, GVR: CiliumNetworkPolicyGVR, Namespace: ns, Name: EgressFQDNPolicyName}}
}

// The LimitRange's local storage for a container that names none (sandboxd's init container,
// which copies one binary): the tenant quota counts ephemeral storage, so every container must
// ask for some, and none may write without bound.
const (
	limitRangeDefEphemeral   = "1Gi"
	limitRangeDefRqEphemeral = "64Mi"
)

func withEphemeralStorage(l corev1.ResourceList, q string) corev1.ResourceList {
	l[corev1.ResourceEphemeralStorage] = resource.MustParse(q)
	return l
}

func cpuMem(r ResourceList) corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourceCPU:    resource.MustParse(r.CPU),
		corev1.ResourceMemory: resource.MustParse(r.Memory),
	}
}

func nilIfEmpty(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return cloneMap(m)
}

func appendUnique(dst []string, vals ...string) []string {
	for _, v := range vals {
		if !slices.Contains(dst, v) {
			dst = append(dst, v)
		}
	}
	return dst
}
