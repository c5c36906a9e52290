package policy

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Operator is what the installation's operator decides for every company, through worker
// flags. A company controls its own provider config and may be hostile; these bounds are what
// its config cannot move.
type Operator struct {
	// NamespacePrefixes are the namespacePrefix values a config may use (default
	// DefaultNamespacePrefix only), so tenant namespaces stay in a space the operator set aside.
	NamespacePrefixes []string
	// ReservedNamespaces can never be a tenant: kubeclip's own namespace, Paperclip's, and any
	// other the operator names. Kubernetes' own (default, kube-*) are always reserved.
	ReservedNamespaces []string
	// AdapterEnvKeys are environment variables, beyond the built-in adapters' API keys, that an
	// adapter's envKeys may name; the dispatcher copies their values from its adapter Secret or
	// its own environment into the run's Secret. Nothing else of the worker's environment can
	// reach a tenant pod.
	AdapterEnvKeys []string
	// MaxNamespacesPerCompany bounds the tenant namespaces one company can claim (changing
	// namespacePrefix or companySlug claims another), so a company cannot escape its quota by
	// minting namespaces.
	MaxNamespacesPerCompany int
	// KubeclipNamespace is where kubeclip's workers run (default DefaultKubeclipNamespace):
	// every tenant binds the workers' ServiceAccounts there to their per-tenant roles, and admits
	// sandboxd traffic from its exec-workers only. It is never a tenant.
	KubeclipNamespace string
	// RBACNameSuffix is the suffix a kustomize nameSuffix added to kubeclip's ServiceAccounts and
	// ClusterRoles (two installations sharing a cluster), so the per-tenant RoleBindings name
	// them right. Empty for the base's names.
	RBACNameSuffix string
}

// DefaultKubeclipNamespace is the namespace the kustomize base deploys kubeclip into.
const DefaultKubeclipNamespace = "kubeclip"

// DefaultMaxNamespacesPerCompany leaves room for a company to rename its slug without help,
// and no more.
const DefaultMaxNamespacesPerCompany = 3

// DefaultOperator is the operator policy when no flag says otherwise.
func DefaultOperator() Operator {
	return Operator{
		NamespacePrefixes:       []string{DefaultNamespacePrefix},
		MaxNamespacesPerCompany: DefaultMaxNamespacesPerCompany,
		KubeclipNamespace:       DefaultKubeclipNamespace,
	}
}

// WithDefaults fills the fields left zero from DefaultOperator.
func (o Operator) WithDefaults() Operator {
	def := DefaultOperator()
	if len(o.NamespacePrefixes) == 0 {
		o.NamespacePrefixes = def.NamespacePrefixes
	}
	if o.MaxNamespacesPerCompany == 0 {
		o.MaxNamespacesPerCompany = def.MaxNamespacesPerCompany
	}
	if o.KubeclipNamespace == "" {
		o.KubeclipNamespace = def.KubeclipNamespace
	}
	return o
}

// Validate checks the operator's own settings.
func (o Operator) Validate() error {
	var errs []error
	if len(o.NamespacePrefixes) == 0 {
		errs = append(errs, errors.New("at least one namespace prefix is needed"))
	}
	for _, p := range o.NamespacePrefixes {
		if !namespacePrefixRE.MatchString(p) || p[0] == '-' {
			errs = append(errs, fmt.Errorf("namespace prefix %q must be 1-32 characters of a-z, 0-9 and '-', not starting with '-'", p))
		} else if isSystemNamespace(p) {
			errs = append(errs, fmt.Errorf("namespace prefix %q would put tenants among Kubernetes' own namespaces", p))
		}
	}
	for _, k := range o.AdapterEnvKeys {
		if reason := reservedEnvKey(k); reason != "" {
			errs = append(errs, fmt.Errorf("adapter env key %q %s", k, reason))
		}
	}
	if o.MaxNamespacesPerCompany < 1 {
		errs = append(errs, errors.New("the namespace cap per company must be at least 1"))
	}
	return errors.Join(errs...)
}

