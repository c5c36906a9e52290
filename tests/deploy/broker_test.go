package deploy_test

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/pkg/broker/ca"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// broker is the credential broker's Deployment, ServiceAccount and Service name.
const broker = "credential-broker"

// brokerObjects are the broker's rendered objects in an overlay, and every binding that could
// grant its ServiceAccount anything.
type brokerObjects struct {
	deployment *appsv1.Deployment
	account    *corev1.ServiceAccount
	service    *corev1.Service
	policy     *networkingv1.NetworkPolicy
	bindings   []rbacv1.Subject // the subjects of every RoleBinding and ClusterRoleBinding
}

func renderBroker(t *testing.T, overlay, namespace string) brokerObjects {
	t.Helper()
	var b brokerObjects
	for _, o := range render(t, rendering{overlay: overlay, namespace: namespace}) {
		switch {
		case o.GetKind() == "Deployment" && o.GetName() == broker:
			b.deployment = &appsv1.Deployment{}
			convert(t, o, b.deployment)
		case o.GetKind() == "ServiceAccount" && o.GetName() == broker:
			b.account = &corev1.ServiceAccount{}
			convert(t, o, b.account)
		case o.GetKind() == "Service" && o.GetName() == broker:
			b.service = &corev1.Service{}
			convert(t, o, b.service)
		case o.GetKind() == "NetworkPolicy" && o.GetName() == broker:
			b.policy = &networkingv1.NetworkPolicy{}
			convert(t, o, b.policy)
		case o.GetKind() == "RoleBinding" || o.GetKind() == "ClusterRoleBinding":
			var rb rbacv1.ClusterRoleBinding // a RoleBinding's subjects decode the same
			convert(t, o, &rb)
			b.bindings = append(b.bindings, rb.Subjects...)
		}
	}
	if b.deployment == nil || b.account == nil || b.service == nil || b.policy == nil {
		t.Fatalf("%s overlay: the broker's Deployment %v, ServiceAccount %v, Service %v, NetworkPolicy %v: want all four",
			overlay, b.deployment != nil, b.account != nil, b.service != nil, b.policy != nil)
	}
	return b
}

func boolPtr(b *bool) string {
	if b == nil {
		return "unset"
	}
	return fmt.Sprint(*b)
}

// containerPort is the port of the container's port named name, 0 when it has none.
func containerPort(c corev1.Container, name string) int {
	for _, p := range c.Ports {
		if p.Name == name {
			return int(p.ContainerPort)
		}
	}
	return 0
}

