package deploy_test

import (
	"path"
	"regexp"
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

// includeAuth is nats.conf's include of the users and permissions, not commented out.
var includeAuth = regexp.MustCompile(`(?m)^include \./nats-auth\.conf$`)

// TestOverlaysWireSecretsAndUsers renders both overlays and checks how the installation's
// secrets reach the pods without being part of the manifests: no Secret is rendered (the NATS
// passwords and the sandbox key are per installation, never values shipped here); NATS includes
// its users and reads each password from kubeclip-nats-users under the user's name; every worker
// connects as its own user; the dispatcher and the exec-worker read the same sandbox key file
// from kubeclip-sandbox-key; the exec-worker's pods carry the label tenants admit to sandboxd;
// and the dispatcher's sandboxd image follows the overlay's images.
func TestOverlaysWireSecretsAndUsers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		overlay, wantSandboxdImage string
	}{
		{"dev", "kubeclip.local/sandboxd:dev"},
		{"production", "registry.example.com/kubeclip/sandboxd:0.1.0"},
	} {
		t.Run(tc.overlay, func(t *testing.T) {
			objs := render(t, rendering{overlay: tc.overlay})
			deployments := map[string]*appsv1.Deployment{}
			var nats *appsv1.StatefulSet
			for _, o := range objs {
				switch o.GetKind() {
				case "Secret":
					t.Errorf("the overlay renders Secret %s: secrets are the operator's", o.GetName())
				case "Deployment":
					d := &appsv1.Deployment{}
					convert(t, o, d)
					deployments[d.Name] = d
				case "StatefulSet":
					nats = &appsv1.StatefulSet{}
					convert(t, o, nats)
				case "ConfigMap":
					data, _, _ := unstructured.NestedStringMap(o.Object, "data")
					if conf, ok := data["nats.conf"]; ok && !includeAuth.MatchString(conf) {
						t.Errorf("ConfigMap %s: nats.conf does not include nats-auth.conf:\n%s", o.GetName(), conf)
					}
					if _, ok := data["nats.conf"]; ok && data["nats-auth.conf"] == "" {
						t.Errorf("ConfigMap %s has nats.conf but no nats-auth.conf", o.GetName())
					}
				}
			}

			// NATS: each password variable nats-auth.conf reads, from its user's key.
			if nats == nil {
				t.Fatal("no NATS StatefulSet")
			}
			natsEnv := nats.Spec.Template.Spec.Containers[0].Env
			for user, v := range map[string]string{
				"kubeclip": "KUBECLIP_NATS_PASSWORD_WORKERS", "exec-worker": "KUBECLIP_NATS_PASSWORD_EXEC_WORKER", "broker": "KUBECLIP_NATS_PASSWORD_BROKER",
				"paperclip": "KUBECLIP_NATS_PASSWORD_PAPERCLIP", "cli": "KUBECLIP_NATS_PASSWORD_CLI",
				"status": "KUBECLIP_NATS_PASSWORD_STATUS",
			} {
				if got := secretKey(natsEnv, v); got != "kubeclip-nats-users/"+user {
					t.Errorf("NATS %s comes from %q, want kubeclip-nats-users/%s", v, got, user)
				}
			}

			wantUser := map[string]string{"tenant-worker": "kubeclip", "dispatcher": "kubeclip", "run-watcher": "kubeclip", "exec-worker": "exec-worker"}
			for _, w := range workers {
				d := deployments[w]
				if d == nil {
					t.Errorf("no Deployment %s", w)
					continue
				}
				c := d.Spec.Template.Spec.Containers[0]
				if got := envValue(c.Env, "KUBECLIP_NATS_USER"); got != wantUser[w] {
					t.Errorf("%s connects to NATS as %q, want %q", w, got, wantUser[w])
				}
				if got := secretKey(c.Env, "KUBECLIP_NATS_PASSWORD"); got != "kubeclip-nats-users/"+wantUser[w] {
					t.Errorf("%s's NATS password comes from %q, want kubeclip-nats-users/%s", w, got, wantUser[w])
				}
				for _, from := range c.EnvFrom {
					if from.SecretRef != nil && from.SecretRef.Name != "kubeclip-adapter-keys" {
						t.Errorf("%s takes its whole environment from Secret %s", w, from.SecretRef.Name)
					}
				}

				keyFile := envValue(c.Env, "KUBECLIP_SANDBOX_KEY_FILE")
				if w != "dispatcher" && w != "exec-worker" {
					// The tenant-worker's one volume is the broker's CA certificate
					// (TestWorkersWireTenantPodsToTheBroker).
					for _, v := range d.Spec.Template.Spec.Volumes {
						if v.Secret == nil || v.Secret.SecretName != "kubeclip-broker" || w != "tenant-worker" {
							t.Errorf("%s is given volume %s; only the dispatcher and the exec-worker need one (the sandbox key), and the tenant-worker the broker's CA", w, v.Name)
						}
					}
					if keyFile != "" {
						t.Errorf("%s is given the sandbox key; only the dispatcher and the exec-worker need it", w)
					}
					continue
				}
				if got := mountedSecret(d.Spec.Template.Spec, c, keyFile); got != "kubeclip-sandbox-key/key" {
					t.Errorf("%s reads its sandbox key %q from %q, want the Secret kubeclip-sandbox-key's key", w, keyFile, got)
				}
			}

			if d := deployments["exec-worker"]; d != nil {
				labels := d.Spec.Template.Labels
				if labels["app.kubernetes.io/name"] != policy.ExecWorkerAppLabel || labels["app.kubernetes.io/component"] != "worker" {
					t.Errorf("exec-worker pods are labelled %v: tenants admit sandboxd's port from app.kubernetes.io/name=%s, NATS admits component=worker",
						labels, policy.ExecWorkerAppLabel)
				}
			}
			if d := deployments["dispatcher"]; d != nil {
				if got := envValue(d.Spec.Template.Spec.Containers[0].Env, "KUBECLIP_SANDBOXD_IMAGE"); got != tc.wantSandboxdImage {
					t.Errorf("dispatcher KUBECLIP_SANDBOXD_IMAGE = %q, want %q", got, tc.wantSandboxdImage)
				}
			}
		})
	}
}

