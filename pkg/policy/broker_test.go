package policy_test

import (
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kubeclip/kubeclip/pkg/broker/ca"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// testBrokerAddress stands for the broker Service's ClusterIP.
const testBrokerAddress = "10.96.0.42"

var testBoundHosts = []string{"api.anthropic.com", "api.openai.com"}

var (
	testCAOnce sync.Once
	testCAPEM  string
)

// testCACert is a real installation CA's certificate for testBoundHosts (pkg/broker/ca, as
// `credential-broker ca` makes it). Its PEM is random, so goldens never hold it.
func testCACert(t *testing.T) string {
	t.Helper()
	testCAOnce.Do(func() {
		authority, err := ca.Generate(ca.Options{Hosts: testBoundHosts})
		if err == nil {
			testCAPEM = string(authority.CertPEM())
		}
	})
	if testCAPEM == "" {
		t.Fatal("generating the test installation CA failed")
	}
	return testCAPEM
}

func testBroker(t *testing.T) policy.Broker {
	return policy.Broker{Address: testBrokerAddress, Hosts: slices.Clone(testBoundHosts), CACert: testCACert(t)}
}

// brokerOperator is testOperator wired to the broker.
func brokerOperator(t *testing.T) policy.Operator {
	op := testOperator()
	op.Broker = testBroker(t)
	return op
}

func TestBrokerValidate(t *testing.T) {
	caPEM := testCACert(t)
	other, err := ca.Generate(ca.Options{Hosts: []string{"api.anthropic.com"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		b       policy.Broker
		wantErr []string // substrings, each naming the flag at fault
	}{
		{name: "zero: no wiring", b: policy.Broker{}},
		{name: "wired", b: testBroker(t)},
		{name: "IPv6", b: policy.Broker{Address: "fd00:10:96::42", Hosts: testBoundHosts, CACert: caPEM}},
		{name: "hosts without an address", b: policy.Broker{Hosts: testBoundHosts, CACert: caPEM},
			wantErr: []string{"need --broker-address"}},
		{name: "a name, not an IP", b: policy.Broker{Address: "credential-broker.kubeclip.svc", Hosts: testBoundHosts, CACert: caPEM},
			wantErr: []string{`--broker-address "credential-broker.kubeclip.svc" is not an IP address`}},
		{name: "an unexpanded service link", b: policy.Broker{Address: "$(CREDENTIAL_BROKER_SERVICE_HOST)", Hosts: testBoundHosts, CACert: caPEM},
			wantErr: []string{"--broker-address"}},
		{name: "no hosts", b: policy.Broker{Address: testBrokerAddress, CACert: caPEM},
			wantErr: []string{"--broker-hosts must name at least one bound host"}},
		{name: "hosts as written", b: policy.Broker{Address: testBrokerAddress, Hosts: []string{"API.anthropic.com", "api.openai.com", "api.openai.com", "*.openai.com"}, CACert: caPEM},
			wantErr: []string{`"API.anthropic.com" must be written api.anthropic.com`, "api.openai.com is given twice", "--broker-hosts: \"*.openai.com\""}},
		{name: "no CA", b: policy.Broker{Address: testBrokerAddress, Hosts: testBoundHosts},
			wantErr: []string{"--broker-ca-file: want the installation CA's certificate"}},
		{name: "a CA that does not cover a host", b: policy.Broker{Address: testBrokerAddress, Hosts: testBoundHosts, CACert: string(other.CertPEM())},
			wantErr: []string{"--broker-ca-file: the installation CA's name constraints (api.anthropic.com) do not cover api.openai.com"}},
		{name: "a bundle", b: policy.Broker{Address: testBrokerAddress, Hosts: testBoundHosts, CACert: caPEM + caPEM},
			wantErr: []string{"--broker-ca-file: want one certificate"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.b.Validate()
			if len(tc.wantErr) == 0 {
				if err != nil {
					t.Fatalf("Validate: %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate: nil, want errors %q", tc.wantErr)
			}
			for _, w := range tc.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate: %v\nwant it to contain %q", err, w)
				}
			}
			// The operator's Validate carries it.
			op := policy.DefaultOperator()
			op.Broker = tc.b
			if opErr := op.Validate(); opErr == nil || !strings.Contains(opErr.Error(), tc.wantErr[0]) {
				t.Errorf("Operator.Validate: %v, want the broker's error", opErr)
			}
		})
	}
}

// agentWiring is what a pod spec holds of the broker wiring: its hostAliases, the CA volume's
// source, the agent container's mount of it and the variables that name it (NAME=value, in the
// container's order, each time one is set).
type agentWiring struct {
	HostAliases []corev1.HostAlias
	CAVolume    *corev1.ConfigMapVolumeSource
	CAMount     *corev1.VolumeMount
	CAEnv       []string
}

func wiringOf(spec corev1.PodSpec) agentWiring {
	var w agentWiring
	w.HostAliases = spec.HostAliases
	var volume string
	for _, v := range spec.Volumes {
		if v.ConfigMap != nil && v.ConfigMap.Name == policy.BrokerCAConfigMap {
			w.CAVolume, volume = v.ConfigMap, v.Name
		}
	}
	agent := spec.Containers[0]
	for _, m := range agent.VolumeMounts {
		if volume != "" && m.Name == volume {
			w.CAMount = &m
		}
	}
	for _, e := range agent.Env {
		if slices.Contains(policy.BrokerCAEnv(), e.Name) {
			w.CAEnv = append(w.CAEnv, e.Name+"="+e.Value)
		}
	}
	return w
}

// Every run pod of every backend, and a warm pod from its creation, resolves the bound hosts to
// the broker, mounts the installation CA read-only and names it to Node; without the wiring
// none has any of it.
func TestBrokerWiringOfEveryPod(t *testing.T) {
	mode := int32(0o444)
	want := agentWiring{
		HostAliases: []corev1.HostAlias{{IP: testBrokerAddress, Hostnames: testBoundHosts}},
		CAVolume: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: policy.BrokerCAConfigMap},
			Items:                []corev1.KeyToPath{{Key: policy.BrokerCAKey, Path: policy.BrokerCAKey}},
			DefaultMode:          &mode,
		},
		CAMount: &corev1.VolumeMount{Name: "kubeclip-broker-ca", MountPath: policy.BrokerCADir, ReadOnly: true},
		CAEnv:   []string{"NODE_EXTRA_CA_CERTS=" + policy.BrokerCAFile, "CODEX_CA_CERTIFICATE=" + policy.BrokerCAFile},
	}
	if policy.BrokerCAFile != "/etc/kubeclip/broker-ca/ca.crt" {
		t.Errorf("BrokerCAFile = %s", policy.BrokerCAFile)
	}
	pods := func(spec policy.RunSpec) map[string]corev1.PodSpec {
		reusable := spec
		pvc, err := policy.DefaultOperator().RenderLeaseClaim(policy.LeaseClaim{Namespace: spec.Namespace, Name: "pc-claim", RunID: spec.RunID, CompanyID: spec.CompanyID, AgentID: spec.AgentID})
		if err != nil {
			t.Fatal(err)
		}
		reusable.VolumeClaim = pvc
		warm, _ := policy.RenderWarmPod(policy.WarmSpec(spec), "pc-warm-1", make([]byte, 32))
		sandbox := &corev1.PodTemplate{}
		tmpl, _ := policy.RenderSandbox(spec, policy.SandboxAPIVersionV1beta1).Object["spec"].(map[string]any)["podTemplate"].(map[string]any)
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(map[string]any{"template": tmpl}, sandbox); err != nil {
			t.Fatal(err)
		}
		return map[string]corev1.PodSpec{
			"job":             policy.RenderJob(spec).Spec.Template.Spec,
			"pod":             policy.RenderPod(spec).Spec,
			"pod (reusable)":  policy.RenderPod(reusable).Spec,
			"sandbox-cr":      sandbox.Template.Spec,
			"warm pod":        warm.Spec,
			"warm pod, bound": boundWarm(t, spec, warm),
		}
	}
	cfg := mustConfig(t, `{}`)
	wired := testRunSpec(cfg)
	wired.Broker = testBroker(t)
	for name, spec := range pods(wired) {
		if diff := cmp.Diff(want, wiringOf(spec)); diff != "" {
			t.Errorf("%s: broker wiring (-want +got):\n%s", name, diff)
		}
	}
	for name, spec := range pods(testRunSpec(cfg)) {
		if diff := cmp.Diff(agentWiring{}, wiringOf(spec)); diff != "" {
			t.Errorf("%s without a broker: wiring (-want +got):\n%s", name, diff)
		}
	}
	// A warm pool's shape says whether its pods are wired: an acquire never binds one of the
	// other kind.
	if policy.WarmShape(wired) == policy.WarmShape(testRunSpec(cfg)) {
		t.Error("a wired warm pod has the shape of an unwired one")
	}
}