// TestCredentialBrokerDeployment renders both overlays and checks the broker's pods (issue 27):
// no Kubernetes RBAC at all and no API token in its pods (it talks to NATS only: internal/app
// lists no Kubernetes access for it, and neither the overlay nor a tenant's RoleBindings bind its
// ServiceAccount); its own NATS user; the CA and the sealing key read from the Secret
// kubeclip-broker, mounted read-only and readable by the pod's group only; the Service's port
// 443 reaching the proxy's --listen; probes on the ops port; the workers' security context;
// and the replicas the overlay promises (2 in the base, 1 in dev, 3 with a PDB in production).
func TestCredentialBrokerDeployment(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		overlay      string
		wantReplicas int32
		wantImage    string
	}{
		{"dev", 1, "kubeclip.local/credential-broker:dev"},
		{"production", 3, "registry.example.com/kubeclip/credential-broker:0.1.0"},
	} {
		t.Run(tc.overlay, func(t *testing.T) {
			b := renderBroker(t, tc.overlay, "")
			spec := b.deployment.Spec.Template.Spec

			// No RBAC, no token.
			for _, s := range b.bindings {
				if s.Kind == rbacv1.ServiceAccountKind && s.Name == broker {
					t.Errorf("a binding grants the broker's ServiceAccount something: %+v", s)
				}
			}
			op := policy.DefaultOperator()
			ten, err := policy.RenderTenant(policy.DefaultConfig(), "co-broker", op)
			if err != nil {
				t.Fatal(err)
			}
			for _, rb := range ten.WorkerBindings {
				for _, s := range rb.Subjects {
					if s.Name == broker {
						t.Errorf("tenant RoleBinding %s binds the broker's ServiceAccount", rb.Name)
					}
				}
			}
			if spec.ServiceAccountName != broker {
				t.Errorf("the broker runs as ServiceAccount %q, want its own, %s", spec.ServiceAccountName, broker)
			}
			if a := b.account.AutomountServiceAccountToken; a == nil || *a {
				t.Errorf("ServiceAccount %s automountServiceAccountToken is %s, want false", broker, boolPtr(a))
			}
			if a := spec.AutomountServiceAccountToken; a == nil || *a {
				t.Errorf("the broker's pods' automountServiceAccountToken is %s, want false", boolPtr(a))
			}

			if len(spec.Containers) != 1 {
				t.Fatalf("%d containers, want 1", len(spec.Containers))
			}
			c := spec.Containers[0]
			if c.Image != tc.wantImage {
				t.Errorf("image %q, want %q", c.Image, tc.wantImage)
			}
			if got := envValue(c.Env, "KUBECLIP_NATS_USER"); got != "broker" {
				t.Errorf("connects to NATS as %q, want broker (its own user, nats-auth.conf)", got)
			}
			if got := secretKey(c.Env, "KUBECLIP_NATS_PASSWORD"); got != "kubeclip-nats-users/broker" {
				t.Errorf("its NATS password comes from %q, want kubeclip-nats-users/broker", got)
			}
			for _, from := range c.EnvFrom {
				if from.SecretRef != nil {
					t.Errorf("takes its whole environment from Secret %s (the adapter keys reach it through mints only)", from.SecretRef.Name)
				}
			}
			for v, want := range map[string]string{
				"KUBECLIP_BROKER_CA_CERT": "kubeclip-broker/ca.crt", "KUBECLIP_BROKER_CA_KEY": "kubeclip-broker/ca.key",
				"KUBECLIP_BROKER_SEALING_KEY": "kubeclip-broker/sealing.key",
			} {
				file := envValue(c.Env, v)
				if got := mountedSecret(spec, c, file); got != want {
					t.Errorf("%s=%q is %q, want the Secret's %s", v, file, got, want)
				}
			}
			for _, m := range c.VolumeMounts {
				if !m.ReadOnly {
					t.Errorf("volume %s is mounted writable", m.Name)
				}
			}
			for _, v := range spec.Volumes {
				if v.Secret == nil || v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o007 != 0 {
					t.Errorf("volume %s: %+v, want a Secret volume no one outside the pod's group reads", v.Name, v.VolumeSource)
				}
			}

			// The Service's 443 reaches --listen.
			_, listen, err := net.SplitHostPort(envValue(c.Env, "KUBECLIP_BROKER_LISTEN"))
			if err != nil {
				t.Fatalf("KUBECLIP_BROKER_LISTEN: %v", err)
			}
			if len(b.service.Spec.Ports) != 1 || b.service.Spec.Ports[0].Port != 443 || b.service.Spec.Type != corev1.ServiceTypeClusterIP {
				t.Fatalf("Service %s: %+v, want one ClusterIP port 443", broker, b.service.Spec)
			}
			target := b.service.Spec.Ports[0].TargetPort.String()
			if p := containerPort(c, target); fmt.Sprint(p) != listen {
				t.Errorf("the Service's port 443 reaches container port %q (%d), want --listen's %s", target, p, listen)
			}
			sel := b.service.Spec.Selector
			for k, v := range sel {
				if b.deployment.Spec.Template.Labels[k] != v {
					t.Errorf("the Service selects %v, which the broker's pods are not labelled with", sel)
				}
			}

			// Probes on the ops port, which is --ops-addr's.
			ops := containerPort(c, "ops")
			if got := envValue(c.Env, "KUBECLIP_OPS_ADDR"); got != fmt.Sprintf(":%d", ops) {
				t.Errorf("KUBECLIP_OPS_ADDR %q, the ops port is %d", got, ops)
			}
			for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
				if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.String() != "ops" {
					t.Errorf("%s probe %+v, want an HTTP GET on the ops port", name, p)
				}
			}
			if c.ReadinessProbe != nil && c.ReadinessProbe.HTTPGet != nil && c.ReadinessProbe.HTTPGet.Path != "/readyz" {
				t.Errorf("readiness probe path %s, want /readyz", c.ReadinessProbe.HTTPGet.Path)
			}
			if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() || c.Resources.Requests.Cpu().IsZero() {
				t.Errorf("resources %+v, want CPU and memory requests and a memory limit", c.Resources)
			}

			// The workers' security context.
			psc, sc := spec.SecurityContext, c.SecurityContext
			switch {
			case psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.SeccompProfile == nil:
				t.Errorf("pod security context %+v, want non-root with a seccomp profile", psc)
			case sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
				sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
				sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}):
				t.Errorf("container security context %+v, want no privilege escalation, a read-only root and ALL dropped", sc)
			}
			if s := b.deployment.Spec.Template.Spec; s.TerminationGracePeriodSeconds == nil {
				t.Error("no terminationGracePeriodSeconds")
			}

			if r := b.deployment.Spec.Replicas; r == nil || *r != tc.wantReplicas {
				t.Errorf("replicas %v, want %d", r, tc.wantReplicas)
			}
		})
	}
}

