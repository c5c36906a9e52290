package policy

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/broker/ca"
)

// Broker is how tenant pods reach the credential broker (issue 27; cmd/credential-broker,
// pkg/broker): the operator's setting, one for the whole installation, read from the
// tenant-worker's and the dispatcher's --broker-address, --broker-hosts and --broker-ca-file.
// The zero Broker wires nothing: pods reach the bound hosts as any other host.
//
// A pod reaches a bound host (api.anthropic.com) by the host's own name, so the agent's CLIs
// work unchanged: its /etc/hosts (hostAliases) maps every bound host to Address, and it trusts
// the installation CA the broker's leaves come from (BrokerCAFile, named by the variables of
// BrokerCAEnv). The wiring is the same for every company and every pod, and present from
// the pod's creation: a warm pod is rendered before the run (and its company's keys) binds it,
// and neither hostAliases nor a pod's volumes can change afterwards. So with the wiring on,
// every company's calls to a bound host go through the broker, which refuses one without a
// placeholder (pkg/broker ReasonMissing): the plugin replaces every brokered key, whatever the
// company (pkg/broker/mintproto), and --broker-hosts must be the broker's bound hosts, no more.
type Broker struct {
	// Address is the IP every bound host resolves to in tenant pods: the broker Service's
	// ClusterIP (in the kustomize base, the CREDENTIAL_BROKER_SERVICE_HOST Kubernetes gives
	// the workers' pods), or, in tests, wherever a broker listens on port 443. Empty: no
	// broker wiring.
	Address string
	// Hosts are the bound hosts: the hosts of the broker's bindings (its --bindings, or its
	// defaults). Each resolves to Address in the pod, and egress never allows it directly.
	Hosts []string
	// CACert is the installation CA's certificate, PEM (public: the key stays with the broker).
	// The tenant-worker puts it in every tenant namespace (BrokerCAConfigMap).
	CACert string
}

// Names and paths of the broker wiring in a tenant. The ConfigMap is the tenant-worker's, like
// every object of a tenant namespace (RenderTenant); pods only mount it.
const (
	// BrokerCAConfigMap holds the installation CA's certificate under BrokerCAKey.
	BrokerCAConfigMap = "kubeclip-broker-ca"
	BrokerCAKey       = "ca.crt"
	// BrokerCADir is where the agent container mounts it, read-only.
	BrokerCADir  = "/etc/kubeclip/broker-ca"
	BrokerCAFile = BrokerCADir + "/" + BrokerCAKey
	// EnvNodeExtraCACerts names BrokerCAFile to Node (and Bun), whose TLS then trusts the
	// installation CA besides its own roots.
	EnvNodeExtraCACerts = "NODE_EXTRA_CA_CERTS"
	// EnvCodexCACertificate names it to Codex's native CLI, which adds it to the platform's
	// roots (codex-rs's custom CA policy; it wins over SSL_CERT_FILE).
	EnvCodexCACertificate = "CODEX_CA_CERTIFICATE"
	brokerCAVolume        = "kubeclip-broker-ca"
)

// The broker's pods as kubeclip's manifests deploy them (deploy/kustomize/base/
// credential-broker.yaml; tests/deploy checks they match): the tenant egress policies admit
// them by these labels in the kubeclip namespace, on the proxy's port.
const (
	// BrokerAppLabel is the app.kubernetes.io/name of the broker's pods.
	BrokerAppLabel = "credential-broker"
	// BrokerPodPort is the proxy's port on the broker's pods (its --listen), which a pod's
	// connection to the Service's port 443 arrives at.
	BrokerPodPort = 8443
	// BrokerPort is the port pods call: https, the bound hosts' own.
	BrokerPort = 443
)

// Enabled reports whether pods are wired to a broker.
func (b Broker) Enabled() bool { return b.Address != "" }

