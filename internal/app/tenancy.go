package app

import (
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

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
	PrivateEgressCIDRs string

	// The operator's bounds on company knobs and tenant resources (issue 15 items 9, 10).
	RuntimeClasses               string
	DefaultRuntimeClass          string
	ServiceAccountAnnotationKeys string
	ImageAllowList               string
	PreloadedImages              string
	TenantQuota                  string

	// Reusable leases' volume claims (issue 19; docs/reuse.md, Storage for reusable leases).
	LeaseVolumeStorageClass string
	LeaseVolumeSize         string
	LeaseVolumeMinSize      string
	LeaseVolumeMaxSize      string

	// The credential broker's wiring of every tenant pod (issue 27; policy.Broker).
	BrokerAddress string
	BrokerHosts   string
	BrokerCAFile  string
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
	s.String(&t.PrivateEgressCIDRs, "private-egress-cidrs", "KUBECLIP_PRIVATE_EGRESS_CIDRS", "",
		"comma-separated private or reserved IPv4 ranges a company's egress CIDRs may open (default none: tenants reach public addresses only)")
	s.Int(&t.MaxNamespaces, "max-namespaces-per-company", "KUBECLIP_MAX_NAMESPACES_PER_COMPANY", policy.DefaultMaxNamespacesPerCompany,
		"how many tenant namespaces one company may claim")

	// Bounds on company knobs and tenant resources (issue 15 items 9, 10; docs/security.md, The operator's bounds on company knobs).
	s.String(&t.RuntimeClasses, "runtime-classes", "KUBECLIP_RUNTIME_CLASSES", "",
		"comma-separated runtimeClassName values a company's config may choose (default none: a company cannot opt out of --default-runtime-class)")
	s.String(&t.DefaultRuntimeClass, "default-runtime-class", "KUBECLIP_DEFAULT_RUNTIME_CLASS", "",
		"runtime class of every tenant pod whose config names none, such as gvisor or kata (default none: the cluster's default runtime)")
	s.String(&t.ServiceAccountAnnotationKeys, "service-account-annotation-keys", "KUBECLIP_SERVICE_ACCOUNT_ANNOTATION_KEYS", "",
		"comma-separated serviceAccountAnnotations keys a company may set on its tenant's ServiceAccount, such as eks.amazonaws.com/role-arn (default none)")
	s.String(&t.ImageAllowList, "image-allow-list", "KUBECLIP_IMAGE_ALLOW_LIST", "",
		"comma-separated image globs every tenant image must match, whatever a company's imageAllowList says (default none: the company's list alone; set it where nodes pull with their own registry credentials)")
	s.String(&t.PreloadedImages, "preloaded-images", "KUBECLIP_PRELOADED_IMAGES", strings.Join(policy.DefaultPreloadedImages, ","),
		"comma-separated image globs the nodes hold without a registry: tenant containers run them IfNotPresent, every other tenant image is pulled Always")
	s.String(&t.TenantQuota, "tenant-quota", "KUBECLIP_TENANT_QUOTA", policy.FormatResourceList(policy.DefaultTenantQuota()),
		"every tenant namespace's ResourceQuota, as name=quantity pairs separated by commas (persistentvolumeclaims and requests.storage are always counted: their defaults when not named)")

	def := policy.DefaultLeaseVolume()
	s.String(&t.LeaseVolumeStorageClass, "lease-volume-storage-class", "KUBECLIP_LEASE_VOLUME_STORAGE_CLASS", def.StorageClass,
		"storage class of every reusable lease's volume claim (default none: the cluster's default StorageClass)")
	s.String(&t.LeaseVolumeSize, "lease-volume-size", "KUBECLIP_LEASE_VOLUME_SIZE", def.DefaultSize.String(),
		"size of a reusable lease's volume claim when the company asks for none")
	s.String(&t.LeaseVolumeMinSize, "lease-volume-min-size", "KUBECLIP_LEASE_VOLUME_MIN_SIZE", def.MinSize.String(),
		"smallest volume claim size a company may ask for")
	s.String(&t.LeaseVolumeMaxSize, "lease-volume-max-size", "KUBECLIP_LEASE_VOLUME_MAX_SIZE", def.MaxSize.String(),
		"largest volume claim size a company may ask for")

	// The credential broker (issue 27; policy.Broker). The tenant-worker puts the CA in every
	// tenant namespace and opens egress to the broker; the dispatcher wires every pod it makes.
	s.String(&t.BrokerAddress, "broker-address", "KUBECLIP_BROKER_ADDRESS", "",
		"IP the bound hosts resolve to in every tenant pod (hostAliases): the credential broker Service's ClusterIP (the kustomize base passes CREDENTIAL_BROKER_SERVICE_HOST); tenant egress then reaches the bound hosts only through it. Empty: no broker wiring")
	s.String(&t.BrokerHosts, "broker-hosts", "KUBECLIP_BROKER_HOSTS", "",
		"comma-separated bound hosts, exactly the credential broker's (its --bindings, or its defaults api.anthropic.com,api.openai.com,generativelanguage.googleapis.com); needs --broker-address")
	s.String(&t.BrokerCAFile, "broker-ca-file", "KUBECLIP_BROKER_CA_FILE", "",
		"PEM file of the installation CA's certificate (public; never its key), which tenant pods trust for the bound hosts (NODE_EXTRA_CA_CERTS); its name constraints must cover --broker-hosts; needs --broker-address")
}