func boundWarm(t *testing.T, spec policy.RunSpec, warm *corev1.Pod) corev1.PodSpec {
	t.Helper()
	pod := warm.DeepCopy()
	spec.WorkloadName = pod.Name
	policy.BindWarmPod(pod, spec, pod.CreationTimestamp.Time)
	return pod.Spec
}

// The tenant of an installation wired to the broker holds its CA certificate, as a ConfigMap
// the tenant-worker applies before the egress policies; one without the wiring holds none.
func TestBrokerTenantHoldsTheCA(t *testing.T) {
	cfg := mustConfig(t, `{}`)
	ten, err := policy.RenderTenant(cfg, testCompanyID, brokerOperator(t), mustAdapter(t, cfg, "claude_local"))
	if err != nil {
		t.Fatal(err)
	}
	if ten.BrokerCA == nil || ten.BrokerCA.Data[policy.BrokerCAKey] != testCACert(t) {
		t.Fatalf("tenant BrokerCA = %+v, want the CA's certificate under %s", ten.BrokerCA, policy.BrokerCAKey)
	}
	objs, err := ten.Objects()
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, o := range objs {
		kinds = append(kinds, o.GetKind()+"/"+o.GetName())
	}
	at := slices.Index(kinds, "ConfigMap/"+policy.BrokerCAConfigMap)
	if at < 0 || at > slices.Index(kinds, "NetworkPolicy/"+policy.DenyAllPolicyName) {
		t.Errorf("apply order %v: want the CA ConfigMap, before the network policies", kinds)
	}
	cm := ten.BrokerCA.DeepCopy()
	cm.Data[policy.BrokerCAKey] = "<the installation CA's certificate>"
	checkGoldenUnstructured(t, "tenant/configmap-broker-ca.yaml", cm)

	plain := mustTenant(t, cfg, mustAdapter(t, cfg, "claude_local"))
	if plain.BrokerCA != nil {
		t.Errorf("a tenant without broker wiring holds %s", plain.BrokerCA.Name)
	}
	if plain.Hash() == ten.Hash() {
		t.Error("the wired tenant hashes like the unwired one: the tenant-worker would not apply the CA")
	}
}