// routeFile is a file the cluster's tls block of a nats.conf reads.
var routeFile = regexp.MustCompile(`(?m)^\s*(?:ca_file|cert_file|key_file): (\S+)$`)

// TestProductionNATSReadsRouteTLSFromItsSecret renders the production overlay: every file its
// nats.conf's route tls reads (the route CA, certificate and key, tests/natscluster
// TestProductionRoutesRefuseUnauthenticatedPeers runs that file) is mounted from the Secret
// kubeclip-nats-routes under its own name, the key hack/deploy/secrets.sh writes.
func TestProductionNATSReadsRouteTLSFromItsSecret(t *testing.T) {
	t.Parallel()
	var conf string
	var nats *appsv1.StatefulSet
	for _, o := range render(t, rendering{overlay: "production"}) {
		switch o.GetKind() {
		case "StatefulSet":
			nats = &appsv1.StatefulSet{}
			convert(t, o, nats)
		case "ConfigMap":
			data, _, _ := unstructured.NestedStringMap(o.Object, "data")
			if c, ok := data["nats.conf"]; ok {
				conf = c
			}
		}
	}
	if nats == nil || conf == "" {
		t.Fatal("no NATS StatefulSet or no nats.conf")
	}
	files := routeFile.FindAllStringSubmatch(conf, -1)
	if len(files) != 3 {
		t.Fatalf("nats.conf reads %d tls files, want the route CA, certificate and key:\n%s", len(files), conf)
	}
	spec := nats.Spec.Template.Spec
	for _, f := range files {
		if got, want := mountedSecret(spec, spec.Containers[0], f[1]), "kubeclip-nats-routes/"+path.Base(f[1]); got != want {
			t.Errorf("NATS reads %s from %q, want %s", f[1], got, want)
		}
	}
}

func convert(t *testing.T, o *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, into); err != nil {
		t.Fatalf("decoding %s %s: %v", o.GetKind(), o.GetName(), err)
	}
}

func envValue(env []corev1.EnvVar, name string) string {
	i := slices.IndexFunc(env, func(e corev1.EnvVar) bool { return e.Name == name })
	if i < 0 {
		return ""
	}
	return env[i].Value
}

// secretKey is "secret/key" of the variable's secretKeyRef, "" when it has none.
func secretKey(env []corev1.EnvVar, name string) string {
	i := slices.IndexFunc(env, func(e corev1.EnvVar) bool { return e.Name == name })
	if i < 0 || env[i].ValueFrom == nil || env[i].ValueFrom.SecretKeyRef == nil {
		return ""
	}
	ref := env[i].ValueFrom.SecretKeyRef
	if ref.Optional != nil && *ref.Optional {
		return "optional " + ref.Name + "/" + ref.Key
	}
	return ref.Name + "/" + ref.Key
}