// TestCredentialBrokerNetworkPolicy renders both overlays and asks the broker's NetworkPolicy
// who may reach its ports: the proxy (what the Service's 443 reaches) admits pods of a tenant
// namespace as pkg/policy renders it, and nothing else; the ops port (/metrics) admits
// kubeclip's own namespace and the operator's monitoring namespace, never a tenant's or
// Paperclip's.
func TestCredentialBrokerNetworkPolicy(t *testing.T) {
	t.Parallel()
	const ns = "kubeclip"
	op := policy.DefaultOperator()
	op.KubeclipNamespace = ns
	ten, err := policy.RenderTenant(policy.DefaultConfig(), "co-broker", op)
	if err != nil {
		t.Fatal(err)
	}
	tenantLabels := map[string]string{"kubernetes.io/metadata.name": ten.Namespace.Name}
	for k, v := range ten.Namespace.Labels {
		tenantLabels[k] = v
	}
	type source struct {
		name      string
		namespace string
		nsLabels  map[string]string
		podLabels map[string]string
	}
	tenant := source{"a tenant's agent pod", ten.Namespace.Name, tenantLabels, map[string]string{policy.LabelRole: policy.RoleAgent}}
	paperclip := source{"Paperclip's pod", "paperclip", map[string]string{"kubernetes.io/metadata.name": "paperclip", "kubeclip.io/nats-client": "true"}, map[string]string{"app": "paperclip"}}
	other := source{"a pod of another namespace", "default", map[string]string{"kubernetes.io/metadata.name": "default"}, map[string]string{"app.kubernetes.io/component": "worker"}}
	worker := source{"a worker", ns, map[string]string{"kubernetes.io/metadata.name": ns}, map[string]string{"app.kubernetes.io/component": "worker"}}
	monitoring := source{"the operator's monitoring", "monitoring", map[string]string{"kubernetes.io/metadata.name": "monitoring", "kubeclip.io/nats-monitoring": "true"}, map[string]string{"app": "prometheus"}}
	for _, overlay := range []string{"dev", "production"} {
		t.Run(overlay, func(t *testing.T) {
			b := renderBroker(t, overlay, ns)
			if sel := b.policy.Spec.PodSelector.MatchLabels; sel["app.kubernetes.io/name"] != b.deployment.Spec.Template.Labels["app.kubernetes.io/name"] {
				t.Fatalf("the NetworkPolicy selects %v, not the broker's pods", sel)
			}
			c := b.deployment.Spec.Template.Spec.Containers[0]
			proxy, ops := containerPort(c, b.service.Spec.Ports[0].TargetPort.String()), containerPort(c, "ops")
			for _, tc := range []struct {
				port int
				from source
				want bool
			}{
				{proxy, tenant, true}, {proxy, paperclip, false}, {proxy, other, false}, {proxy, worker, false}, {proxy, monitoring, false},
				{ops, tenant, false}, {ops, paperclip, false}, {ops, other, false}, {ops, worker, true}, {ops, monitoring, true},
			} {
				if got := admits(t, b.policy, tc.port, tc.from.namespace, tc.from.nsLabels, tc.from.podLabels); got != tc.want {
					t.Errorf("port %d from %s: admitted %v, want %v", tc.port, tc.from.name, got, tc.want)
				}
			}
		})
	}
}

