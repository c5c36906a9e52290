package policy

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
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
	// PrivateEgressCIDRs are private or reserved IPv4 ranges a company's egress CIDRs may open
	// (a corporate network, say). By default none: tenant pods reach public addresses only,
	// never the cluster's pods, Services, nodes or the cloud's metadata service.
	PrivateEgressCIDRs []string

	// The operator's bounds on a company's isolation knobs and on what one tenant may use
	// (issue 15 items 9 and 10); docs/security.md (the operator's bounds)
	// says why each exists; docs/operators.md (Configuration) lists each with its flag.

	// RuntimeClasses are the runtimeClassName values a company's config may choose (default
	// none). DefaultRuntimeClass is the runtime class of every tenant pod whose config names
	// none (default none: the cluster's default runtime); it is always allowed.
	RuntimeClasses      []string
	DefaultRuntimeClass string
	// ServiceAccountAnnotationKeys are the serviceAccountAnnotations keys a company may set on
	// its tenant's ServiceAccount, such as eks.amazonaws.com/role-arn (default none: a cloud
	// identity is the operator's to hand out).
	ServiceAccountAnnotationKeys []string
	// ImageAllowList are image globs (GlobMatch) every tenant image must match, whatever the
	// company's own imageAllowList says; empty leaves images to the company's list.
	ImageAllowList []string
	// PreloadedImages are image globs the nodes hold without a registry (images loaded into the
	// container runtime): tenant containers run them IfNotPresent. Every other tenant image is
	// pulled Always, so the registry checks the pod's own credentials.
	PreloadedImages []string
	// TenantQuota is every tenant's ResourceQuota (default DefaultTenantQuota). It always
	// counts volume claims and the storage they request (storageQuota).
	TenantQuota corev1.ResourceList
	// LeaseVolume bounds reusable leases' volume claims (default DefaultLeaseVolume).
	LeaseVolume LeaseVolume

	// Broker wires every tenant pod to the credential broker (issue 27): hostAliases, the
	// installation CA, and egress to the bound hosts through the broker only. The zero Broker
	// wires nothing.
	Broker Broker
}

// DefaultTenantQuota is a tenant's ResourceQuota when the operator sets none: 20 pods, 10/20
// CPUs and 20Gi/40Gi of memory requested/limited (as before issue 15), and 20Gi/240Gi of local
// storage, so the pod count stays the binding bound (20 agent pods of
// AgentEphemeralStorageRequest/AgentEphemeralStorageLimit each); and 20 volume claims holding
// 200Gi in all for reusable leases.
func DefaultTenantQuota() corev1.ResourceList {
	return corev1.ResourceList{
		corev1.ResourcePods:                     resource.MustParse("20"),
		corev1.ResourceRequestsCPU:              resource.MustParse("10"),
		corev1.ResourceRequestsMemory:           resource.MustParse("20Gi"),
		corev1.ResourceLimitsCPU:                resource.MustParse("20"),
		corev1.ResourceLimitsMemory:             resource.MustParse("40Gi"),
		corev1.ResourceRequestsEphemeralStorage: resource.MustParse("20Gi"),
		corev1.ResourceLimitsEphemeralStorage:   resource.MustParse("240Gi"),
		// Reusable leases' volumes (issue 19): 20 claims of the default lease volume's 10Gi.
		corev1.ResourcePersistentVolumeClaims: resource.MustParse("20"),
		corev1.ResourceRequestsStorage:        resource.MustParse("200Gi"),
	}
}

// DefaultPreloadedImages are the images of the project's local cluster (hack/cluster), which
// it loads into the node rather than a registry; no production registry is named kubeclip.local.
var DefaultPreloadedImages = []string{"kubeclip.local/*"}

func (o Operator) tenantQuota() corev1.ResourceList {
	if len(o.TenantQuota) == 0 {
		return DefaultTenantQuota()
	}
	return withStorageQuota(o.TenantQuota.DeepCopy())
}

// PullPolicy is the pull policy of a tenant container running image: IfNotPresent for an image
// the nodes hold preloaded, Always for every other.
func (o Operator) PullPolicy(image string) corev1.PullPolicy {
	if allowed(image, o.PreloadedImages) {
		return corev1.PullIfNotPresent
	}
	return corev1.PullAlways
}

// RuntimeClass is the runtime class of cfg's pods: the config's own, or the operator's default.
// CheckConfig has checked the config's own is allowed.
func (o Operator) RuntimeClass(cfg Config) string {
	if cfg.RuntimeClassName != "" {
		return cfg.RuntimeClassName
	}
	return o.DefaultRuntimeClass
}

// ParseResourceList reads "name=quantity,name=quantity" (the --tenant-quota form).
func ParseResourceList(s string) (corev1.ResourceList, error) {
	out := corev1.ResourceList{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, value, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("%q: want name=quantity", item)
		}
		name = strings.TrimSpace(name)
		if len(validation.IsQualifiedName(name)) > 0 {
			return nil, fmt.Errorf("%q is not a resource name", name)
		}
		q, err := resource.ParseQuantity(strings.TrimSpace(value))
		if err != nil || q.Sign() < 0 {
			return nil, fmt.Errorf("%s=%q: want a non-negative quantity such as 20 or 40Gi", name, value)
		}
		if _, dup := out[corev1.ResourceName(name)]; dup {
			return nil, fmt.Errorf("%s is given twice", name)
		}
		out[corev1.ResourceName(name)] = q
	}
	return out, nil
}

