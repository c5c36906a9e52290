package policy

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Names of the tenant's network policies.
const (
	DenyAllPolicyName     = "paperclip-deny-all"
	EgressAllowPolicyName = "paperclip-egress-allow"
	EgressFQDNPolicyName  = "paperclip-egress-fqdn"
)

// The Paperclip server's callback port, which agents reach.
const paperclipServerPort = 3100

// publicIPv4Except is what the public-IPv4 fallback rule carves out of 0.0.0.0/0
// (network-policy.ts, exactly): this-network, private, CGNAT, loopback, link-local (cloud
// metadata) and multicast.
var publicIPv4Except = []string{
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8",
	"169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16", "224.0.0.0/4",
}

// egressInput is buildNetworkPolicyManifests' and buildCiliumNetworkPolicyManifest's input.
type egressInput struct {
	namespace   string
	name        string
	selector    map[string]string
	fqdns       []string
	cidrs       []string
	includeBase bool // the DNS and Paperclip-server rules
	serverNS    string
	serverPods  map[string]string
	owner       *metav1.OwnerReference
	// denyCIDRs are ranges a Cilium policy denies outright (Operator.EgressDenyCIDRs).
	denyCIDRs []string
	// broker, when set, is the credential broker the pods reach (Broker.egress); fqdns hold no
	// bound host then (Broker.unbound).
	broker *brokerEgress
}

func managedByLabels() map[string]string {
	return map[string]string{LabelManagedBy: ManagedBy}
}

func denyAllPolicy(namespace string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: DenyAllPolicyName, Namespace: namespace, Labels: managedByLabels()},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
		},
	}
}

// sandboxdIngressPolicy admits the exec-workers of kubeclip's namespace to sandboxd on the
// tenant's agent pods, and its dispatchers (which bind warm pods: the bind call); the deny-all
// policy keeps everything else out, other tenants' pods included. (sandboxd also authenticates
// every connection with the lease's key, or a warm pod's bind key.)
func sandboxdIngressPolicy(namespace, kubeclipNamespace string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: SandboxdIngressPolicyName, Namespace: namespace, Labels: managedByLabels()},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{LabelRole: RoleAgent}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": kubeclipNamespace}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": ExecWorkerAppLabel}},
				}, {
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": kubeclipNamespace}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": DispatcherAppLabel}},
				}},
				Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, SandboxdPort)},
			}},
		},
	}
}

func port(proto corev1.Protocol, n int32) networkingv1.NetworkPolicyPort {
	p := intstr.FromInt32(n)
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &p}
}

// egressNetworkPolicy renders the standard-mode egress allow policy. Kubernetes NetworkPolicy
// cannot name FQDNs, so when FQDNs are wanted and no CIDR is given it allows public IPv4 on
// TCP 443 and 80 (the fallback upstream added when standard mode blocked LLM APIs, paperclip#5790).
// CIDR rules are not port-scoped. Pods wired to the credential broker may reach its pods on the
// proxy's port and its address on 443 (after the DNS and server rules).
//
// Standard mode cannot refuse a bound host by name: what keeps its pods from api.anthropic.com
// is that the bound hosts are dropped from the FQDNs, so a tenant whose other FQDNs are all bound
// hosts gets no public-IPv4 fallback at all; one with other FQDNs or CIDRs can reach the bound
// hosts' addresses, and only the cilium mode refuses them (the placeholder a pod holds is
// worthless there anyway: only the broker swaps it).
func egressNetworkPolicy(in egressInput) *networkingv1.NetworkPolicy {
	var rules []networkingv1.NetworkPolicyEgressRule
	if in.includeBase {
		rules = append(rules,
			networkingv1.NetworkPolicyEgressRule{
				To: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "kube-system"}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"k8s-app": "kube-dns"}},
				}},
				Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolUDP, 53), port(corev1.ProtocolTCP, 53)},
			},
			networkingv1.NetworkPolicyEgressRule{
				To: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": in.serverNS}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: cloneMap(in.serverPods)},
				}},
				Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, paperclipServerPort)},
			},
		)
	}
	if b := in.broker; b != nil {
		rules = append(rules,
			networkingv1.NetworkPolicyEgressRule{
				To: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": b.namespace}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: b.podLabels()},
				}},
				Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, BrokerPodPort)},
			},
			networkingv1.NetworkPolicyEgressRule{
				To:    []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: b.cidr}}},
				Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, BrokerPort)},
			},
		)
	}
	for _, cidr := range in.cidrs {
		rules = append(rules, networkingv1.NetworkPolicyEgressRule{
			To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: cidr}}},
		})
	}
	if len(in.cidrs) == 0 && len(in.fqdns) > 0 {
		rules = append(rules, networkingv1.NetworkPolicyEgressRule{
			To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{
				CIDR: "0.0.0.0/0", Except: append([]string(nil), publicIPv4Except...),
			}}},
			Ports: []networkingv1.NetworkPolicyPort{port(corev1.ProtocolTCP, 443), port(corev1.ProtocolTCP, 80)},
		})
	}
	np := &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: in.name, Namespace: in.namespace, Labels: managedByLabels()},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: cloneMap(in.selector)},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress:      rules,
		},
	}
	if in.owner != nil {
		np.OwnerReferences = []metav1.OwnerReference{*in.owner}
	}
	return np
}