// fromTarget is a Dockerfile's `FROM ... AS <target>`.
var fromTarget = regexp.MustCompile(`(?m)^FROM \S+ AS (\S+)$`)

// TestEveryDeploymentHasAnImage renders both overlays and checks that every image a pod runs
// is one the repository builds: hack/images/images.sh's tags (the dev overlay's references
// exactly; the production overlay's by name), and a target of the Dockerfile and of
// Dockerfile.local. A worker added to the manifests but not to the image builds fails here.
func TestEveryDeploymentHasAnImage(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("bash", filepath.Join(root, "hack/images/images.sh"), "tags")
	cmd.Env = append(os.Environ(), "KUBECLIP_IMAGE_REPO=kubeclip.local", "KUBECLIP_IMAGE_TAG=dev")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("hack/images/images.sh tags: %v", err)
	}
	tags := map[string]bool{}
	for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
		tags[sc.Text()] = true
	}
	targets := map[string][]string{}
	for _, f := range []string{"Dockerfile", "Dockerfile.local"} {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range fromTarget.FindAllStringSubmatch(string(data), -1) {
			targets[f] = append(targets[f], m[1])
		}
	}
	for _, overlay := range []string{"dev", "production"} {
		var images []string
		for _, o := range render(t, rendering{overlay: overlay}) {
			var spec corev1.PodSpec
			switch o.GetKind() {
			case "Deployment":
				var d appsv1.Deployment
				convert(t, o, &d)
				spec = d.Spec.Template.Spec
			case "StatefulSet":
				var s appsv1.StatefulSet
				convert(t, o, &s)
				spec = s.Spec.Template.Spec
			default:
				continue
			}
			for _, c := range append(spec.InitContainers, spec.Containers...) {
				images = append(images, c.Image)
			}
		}
		if !slices.Contains(images, map[string]string{"dev": "kubeclip.local/credential-broker:dev", "production": "registry.example.com/kubeclip/credential-broker:0.1.0"}[overlay]) {
			t.Errorf("%s overlay: no pod runs the credential broker's image (images: %v)", overlay, images)
		}
		for _, image := range images {
			name := strings.TrimSuffix(image[strings.LastIndex(image, "/")+1:], ":"+image[strings.LastIndex(image, ":")+1:])
			if overlay == "dev" && !tags[image] {
				t.Errorf("dev overlay runs %s, which hack/images/images.sh does not build (it builds %v)", image, tags)
			}
			if overlay == "production" && !tags["kubeclip.local/"+name+":dev"] {
				t.Errorf("production overlay runs %s, which hack/images/images.sh does not build", image)
			}
			for f, ts := range targets {
				if !slices.Contains(ts, name) {
					t.Errorf("%s overlay runs %s, which %s has no target for (targets %v)", overlay, image, f, ts)
				}
			}
		}
	}
}