// Validate checks the wiring, naming each flag: an address that is an IP; at least one bound
// host, each a DNS name (ca.CanonicalHost) given once; and a CA certificate that is a CA whose
// name constraints permit every bound host, since a pod would otherwise refuse the broker's
// leaf for it. The zero Broker is valid; hosts or a CA without an address are not (they would
// silently wire nothing).
func (b Broker) Validate() error {
	if !b.Enabled() {
		if len(b.Hosts) > 0 || b.CACert != "" {
			return errors.New("--broker-hosts and --broker-ca-file need --broker-address: without it no pod is wired to the broker")
		}
		return nil
	}
	var errs []error
	if addr, err := netip.ParseAddr(b.Address); err != nil || addr.Zone() != "" {
		errs = append(errs, fmt.Errorf("--broker-address %s is not an IP address (the broker Service's ClusterIP)", quoteShort(b.Address)))
	}
	if len(b.Hosts) == 0 {
		errs = append(errs, errors.New("--broker-hosts must name at least one bound host"))
	}
	for i, h := range b.Hosts {
		c, err := ca.CanonicalHost(h)
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("--broker-hosts: %w", err))
		case c != h:
			errs = append(errs, fmt.Errorf("--broker-hosts: %s must be written %s", quoteShort(h), c))
		case slices.Contains(b.Hosts[:i], h):
			errs = append(errs, fmt.Errorf("--broker-hosts: %s is given twice", h))
		}
	}
	cert, err := parseCACert(b.CACert)
	if err != nil {
		errs = append(errs, fmt.Errorf("--broker-ca-file: %w", err))
	} else {
		for _, h := range b.Hosts {
			if !permits(cert, h) {
				errs = append(errs, fmt.Errorf("--broker-ca-file: the installation CA's name constraints (%s) do not cover %s of --broker-hosts: pods would refuse the broker's certificate for it",
					listOrNone(cert.PermittedDNSDomains), h))
			}
		}
	}
	return errors.Join(errs...)
}

// parseCACert reads the one certificate of pemText, which must be a CA's.
func parseCACert(pemText string) (*x509.Certificate, error) {
	block, rest := pem.Decode([]byte(pemText))
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("want the installation CA's certificate, PEM (CERTIFICATE)")
	}
	if more, _ := pem.Decode(rest); more != nil {
		return nil, errors.New("want one certificate, the installation CA's, not a bundle")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parsing the certificate: %w", err)
	}
	if !cert.IsCA {
		return nil, errors.New("the certificate is not a CA's")
	}
	return cert, nil
}

// permits is ca.CA.Permits for a certificate alone: host is within its DNS name constraints.
func permits(cert *x509.Certificate, host string) bool {
	for _, d := range cert.PermittedDNSDomains {
		if host == d || strings.HasSuffix(host, "."+d) {
			return true
		}
	}
	return false
}

// bound reports whether fqdn is a bound host, or a pattern (*.anthropic.com) that covers one:
// egress to it must go through the broker.
func (b Broker) bound(fqdn string) bool {
	if !b.Enabled() {
		return false
	}
	f := strings.TrimSuffix(strings.ToLower(fqdn), ".")
	for _, h := range b.Hosts {
		if f == h || strings.HasPrefix(f, "*.") && strings.HasSuffix(h, f[1:]) {
			return true
		}
	}
	return false
}

// unbound is fqdns without the bound hosts (bound), for the egress policies: a brokered pod
// reaches those through the broker only.
func (b Broker) unbound(fqdns []string) []string {
	return slices.DeleteFunc(slices.Clone(fqdns), b.bound)
}