// Issue 27, egress forces the broker: a wired tenant's cilium policy allows no bound host
// directly (neither by name nor by a pattern covering it) but keeps the company's other FQDNs;
// it allows the broker's pods on the proxy's port and the broker's address on 443, which its
// deny rule does not take back. The standard mode admits the broker alike, and a tenant whose
// FQDNs are all bound hosts loses the public-IPv4 fallback.
func TestBrokeredEgressForcesTheBroker(t *testing.T) {
	op := brokerOperator(t)
	cilium := mustConfig(t, `{"egressMode": "cilium", "egressAllowFqdns": ["github.com", "*.anthropic.com", "api.openai.com"],
		"paperclipServerPodLabels": {"app.kubernetes.io/name": "paperclip"}}`)
	ten, err := policy.RenderTenant(cilium, testCompanyID, op, mustAdapter(t, cilium, "opencode_local"))
	if err != nil {
		t.Fatal(err)
	}
	spec := ten.EgressFQDN.Object["spec"].(map[string]any)
	var fqdns []string
	var broker, address bool
	for _, r := range asSlice(spec["egress"]) {
		rule := r.(map[string]any)
		for _, f := range asSlice(rule["toFQDNs"]) {
			m := f.(map[string]any)
			fqdns = append(fqdns, strings.TrimSpace(anyString(m["matchName"])+anyString(m["matchPattern"])))
		}
		ports := portsOf(rule)
		for _, e := range asSlice(rule["toEndpoints"]) {
			labels := e.(map[string]any)["matchLabels"].(map[string]any)
			if labels["app.kubernetes.io/name"] == policy.BrokerAppLabel && labels["k8s:io.kubernetes.pod.namespace"] == op.KubeclipNamespace &&
				slices.Equal(ports, []string{"8443/TCP"}) {
				broker = true
			}
		}
		for _, c := range asSlice(rule["toCIDRSet"]) {
			if c.(map[string]any)["cidr"] == testBrokerAddress+"/32" && slices.Equal(ports, []string{"443/TCP"}) {
				address = true
			}
		}
	}
	// opencode_local's FQDNs are api.anthropic.com, api.openai.com and openrouter.ai.
	if want := []string{"openrouter.ai", "github.com"}; !slices.Equal(fqdns, want) {
		t.Errorf("toFQDNs = %v, want %v (no bound host, nor a pattern covering one)", fqdns, want)
	}
	if !broker || !address {
		t.Errorf("the broker's pods on 8443 allowed: %v; its address on 443 allowed: %v; want both", broker, address)
	}
	for _, p := range ciliumDeniedPrefixes(t, ten.EgressFQDN.Object) {
		if p.Contains(netip.MustParseAddr(testBrokerAddress)) {
			t.Errorf("the deny rule's %s takes back the broker's address", p)
		}
	}
	denied := ciliumDeniedPrefixes(t, ten.EgressFQDN.Object)
	for _, addr := range []string{"10.96.0.41", "10.96.0.43", "10.0.0.1"} {
		if !slices.ContainsFunc(denied, func(p netip.Prefix) bool { return p.Contains(netip.MustParseAddr(addr)) }) {
			t.Errorf("egress to %s, next to the broker's address, is no longer denied", addr)
		}
	}
	checkGolden(t, "tenant/ciliumnetworkpolicy-egress-fqdn-broker.yaml", ten.EgressFQDN.Object)

	// Standard mode: the bound hosts were claude_local's only FQDNs, so no fallback to public
	// IPv4; the broker's pods and address are allowed.
	std := mustConfig(t, `{}`)
	sten, err := policy.RenderTenant(std, testCompanyID, op, mustAdapter(t, std, "claude_local"))
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range sten.EgressAllow.Spec.Egress {
		for _, to := range r.To {
			if to.IPBlock != nil && to.IPBlock.CIDR == "0.0.0.0/0" {
				t.Errorf("a tenant whose only FQDN is a bound host may reach public IPv4 (%v)", r.Ports)
			}
		}
	}
	checkGoldenUnstructured(t, "tenant/networkpolicy-egress-allow-broker.yaml", sten.EgressAllow)
	// Without the wiring the same tenant has the fallback (the test above can fail).
	if plain := mustTenant(t, std, mustAdapter(t, std, "claude_local")); len(plain.EgressAllow.Spec.Egress) != 3 {
		t.Errorf("an unwired tenant has %d egress rules, want DNS, server and the public fallback", len(plain.EgressAllow.Spec.Egress))
	}

	// The schema the test cluster installs takes the wired policy.
	var problems []string
	checkSchema("", ten.EgressFQDN.Object, loadCRDSchemas(t, "cilium.io_ciliumnetworkpolicies.yaml")["v2"], &problems)
	if len(problems) > 0 {
		t.Errorf("the wired cilium policy does not match the CRD schema:\n%v", problems)
	}
}