// TestSecretsScriptMakesBrokerSecret runs hack/deploy/secrets.sh in a namespace of its own: it
// makes kubeclip-broker, an installation CA the broker loads (ca.Parse: critical DNS name
// constraints, a P-256 key that is the certificate's) constrained to the built-in bindings'
// hosts and nothing else, and a 32-byte sealing key (installSecrets checks what was printed).
// A second run keeps both; a kubeclip-broker missing a key is refused, not completed.
func TestSecretsScriptMakesBrokerSecret(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ns := "kubeclip-broker-secrets-" + shortID()
	if _, err := c.cs.CoreV1().Namespaces().Create(t.Context(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.deleteAtEnd(t, ns, nil)
	installSecrets(t, c, ns)
	read := func() map[string][]byte {
		s, err := c.cs.CoreV1().Secrets(ns).Get(t.Context(), "kubeclip-broker", metav1.GetOptions{})
		if err != nil {
			t.Fatalf("reading the broker's Secret: %v", err)
		}
		return s.Data
	}
	data := read()
	authority, err := ca.Parse(data["ca.crt"], data["ca.key"])
	if err != nil {
		t.Fatalf("the broker does not load the Secret's CA: %v", err)
	}
	for _, h := range builtinBoundHosts {
		if !authority.Permits(h) {
			t.Errorf("the CA does not cover %s, a built-in binding's host (it covers %v)", h, authority.Hosts())
		}
	}
	for _, h := range []string{"example.com", "googleapis.com", "anthropic.com"} {
		if authority.Permits(h) {
			t.Errorf("the CA covers %s, which nothing binds", h)
		}
	}
	t.Logf("installation CA hosts %v, valid until %s", authority.Hosts(), authority.Certificate().NotAfter.UTC().Format("2006-01-02"))

	installSecrets(t, c, ns)
	again := read()
	for _, k := range []string{"ca.crt", "ca.key", "sealing.key"} {
		if !bytes.Equal(again[k], data[k]) {
			t.Errorf("a second secrets.sh changed kubeclip-broker's %s", k)
		}
	}

	// Without its sealing key: refused, and left as it is.
	s, err := c.cs.CoreV1().Secrets(ns).Get(t.Context(), "kubeclip-broker", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	delete(s.Data, "sealing.key")
	if _, err := c.cs.CoreV1().Secrets(ns).Update(t.Context(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", filepath.Join(root, "hack/deploy/secrets.sh"), ns)
	cmd.Env = append(os.Environ(), "KUBECTL="+kubectl(t), "KUBECONFIG="+clustertest.Kubeconfig())
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "kubeclip-broker in "+ns+" has no sealing.key") {
		t.Errorf("secrets.sh with a kubeclip-broker missing sealing.key: %v, want a refusal naming it:\n%s", err, out)
	}
	if _, ok := read()["sealing.key"]; ok {
		t.Error("secrets.sh added a sealing key to an existing kubeclip-broker")
	}
}

// builtinBoundHosts are the hosts of the credential broker's built-in bindings
// (cmd/credential-broker defaultBindings), which the base's KUBECLIP_BROKER_HOSTS must list.
var builtinBoundHosts = []string{"api.anthropic.com", "api.openai.com", "generativelanguage.googleapis.com"}

// serviceLinkHost is the variable Kubernetes gives pods for a Service's ClusterIP (service
// links): the name upper-cased, '-' as '_', plus _SERVICE_HOST.
func serviceLinkHost(service string) string {
	return strings.ToUpper(strings.ReplaceAll(service, "-", "_")) + "_SERVICE_HOST"
}

// TestWorkersWireTenantPodsToTheBroker renders both overlays and checks the broker wiring of the
// workers that render tenant objects (issue 27; pkg/policy.Broker): the tenant-worker and the
// dispatcher read the broker Service's ClusterIP from its service-links variable (no ClusterIP
// is fixed), the installation CA's certificate from the Secret kubeclip-broker, that item only
// (never the CA's key or the sealing key), and the bound hosts from the tenancy ConfigMap: the
// built-in bindings' hosts, which a CA made for them covers (what the workers check at start).
// The broker's pods are where tenant egress policies admit them: labelled
// policy.BrokerAppLabel, the proxy on policy.BrokerPodPort behind the Service's policy.BrokerPort.
func TestWorkersWireTenantPodsToTheBroker(t *testing.T) {
	t.Parallel()
	for _, overlay := range []string{"dev", "production"} {
		t.Run(overlay, func(t *testing.T) {
			objs := render(t, rendering{overlay: overlay})
			deployments := map[string]*appsv1.Deployment{}
			var hosts string
			var service *corev1.Service
			for _, o := range objs {
				switch {
				case o.GetKind() == "Deployment":
					d := &appsv1.Deployment{}
					convert(t, o, d)
					deployments[d.Name] = d
				case o.GetKind() == "Service" && o.GetName() == broker:
					service = &corev1.Service{}
					convert(t, o, service)
				case o.GetKind() == "ConfigMap" && strings.HasPrefix(o.GetName(), "kubeclip-tenancy"):
					hosts, _, _ = unstructured.NestedString(o.Object, "data", "KUBECLIP_BROKER_HOSTS")
				}
			}
			if service == nil || deployments[broker] == nil {
				t.Fatalf("no %s Service or Deployment", broker)
			}

			bp := deployments[broker].Spec.Template
			if got := bp.Labels["app.kubernetes.io/name"]; got != policy.BrokerAppLabel {
				t.Errorf("the broker's pods are app.kubernetes.io/name=%q, tenant egress admits %q", got, policy.BrokerAppLabel)
			}
			if got := containerPort(bp.Spec.Containers[0], service.Spec.Ports[0].TargetPort.String()); got != policy.BrokerPodPort {
				t.Errorf("the Service reaches the broker's container port %d, tenant egress admits %d", got, policy.BrokerPodPort)
			}
			if got := service.Spec.Ports[0].Port; got != policy.BrokerPort {
				t.Errorf("the Service's port is %d, pods call %d", got, policy.BrokerPort)
			}

			for _, w := range []string{"tenant-worker", "dispatcher"} {
				d := deployments[w]
				if d == nil {
					t.Fatalf("no %s Deployment", w)
				}
				spec := d.Spec.Template.Spec
				c := spec.Containers[0]
				if got, want := envValue(c.Env, "KUBECLIP_BROKER_ADDRESS"), "$("+serviceLinkHost(service.Name)+")"; got != want {
					t.Errorf("%s: KUBECLIP_BROKER_ADDRESS=%q, want %q (the Service's ClusterIP)", w, got, want)
				}
				if spec.EnableServiceLinks != nil && !*spec.EnableServiceLinks {
					t.Errorf("%s: enableServiceLinks false: KUBECLIP_BROKER_ADDRESS would not expand", w)
				}
				file := envValue(c.Env, "KUBECLIP_BROKER_CA_FILE")
				if got := mountedSecret(spec, c, file); got != "kubeclip-broker/ca.crt" {
					t.Errorf("%s: KUBECLIP_BROKER_CA_FILE=%q is %q, want the Secret's kubeclip-broker/ca.crt", w, file, got)
				}
				for _, v := range spec.Volumes {
					if v.Secret == nil || v.Secret.SecretName != "kubeclip-broker" {
						continue
					}
					for _, it := range v.Secret.Items {
						if it.Key != "ca.crt" {
							t.Errorf("%s mounts kubeclip-broker's %s: only the broker holds it", w, it.Key)
						}
					}
					if len(v.Secret.Items) == 0 {
						t.Errorf("%s mounts all of kubeclip-broker, the CA's key and the sealing key with it", w)
					}
				}
			}

			got := strings.Split(hosts, ",")
			if !slices.Equal(got, builtinBoundHosts) {
				t.Errorf("KUBECLIP_BROKER_HOSTS=%q, want the broker's built-in bindings' hosts %v", hosts, builtinBoundHosts)
			}
			authority, err := ca.Generate(ca.Options{Hosts: builtinBoundHosts})
			if err != nil {
				t.Fatal(err)
			}
			b := policy.Broker{Address: "10.96.0.42", Hosts: got, CACert: string(authority.CertPEM())}
			if err := b.Validate(); err != nil {
				t.Errorf("the workers would refuse the overlay's broker wiring: %v", err)
			}
		})
	}
}