// FormatResourceList writes l in ParseResourceList's form, names sorted.
func FormatResourceList(l corev1.ResourceList) string {
	parts := make([]string, 0, len(l))
	for _, name := range slices.Sorted(maps.Keys(l)) {
		q := l[name]
		parts = append(parts, string(name)+"="+q.String())
	}
	return strings.Join(parts, ",")
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
	if len(o.TenantQuota) == 0 {
		o.TenantQuota = DefaultTenantQuota()
	}
	o.LeaseVolume = o.leaseVolume()
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
	errs = append(errs, checkPrivateEgressCIDRs(o.PrivateEgressCIDRs)...)
	for _, rc := range append(slices.Clone(o.RuntimeClasses), o.DefaultRuntimeClass) {
		if msg := checkDNSSubdomain(rc); rc != "" && msg != "" {
			errs = append(errs, fmt.Errorf("runtime class %q %s", rc, msg))
		}
	}
	for _, k := range o.ServiceAccountAnnotationKeys {
		if msg := checkAnnotationKey(k); msg != "" {
			errs = append(errs, fmt.Errorf("service account annotation key %q %s", k, msg))
		}
	}
	if lim, ok := o.TenantQuota[corev1.ResourceLimitsEphemeralStorage]; ok {
		if agent := resource.MustParse(AgentEphemeralStorageLimit); lim.Cmp(agent) < 0 {
			errs = append(errs, fmt.Errorf("tenant quota limits.ephemeral-storage %s is below one agent pod's %s: no run could start", lim.String(), agent.String()))
		}
	}
	if !o.LeaseVolume.isZero() {
		errs = append(errs, o.LeaseVolume.validate())
	}
	errs = append(errs, o.validateStorageQuota())
	if o.MaxNamespacesPerCompany < 1 {
		errs = append(errs, errors.New("the namespace cap per company must be at least 1"))
	}
	errs = append(errs, o.Broker.Validate())
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

// CheckConfig applies the operator's bounds to a company's config, reporting every problem in
// a *ValidationError naming its field: adapter keys (CheckAdapterEnv), egress (CheckEgress),
// and the isolation knobs a company may not move past the operator: its runtime class and its
// ServiceAccount's annotations.
func (o Operator) CheckConfig(cfg Config) error {
	var errs fieldErrors
	for _, err := range []error{o.CheckAdapterEnv(cfg), o.CheckEgress(cfg), o.checkKnobs(cfg)} {
		var ve *ValidationError
		if errors.As(err, &ve) {
			errs = append(errs, ve.Errors...)
		}
	}
	return errs.err()
}

func (o Operator) checkKnobs(cfg Config) error {
	var errs fieldErrors
	if rc := cfg.RuntimeClassName; rc != "" && rc != o.DefaultRuntimeClass && !slices.Contains(o.RuntimeClasses, rc) {
		errs.add("runtimeClassName", fmt.Sprintf("%s is not a runtime class this kubeclip installation allows (allowed: %s)",
			quoteShort(rc), listOrNone(o.allowedRuntimeClasses())))
	}
	for _, k := range sortedKeys(cfg.ServiceAccountAnnotations) {
		if !slices.Contains(o.ServiceAccountAnnotationKeys, k) {
			// Never the value: it names a cloud identity.
			errs.add(keyPath("serviceAccountAnnotations", k), fmt.Sprintf("is not a ServiceAccount annotation this kubeclip installation allows (allowed: %s)",
				listOrNone(o.ServiceAccountAnnotationKeys)))
		}
	}
	return errs.err()
}

func (o Operator) allowedRuntimeClasses() []string {
	out := slices.Clone(o.RuntimeClasses)
	if o.DefaultRuntimeClass != "" && !slices.Contains(out, o.DefaultRuntimeClass) {
		out = append([]string{o.DefaultRuntimeClass}, out...)
	}
	return out
}

func listOrNone(l []string) string {
	if len(l) == 0 {
		return "none"
	}
	return strings.Join(l, ", ")
}

// CheckAdapterEnv reports envKeys naming a variable the adapter may not have and defaultEnv keys
// that would override what kubeclip or the runtime sets, naming each field.
//
// An adapter's own keys are the API keys of the built-in adapter of its type (claude_local:
// ANTHROPIC_API_KEY), whether it is the built-in or a registry entry of that type, plus the keys
// the operator hands out to every adapter (AdapterEnvKeys). A custom adapter type has only the
// operator's: naming a built-in adapter's key would copy the operator's secret for another
// adapter into its pods.
func (o Operator) CheckAdapterEnv(cfg Config) error {
	var errs fieldErrors
	for i, a := range cfg.Adapters {
		for j, k := range a.EnvKeys {
			if !o.adapterEnvAllowed(a.AdapterType, k) {
				errs.add(fmt.Sprintf("adapters[%d].envKeys[%d]", i, j),
					fmt.Sprintf("%s is not a key of adapter %s (its own: %s)", quoteShort(k), quoteShort(a.AdapterType), listOrNone(o.adapterKeys(a.AdapterType))))
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

func (o Operator) adapterEnvAllowed(adapterType, key string) bool {
	return slices.Contains(o.adapterKeys(adapterType), key)
}

// adapterKeys are the keys an adapter of adapterType may name: its built-in's, then the
// operator's.
func (o Operator) adapterKeys(adapterType string) []string {
	keys := slices.Clone(builtinAdapters[adapterType].EnvKeys)
	for _, k := range o.AdapterEnvKeys {
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	return keys
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