// broker reads the broker wiring, the CA file included; errors name the flags.
func (t Tenancy) broker(s *config.Set) (policy.Broker, error) {
	b := policy.Broker{Address: strings.TrimSpace(t.BrokerAddress), Hosts: splitList(t.BrokerHosts)}
	if path := strings.TrimSpace(t.BrokerCAFile); path != "" {
		pem, err := os.ReadFile(path)
		if err != nil {
			return policy.Broker{}, fmt.Errorf("%s: %w", s.Names("broker-ca-file"), err)
		}
		b.CACert = string(pem)
	}
	if err := b.Validate(); err != nil {
		return policy.Broker{}, fmt.Errorf("%s, %s, %s: %w", s.Names("broker-address"), s.Names("broker-hosts"), s.Names("broker-ca-file"), err)
	}
	return b, nil
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
		PrivateEgressCIDRs:      splitList(t.PrivateEgressCIDRs),

		RuntimeClasses:               splitList(t.RuntimeClasses),
		DefaultRuntimeClass:          strings.TrimSpace(t.DefaultRuntimeClass),
		ServiceAccountAnnotationKeys: splitList(t.ServiceAccountAnnotationKeys),
		ImageAllowList:               splitList(t.ImageAllowList),
		PreloadedImages:              splitList(t.PreloadedImages),
	}
	broker, err := t.broker(s)
	if err != nil {
		return policy.Operator{}, err
	}
	op.Broker = broker
	quota, err := policy.ParseResourceList(t.TenantQuota)
	if err != nil {
		return policy.Operator{}, fmt.Errorf("%s: %w", s.Names("tenant-quota"), err)
	}
	op.TenantQuota = quota
	op.LeaseVolume.StorageClass = strings.TrimSpace(t.LeaseVolumeStorageClass)
	for _, size := range []struct {
		flag, value string
		into        *resource.Quantity
	}{
		{"lease-volume-size", t.LeaseVolumeSize, &op.LeaseVolume.DefaultSize},
		{"lease-volume-min-size", t.LeaseVolumeMinSize, &op.LeaseVolume.MinSize},
		{"lease-volume-max-size", t.LeaseVolumeMaxSize, &op.LeaseVolume.MaxSize},
	} {
		q, err := resource.ParseQuantity(strings.TrimSpace(size.value))
		if err != nil {
			return policy.Operator{}, fmt.Errorf("%s: %q is not a size such as 10Gi", s.Names(size.flag), size.value)
		}
		*size.into = q
	}
	if err := op.Validate(); err != nil {
		return policy.Operator{}, fmt.Errorf("%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s: %w",
			s.Names("namespace-prefixes"), s.Names("adapter-env-keys"), s.Names("max-namespaces-per-company"), s.Names("private-egress-cidrs"),
			s.Names("runtime-classes"), s.Names("default-runtime-class"), s.Names("service-account-annotation-keys"), s.Names("tenant-quota"),
			s.Names("lease-volume-storage-class"), s.Names("lease-volume-size"), s.Names("lease-volume-min-size"), s.Names("lease-volume-max-size"), err)
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
