package app

import (
	"fmt"
	"strings"

	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// Tenancy is the operator's policy for every company, shared by the tenant-worker (which
// applies tenants) and the dispatcher (which checks the plan again before it creates a run):
// both must read the same flags.
type Tenancy struct {
	NamespacePrefixes  string
	KubeclipNamespace  string
	ReservedNamespaces string
	AdapterEnvKeys     string
	MaxNamespaces      int
	RBACNameSuffix     string
}

// Bind registers the tenancy settings on s.
func (t *Tenancy) Bind(s *config.Set) {
	s.String(&t.NamespacePrefixes, "namespace-prefixes", "KUBECLIP_NAMESPACE_PREFIXES", policy.DefaultNamespacePrefix,
		"comma-separated namespacePrefix values a company's config may use; tenant namespaces are <prefix><slug>")
	s.String(&t.KubeclipNamespace, "kubeclip-namespace", "KUBECLIP_NAMESPACE", policy.DefaultKubeclipNamespace,
		"the namespace kubeclip's workers run in: never a tenant, and the source of exec traffic tenant policies admit")
	s.String(&t.ReservedNamespaces, "reserved-namespaces", "KUBECLIP_RESERVED_NAMESPACES", policy.DefaultPaperclipServerNamespace,
		"comma-separated namespaces that are never a tenant (Kubernetes' own and kubeclip's always are)")
	s.String(&t.AdapterEnvKeys, "adapter-env-keys", "KUBECLIP_ADAPTER_ENV_KEYS", "",
		"comma-separated environment variables, beyond the built-in adapters' API keys, that a config's adapters[].envKeys may copy into a run")
	s.String(&t.RBACNameSuffix, "rbac-name-suffix", "KUBECLIP_RBAC_NAME_SUFFIX", "",
		"suffix a kustomize nameSuffix added to kubeclip's ServiceAccounts and ClusterRoles; the per-tenant RoleBindings name them with it")
	s.Int(&t.MaxNamespaces, "max-namespaces-per-company", "KUBECLIP_MAX_NAMESPACES_PER_COMPANY", policy.DefaultMaxNamespacesPerCompany,
		"how many tenant namespaces one company may claim")
}

// Operator returns the policy the settings describe; errors name the flag.
func (t Tenancy) Operator(s *config.Set) (policy.Operator, error) {
	op := policy.Operator{
		NamespacePrefixes:       splitList(t.NamespacePrefixes),
		ReservedNamespaces:      splitList(t.ReservedNamespaces),
		KubeclipNamespace:       t.KubeclipNamespace,
		RBACNameSuffix:          t.RBACNameSuffix,
		AdapterEnvKeys:          splitList(t.AdapterEnvKeys),
		MaxNamespacesPerCompany: t.MaxNamespaces,
	}
	if err := op.Validate(); err != nil {
		return policy.Operator{}, fmt.Errorf("%s, %s, %s: %w",
			s.Names("namespace-prefixes"), s.Names("adapter-env-keys"), s.Names("max-namespaces-per-company"), err)
	}
	return op, nil
}

func splitList(v string) []string {
	var out []string
	for _, item := range strings.Split(v, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}