// CheckNamespace reports why ns, derived from cfg, cannot be a tenant namespace under o: the
// config's namespacePrefix is not one the operator allows, or the name is Kubernetes', kubeclip's
// or another reserved namespace. The error names the config field to change.
func (o Operator) CheckNamespace(cfg Config, ns string) error {
	var errs fieldErrors
	switch {
	case !slices.Contains(o.NamespacePrefixes, cfg.NamespacePrefix):
		errs.add("namespacePrefix", fmt.Sprintf("%s is not a namespace prefix this kubeclip installation allows (allowed: %s)",
			quoteShort(cfg.NamespacePrefix), strings.Join(o.NamespacePrefixes, ", ")))
	case isSystemNamespace(ns) || slices.Contains(o.ReservedNamespaces, ns) || ns == o.KubeclipNamespace:
		field := "namespacePrefix"
		if cfg.CompanySlug != "" {
			field = "companySlug"
		}
		errs.add(field, fmt.Sprintf("tenant namespace %s is reserved and cannot hold a company's runs", quoteShort(ns)))
	}
	return errs.err()
}

// CheckAdapterEnv reports envKeys naming a variable the operator did not allow and defaultEnv
// keys that would override what kubeclip or the runtime sets, naming each field.
func (o Operator) CheckAdapterEnv(cfg Config) error {
	var errs fieldErrors
	for i, a := range cfg.Adapters {
		for j, k := range a.EnvKeys {
			if !o.adapterEnvAllowed(k) {
				errs.add(fmt.Sprintf("adapters[%d].envKeys[%d]", i, j),
					fmt.Sprintf("%s is not an adapter key this kubeclip installation hands out (the built-in adapters' keys%s)", quoteShort(k), o.extraKeysNote()))
			}
		}
		for _, k := range sortedKeys(a.DefaultEnv) {
			if reason := reservedEnvKey(k); reason != "" {
				errs.add(keyPath(fmt.Sprintf("adapters[%d].defaultEnv", i), k), reason)
			}
		}
	}
	return errs.err()
}

func (o Operator) adapterEnvAllowed(key string) bool {
	if slices.Contains(o.AdapterEnvKeys, key) {
		return true
	}
	for _, a := range builtinAdapters {
		if slices.Contains(a.EnvKeys, key) {
			return true
		}
	}
	return false
}

func (o Operator) extraKeysNote() string {
	if len(o.AdapterEnvKeys) == 0 {
		return ""
	}
	return " and " + strings.Join(o.AdapterEnvKeys, ", ")
}

// isSystemNamespace reports Kubernetes' own namespaces: default and every kube-* one.
func isSystemNamespace(ns string) bool {
	return ns == "default" || strings.HasPrefix(ns, "kube-")
}

// reservedEnvPrefixes and reservedEnvNames are variables a tenant's config must not set in its
// pod's environment: kubeclip's own settings and secrets, what Kubernetes injects, what the
// dynamic loader and the shell trust, and what the run's Secret holds for kubeclip.
var (
	reservedEnvPrefixes = []string{"KUBECLIP_", "KUBERNETES_", "LD_", "NATS_"}
	reservedEnvNames    = []string{"PATH", "HOME", "SHELL", "USER", "HOSTNAME", "IFS", "ENV", "BASH_ENV", BootstrapTokenKey}
)

// reservedEnvKey says why key may not be set by a tenant, "" when it may.
func reservedEnvKey(key string) string {
	for _, p := range reservedEnvPrefixes {
		if strings.HasPrefix(key, p) {
			return fmt.Sprintf("is reserved: %s* variables belong to kubeclip and Kubernetes", p)
		}
	}
	if slices.Contains(reservedEnvNames, key) {
		return "is reserved: kubeclip and the runtime set it"
	}
	return ""
}