// A run's task-scoped grant cannot open a bound host either: its FQDNs lose them, and a grant of
// bound hosts alone renders no policy.
func TestBrokeredScopedEgressDropsBoundHosts(t *testing.T) {
	owner := policy.OwnerReference("batch/v1", "Job", testWorkload, testUID)
	for _, mode := range []string{"standard", "cilium"} {
		cfg := mustConfig(t, `{"egressMode": "`+mode+`"}`)
		spec := testRunSpec(cfg)
		spec.Broker = testBroker(t)
		u, err := policy.RenderScopedEgress(spec, policy.EgressGrant{AllowFqdns: []string{"api.openai.com", "registry.npmjs.org"}}, owner)
		if err != nil {
			t.Fatal(err)
		}
		if mode == "cilium" {
			got := asSlice(asSlice(u.Object["spec"].(map[string]any)["egress"])[0].(map[string]any)["toFQDNs"])
			if len(got) != 1 || got[0].(map[string]any)["matchName"] != "registry.npmjs.org" {
				t.Errorf("cilium scoped toFQDNs = %v, want registry.npmjs.org only", got)
			}
		}
		only, err := policy.RenderScopedEgress(spec, policy.EgressGrant{AllowFqdns: []string{"api.openai.com"}}, owner)
		if err != nil || only != nil {
			t.Errorf("%s: a grant of a bound host alone rendered %v (%v), want no policy", mode, only, err)
		}
		spec.Broker = policy.Broker{}
		if plain, _ := policy.RenderScopedEgress(spec, policy.EgressGrant{AllowFqdns: []string{"api.openai.com"}}, owner); plain == nil {
			t.Errorf("%s: without the wiring a grant of api.openai.com renders no policy", mode)
		}
	}
}

func anyString(v any) string { s, _ := v.(string); return s }

// portsOf lists a cilium rule's toPorts as port/protocol.
func portsOf(rule map[string]any) []string {
	var out []string
	for _, tp := range asSlice(rule["toPorts"]) {
		for _, p := range asSlice(tp.(map[string]any)["ports"]) {
			m := p.(map[string]any)
			out = append(out, anyString(m["port"])+"/"+anyString(m["protocol"]))
		}
	}
	return out
}