// mountedSecret is "secret/key" of the Secret volume item the container sees at file, "" when
// no required Secret volume holds it.
func mountedSecret(spec corev1.PodSpec, c corev1.Container, file string) string {
	for _, m := range c.VolumeMounts {
		rel, ok := cutDir(file, m.MountPath)
		if !ok {
			continue
		}
		for _, v := range spec.Volumes {
			if v.Name != m.Name || v.Secret == nil || (v.Secret.Optional != nil && *v.Secret.Optional) {
				continue
			}
			for _, it := range v.Secret.Items {
				if it.Path == rel {
					return v.Secret.SecretName + "/" + it.Key
				}
			}
		}
	}
	return ""
}

// cutDir returns file's path below dir.
func cutDir(file, dir string) (string, bool) {
	rel := path.Clean(file)
	dir = path.Clean(dir) + "/"
	if len(rel) <= len(dir) || rel[:len(dir)] != dir {
		return "", false
	}
	return rel[len(dir):], true
}

// TestNATSMonitoringClosedToTenants renders both overlays and asks NATS's NetworkPolicy who may
// reach the monitoring port (8222: /varz, /connz, /jsz name every connection, subject and
// stream): pods in kubeclip's own namespace and a namespace the operator labels
// kubeclip.io/nats-monitoring=true, never a tenant's or Paperclip's namespace (issue 15, item 12).
// The client port stays open to the workers and Paperclip's namespace.
func TestNATSMonitoringClosedToTenants(t *testing.T) {
	t.Parallel()
	const natsNS = "kubeclip"
	type source struct {
		name      string
		namespace string
		nsLabels  map[string]string
		podLabels map[string]string
	}
	tenant := source{"a tenant pod", "paperclip-acme", map[string]string{"kubernetes.io/metadata.name": "paperclip-acme", "app.kubernetes.io/managed-by": "kubeclip"}, map[string]string{"app.kubernetes.io/component": "worker", "app.kubernetes.io/name": "nats"}}
	paperclip := source{"Paperclip's pod", "paperclip", map[string]string{"kubernetes.io/metadata.name": "paperclip", "kubeclip.io/nats-client": "true"}, map[string]string{"app": "paperclip"}}
	worker := source{"a worker", natsNS, map[string]string{"kubernetes.io/metadata.name": natsNS}, map[string]string{"app.kubernetes.io/component": "worker"}}
	monitoring := source{"the operator's monitoring", "monitoring", map[string]string{"kubernetes.io/metadata.name": "monitoring", "kubeclip.io/nats-monitoring": "true"}, map[string]string{"app": "prometheus"}}
	for _, overlay := range []string{"dev", "production"} {
		t.Run(overlay, func(t *testing.T) {
			var np *networkingv1.NetworkPolicy
			for _, o := range render(t, rendering{overlay: overlay, namespace: natsNS}) {
				if o.GetKind() == "NetworkPolicy" && o.GetName() == "nats" {
					np = &networkingv1.NetworkPolicy{}
					convert(t, o, np)
				}
			}
			if np == nil {
				t.Fatal("no NetworkPolicy nats rendered")
			}
			for _, tc := range []struct {
				port int
				from source
				want bool
			}{
				{8222, tenant, false}, {8222, paperclip, false}, {8222, worker, true}, {8222, monitoring, true},
				{4222, tenant, false}, {4222, paperclip, true}, {4222, worker, true},
			} {
				if got := admits(t, np, tc.port, tc.from.namespace, tc.from.nsLabels, tc.from.podLabels); got != tc.want {
					t.Errorf("port %d from %s: admitted %v, want %v", tc.port, tc.from.name, got, tc.want)
				}
			}
		})
	}
}

// admits reports whether np lets a pod (namespace, its labels, the pod's labels) reach port.
func admits(t *testing.T, np *networkingv1.NetworkPolicy, port int, namespace string, nsLabels, podLabels map[string]string) bool {
	t.Helper()
	matches := func(sel *metav1.LabelSelector, set map[string]string) bool {
		if sel == nil {
			return true
		}
		s, err := metav1.LabelSelectorAsSelector(sel)
		if err != nil {
			t.Fatal(err)
		}
		return s.Matches(labels.Set(set))
	}
	for _, rule := range np.Spec.Ingress {
		if !hasPort(rule.Ports, port) {
			continue
		}
		if len(rule.From) == 0 {
			return true
		}
		for _, peer := range rule.From {
			switch {
			case peer.IPBlock != nil:
				return true // an address range may hold any pod
			case peer.NamespaceSelector == nil:
				if namespace == np.Namespace && matches(peer.PodSelector, podLabels) {
					return true
				}
			case matches(peer.NamespaceSelector, nsLabels) && matches(peer.PodSelector, podLabels):
				return true
			}
		}
	}
	return false
}

func hasPort(ports []networkingv1.NetworkPolicyPort, port int) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		if p.Port == nil || *p.Port == intstr.FromInt32(int32(port)) {
			return true
		}
	}
	return false
}