// BrokerCAEnv are the variables that name BrokerCAFile in a wired agent container: the ones
// that add a CA to a client's own roots, for the adapters' CLIs. Claude Code, Gemini and
// OpenCode run on Node or Bun (NODE_EXTRA_CA_CERTS); Codex is a native binary with a variable of
// its own (CODEX_CA_CERTIFICATE). The variables other runtimes read, SSL_CERT_FILE (OpenSSL, Go),
// REQUESTS_CA_BUNDLE (Python requests) and CURL_CA_BUNDLE, replace their trust store instead
// of adding to it: pointed at a file of one name-constrained CA they would break TLS to every
// host but the bound ones. A bundle of the system's roots plus the CA would need the image's own
// roots, which only the image knows; an image whose client reads none of these adds
// BrokerCAFile to its store itself (update-ca-certificates at start, or its own variable in
// the adapter's defaultEnv).
func BrokerCAEnv() []string { return []string{EnvNodeExtraCACerts, EnvCodexCACertificate} }

// env is the agent container's environment for the wiring: each of BrokerCAEnv names the CA.
func (b Broker) env() []corev1.EnvVar {
	if !b.Enabled() {
		return nil
	}
	var env []corev1.EnvVar
	for _, name := range BrokerCAEnv() {
		env = append(env, corev1.EnvVar{Name: name, Value: BrokerCAFile})
	}
	return env
}

// wirePod adds the wiring to an agent pod's spec: the bound hosts in /etc/hosts (hostAliases),
// and the CA's ConfigMap mounted read-only in the agent container. The ConfigMap is required,
// not optional: a pod that cannot trust the broker would fail every model call, so it waits
// (ContainerCreating, naming the ConfigMap) until the tenant-worker has applied it. env sets the
// variable.
func (b Broker) wirePod(spec *corev1.PodSpec) {
	if !b.Enabled() {
		return
	}
	spec.HostAliases = append(spec.HostAliases, corev1.HostAlias{IP: b.Address, Hostnames: slices.Clone(b.Hosts)})
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: brokerCAVolume, VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: BrokerCAConfigMap},
			Items:                []corev1.KeyToPath{{Key: BrokerCAKey, Path: BrokerCAKey}},
			DefaultMode:          ptrTo[int32](0o444),
		},
	}})
	agent := &spec.Containers[0]
	agent.VolumeMounts = append(agent.VolumeMounts, corev1.VolumeMount{Name: brokerCAVolume, MountPath: BrokerCADir, ReadOnly: true})
}

// caConfigMap is the tenant's BrokerCAConfigMap, nil without wiring.
func (b Broker) caConfigMap(namespace string) *corev1.ConfigMap {
	if !b.Enabled() {
		return nil
	}
	return &corev1.ConfigMap{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Name: BrokerCAConfigMap, Namespace: namespace, Labels: managedByLabels()},
		Data:       map[string]string{BrokerCAKey: b.CACert},
	}
}

// addressCIDR is Address as a single-address prefix.
func (b Broker) addressCIDR() string {
	addr, err := netip.ParseAddr(b.Address)
	if err != nil {
		return ""
	}
	return netip.PrefixFrom(addr, addr.BitLen()).String()
}

// egress is the broker part of a tenant's egress policy (RenderTenant), nil without wiring.
func (b Broker) egress(kubeclipNamespace string) *brokerEgress {
	if !b.Enabled() {
		return nil
	}
	return &brokerEgress{namespace: kubeclipNamespace, cidr: b.addressCIDR()}
}

// brokerEgress is what a tenant's pods may reach of the broker: its pods in kubeclip's
// namespace on the proxy's port, which is where a connection to the Service's ClusterIP arrives
// (NetworkPolicy and Cilium judge the translated destination); and Address on port 443, for a
// broker that is no pod of the cluster (a test's) and for a CNI that judges the Service address
// itself.
type brokerEgress struct {
	namespace string
	cidr      string
}

func (e *brokerEgress) podLabels() map[string]string {
	return map[string]string{"app.kubernetes.io/name": BrokerAppLabel}
}

var (
	brokerPodPortString = strconv.Itoa(BrokerPodPort)
	brokerPortString    = strconv.Itoa(BrokerPort)
)