// ciliumPolicy renders the cilium-mode egress policy (cilium.io/v2 CiliumNetworkPolicy):
// kube-dns with DNS inspection, the FQDNs on TCP 443, the Paperclip server on TCP 3100, the
// credential broker (its pods on the proxy's port, its address on 443) when pods are wired to
// one, and the CIDRs (any port), in that order; then, as egressDeny, the denied ranges. The deny rule
// binds every policy that selects the same pods (deny wins over allow in Cilium), the run's
// scoped egress policies included, and it does not touch the kube-dns and server rules: CIDR
// selectors never select the cluster's own endpoints.
//
// Deviation: a "*.example.com" FQDN is rendered as toFQDNs matchPattern; upstream put every
// FQDN in matchName, whose schema rejects '*'.
func ciliumPolicy(in egressInput) *unstructured.Unstructured {
	var egress []any
	if in.includeBase {
		egress = append(egress, map[string]any{
			"toEndpoints": []any{map[string]any{"matchLabels": map[string]any{
				"k8s:io.kubernetes.pod.namespace": "kube-system",
				"k8s-app":                         "kube-dns",
			}}},
			"toPorts": []any{map[string]any{
				"ports": []any{
					map[string]any{"port": "53", "protocol": "UDP"},
					map[string]any{"port": "53", "protocol": "TCP"},
				},
				"rules": map[string]any{"dns": []any{map[string]any{"matchPattern": "*"}}},
			}},
		})
	}
	if len(in.fqdns) > 0 {
		fqdns := make([]any, 0, len(in.fqdns))
		for _, f := range in.fqdns {
			if strings.HasPrefix(f, "*.") {
				fqdns = append(fqdns, map[string]any{"matchPattern": f})
			} else {
				fqdns = append(fqdns, map[string]any{"matchName": f})
			}
		}
		egress = append(egress, map[string]any{
			"toFQDNs": fqdns,
			"toPorts": []any{map[string]any{"ports": []any{map[string]any{"port": "443", "protocol": "TCP"}}}},
		})
	}
	if in.includeBase {
		server := stringMapToAny(in.serverPods)
		server["k8s:io.kubernetes.pod.namespace"] = in.serverNS
		egress = append(egress, map[string]any{
			"toEndpoints": []any{map[string]any{"matchLabels": server}},
			"toPorts":     []any{map[string]any{"ports": []any{map[string]any{"port": "3100", "protocol": "TCP"}}}},
		})
	}
	if b := in.broker; b != nil {
		broker := stringMapToAny(b.podLabels())
		broker["k8s:io.kubernetes.pod.namespace"] = b.namespace
		egress = append(egress,
			map[string]any{
				"toEndpoints": []any{map[string]any{"matchLabels": broker}},
				"toPorts":     []any{map[string]any{"ports": []any{map[string]any{"port": brokerPodPortString, "protocol": "TCP"}}}},
			},
			map[string]any{
				"toCIDRSet": []any{map[string]any{"cidr": b.cidr}},
				"toPorts":   []any{map[string]any{"ports": []any{map[string]any{"port": brokerPortString, "protocol": "TCP"}}}},
			},
		)
	}
	if len(in.cidrs) > 0 {
		set := make([]any, 0, len(in.cidrs))
		for _, c := range in.cidrs {
			set = append(set, map[string]any{"cidr": c})
		}
		egress = append(egress, map[string]any{"toCIDRSet": set})
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": CiliumNetworkPolicyGVK.GroupVersion().String(),
		"kind":       CiliumNetworkPolicyGVK.Kind,
		"metadata": map[string]any{
			"name":      in.name,
			"namespace": in.namespace,
			"labels":    stringMapToAny(managedByLabels()),
		},
		"spec": map[string]any{
			"endpointSelector": map[string]any{"matchLabels": stringMapToAny(in.selector)},
			"egress":           egress,
		},
	}}
	if len(in.denyCIDRs) > 0 {
		set := make([]any, 0, len(in.denyCIDRs))
		for _, c := range in.denyCIDRs {
			set = append(set, map[string]any{"cidr": c})
		}
		u.Object["spec"].(map[string]any)["egressDeny"] = []any{map[string]any{"toCIDRSet": set}}
	}
	if in.owner != nil {
		u.SetOwnerReferences([]metav1.OwnerReference{*in.owner})
	}
	return u
}

func cloneMap(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
