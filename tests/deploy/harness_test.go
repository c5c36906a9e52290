// Package deploy_test proves deploy/kustomize on the local cluster: the production overlay
// passes the API server's server-side dry-run, both overlays reach the installation's Secrets
// (made per installation, never rendered) the same way, the dev overlay runs kubeclip inside the
// cluster (images built here and imported into containerd, random Secrets from
// hack/deploy/secrets.sh, NATS users on) and carries a lease and an exec end to end, each
// worker's RBAC allows what its code does and denies the rest, and the workers' /metrics move.
//
// Networking on the local cluster: there is no kube-proxy and no cluster DNS, so the workers
// cannot reach NATS through its Service name. The test deploys NATS first, then points the
// workers at the NATS pod's IP with a kubeclip-config merge in its own kustomization (the only
// change to the dev overlay), and reaches NATS and the workers' ops port from this host through
// the pod network bridge. Pods reach the API server through the kubernetes Service IP, which
// the cluster harness DNATs to the apiserver.
package deploy_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/kubeclip/kubeclip/internal/clustertest"
)

// root is the repository root, seen from this package.
const root = "../.."

// fieldManager owns what the tests apply.
const fieldManager = "kubeclip-deploy-test"

// kubectl returns the path of kubectl (clustertest.Kubectl).
func kubectl(t *testing.T) string { return clustertest.Kubectl(t, root) }

// shortID is a lower-case random suffix for names this test run owns.
func shortID() string { return strings.ToLower(ulid.Make().String()[18:]) }

// rendering is an overlay placed in a namespace of the test's own, with a name suffix (so that
// cluster-scoped objects do not clash with another run's) and kubeclip-config additions.
type rendering struct {
	overlay   string // directory under deploy/kustomize/overlays
	namespace string
	suffix    string
	config    map[string]string
}

// render runs kubectl kustomize on a kustomization that wraps the overlay. The namespace
// transformer is configured to move the ClusterRoleBindings' ServiceAccount subjects too
// (by default kustomize only moves subjects in the "default" namespace).
func render(t *testing.T, r rendering) []*unstructured.Unstructured {
	t.Helper()
	dir := t.TempDir()
	abs, err := filepath.Abs(filepath.Join(root, "deploy/kustomize/overlays", r.overlay))
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, abs)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - %s\n", rel)
	if r.suffix != "" {
		fmt.Fprintf(&b, "nameSuffix: %s\n", r.suffix)
	}
	if r.namespace != "" {
		fmt.Fprintf(&b, `transformers:
  - |-
    apiVersion: builtin
    kind: NamespaceTransformer
    metadata:
      name: test-namespace
      namespace: %s
    setRoleBindingSubjects: allServiceAccounts
    unsetOnly: false
`, r.namespace)
	}
	if len(r.config) > 0 {
		b.WriteString("configMapGenerator:\n  - name: kubeclip-config\n    behavior: merge\n    literals:\n")
		for k, v := range r.config {
			fmt.Fprintf(&b, "      - %s=%s\n", k, v)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(kubectl(t), "kustomize", dir).Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok { //nolint:errorlint // exec returns it unwrapped
			stderr = ee.Stderr
		}
		t.Fatalf("kubectl kustomize %s: %v\n%s", r.overlay, err, stderr)
	}
	objs := decodeObjects(t, out)
	for _, o := range objs {
		switch o.GetKind() {
		case "Namespace":
			// The inline transformer leaves the Namespace object's own name alone.
			if r.namespace != "" {
				o.SetName(r.namespace)
			}
		case "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			// Cluster-scoped, but this kustomize does not know it and namespaces them.
			o.SetNamespace("")
			if r.namespace != "" && o.GetKind() == "ValidatingAdmissionPolicy" {
				installPolicyIn(t, o, r.namespace, r.suffix) // what an operator's overlay patches
			}
		case "ClusterRole":
			// resourceNames are not references kustomize follows: bind the suffixed roles.
			if r.suffix != "" && strings.HasPrefix(o.GetName(), "kubeclip-tenant-worker") {
				suffixBindNames(t, o, r.suffix)
			}
		case "Deployment":
			// Nor are service links' variable names: read the suffixed broker Service's address.
			if r.suffix != "" {
				suffixServiceLinks(t, o, r.suffix)
			}
		}
	}
	return objs
}

// installPolicyIn points an admission policy's "install:" literals at namespace and the name
// suffix.
func installPolicyIn(t *testing.T, policy *unstructured.Unstructured, namespace, suffix string) {
	t.Helper()
	for _, field := range []string{"matchConditions", "variables"} {
		items, _, _ := unstructured.NestedSlice(policy.Object, "spec", field)
		for _, it := range items {
			m := it.(map[string]any)
			expr := m["expression"].(string)
			expr = strings.ReplaceAll(expr, "'system:serviceaccount:kubeclip:'", "'system:serviceaccount:"+namespace+":'")
			switch m["name"] {
			case "kubeclipNamespace":
				expr = "'" + namespace + "'"
			case "nameSuffix":
				expr = "'" + suffix + "'"
			}
			m["expression"] = expr
		}
		if err := unstructured.SetNestedSlice(policy.Object, items, "spec", field); err != nil {
			t.Fatal(err)
		}
	}
}

// brokerServiceHost is the service-links variable the workers read the credential broker's
// ClusterIP from (deploy/kustomize/base/dispatcher.yaml), as an env value references it.
const brokerServiceHost = "$(CREDENTIAL_BROKER_SERVICE_HOST)"

// suffixServiceLinks points the workers' references to the broker Service's variable at the
// suffixed Service's (what an operator's overlay with a nameSuffix patches).
func suffixServiceLinks(t *testing.T, d *unstructured.Unstructured, suffix string) {
	t.Helper()
	suffixed := "$(CREDENTIAL_BROKER" + strings.ToUpper(strings.ReplaceAll(suffix, "-", "_")) + "_SERVICE_HOST)"
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	for _, c := range containers {
		env, _ := c.(map[string]any)["env"].([]any)
		for _, e := range env {
			if v, _ := e.(map[string]any)["value"].(string); v == brokerServiceHost {
				e.(map[string]any)["value"] = suffixed
			}
		}
	}
	if err := unstructured.SetNestedSlice(d.Object, containers, "spec", "template", "spec", "containers"); err != nil {
		t.Fatal(err)
	}
}

// suffixBindNames adds suffix to the ClusterRole names the tenant-worker may bind.
func suffixBindNames(t *testing.T, role *unstructured.Unstructured, suffix string) {
	t.Helper()
	rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
	for _, r := range rules {
		rule := r.(map[string]any)
		if res, _ := rule["resources"].([]any); len(res) != 1 || res[0] != "clusterroles" {
			continue
		}
		names := rule["resourceNames"].([]any)
		for i, n := range names {
			names[i] = n.(string) + suffix
		}
	}
	if err := unstructured.SetNestedSlice(role.Object, rules, "rules"); err != nil {
		t.Fatal(err)
	}
}

func decodeObjects(t *testing.T, data []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []*unstructured.Unstructured
	for {
		var o map[string]any
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("decoding rendered objects: %v", err)
		}
		if o == nil {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: o})
	}
	return objs
}

// cluster is the admin's view of the local cluster.
type cluster struct {
	cfg    *rest.Config
	cs     kubernetes.Interface
	dyn    dynamic.Interface
	mapper meta.RESTMapper
	warn   *warnings
}

// warnings collects the API server's warnings (Pod Security "would violate", deprecations).
type warnings struct {
	mu   sync.Mutex
	list []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.list = append(w.list, text)
}

func (w *warnings) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.list
	w.list = nil
	return out
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	cfg := clustertest.Config(t)
	c := &cluster{cfg: cfg, warn: &warnings{}}
	cfg = rest.CopyConfig(cfg)
	cfg.WarningHandler = c.warn
	var err error
	if c.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if c.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	c.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.cs.Discovery()))
	return c
}

func (c *cluster) resource(t *testing.T, obj *unstructured.Unstructured) dynamic.ResourceInterface {
	t.Helper()
	gvk := obj.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		t.Fatalf("mapping %s: %v", gvk, err)
	}
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		return c.dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
	}
	return c.dyn.Resource(m.Resource)
}

// apply server-side applies obj with strict field validation.
func (c *cluster) apply(ctx context.Context, t *testing.T, obj *unstructured.Unstructured, dryRun bool) error {
	t.Helper()
	data, err := obj.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	force := true
	opts := metav1.PatchOptions{FieldManager: fieldManager, Force: &force, FieldValidation: "Strict"}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = c.resource(t, obj).Patch(ctx, obj.GetName(), types.ApplyPatchType, data, opts)
	if err != nil {
		return fmt.Errorf("applying %s %s/%s: %w", obj.GetKind(), obj.GetNamespace(), obj.GetName(), err)
	}
	return nil
}

// deleteAtEnd deletes cluster-scoped objects and the namespace (waiting until it is gone) when
// the test ends, pass or fail.
func (c *cluster) deleteAtEnd(t *testing.T, namespace string, objs []*unstructured.Unstructured) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		for _, o := range objs {
			if o.GetNamespace() != "" || o.GetKind() == "Namespace" {
				continue
			}
			if err := c.resource(t, o).Delete(ctx, o.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("deleting %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		}
		if namespace == "" {
			return
		}
		c.deleteNamespace(ctx, t, namespace)
	})
}

// deleteNamespace deletes ns and waits until it is gone.
func (c *cluster) deleteNamespace(ctx context.Context, t *testing.T, ns string) {
	err := c.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Errorf("deleting namespace %s: %v", ns, err)
		return
	}
	for ctx.Err() == nil {
		if _, err := c.cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); apierrors.IsNotFound(err) {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Errorf("namespace %s still there after cleanup", ns)
}

// eventually polls cond every 250ms until it returns nil or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for {
		if err = cond(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// scrape reads a worker's /metrics.
func scrape(ctx context.Context, url string) (map[string]*dto.MetricFamily, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// sum adds the values (counter, gauge, or histogram sample count) of family name whose labels
// include every label in match.
func sum(fams map[string]*dto.MetricFamily, name string, match map[string]string) float64 {
	f := fams[name]
	if f == nil {
		return 0
	}
	var total float64
metrics:
	for _, m := range f.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		for k, v := range match {
			if labels[k] != v {
				continue metrics
			}
		}
		switch {
		case m.Counter != nil:
			total += m.GetCounter().GetValue()
		case m.Gauge != nil:
			total += m.GetGauge().GetValue()
		case m.Histogram != nil:
			total += float64(m.GetHistogram().GetSampleCount())
		}
	}
	return total
}

// unstructuredInt reads a number decoded from YAML (a float64 or an int64).
func unstructuredInt(o *unstructured.Unstructured, fields ...string) int64 {
	v, _, _ := unstructured.NestedFieldNoCopy(o.Object, fields...)
	switch n := v.(type) {
	case int64:
		return n
	case float64:
		return int64(n)
	}
	return -1
}

// natsUsers are the NATS users nats-auth.conf defines: the keys of the Secret kubeclip-nats-users.
var natsUsers = []string{"kubeclip", "exec-worker", "paperclip", "cli", "status"}

// installSecrets makes the installation's Secrets in ns with hack/deploy/secrets.sh (what `make
// deploy-dev` runs: random values, made only when missing) and returns the NATS users' passwords.
func installSecrets(t *testing.T, c *cluster, ns string) map[string]string {
	t.Helper()
	cmd := exec.Command("bash", filepath.Join(root, "hack/deploy/secrets.sh"), ns)
	cmd.Env = append(os.Environ(), "KUBECTL="+kubectl(t), "KUBECONFIG="+clustertest.Kubeconfig())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("hack/deploy/secrets.sh %s: %v\n%s", ns, err, out)
	}
	users, err := c.cs.CoreV1().Secrets(ns).Get(t.Context(), "kubeclip-nats-users", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading the NATS users' Secret: %v", err)
	}
	passwords := map[string]string{}
	for _, u := range natsUsers {
		pw := string(users.Data[u])
		if len(pw) < 32 || strings.Contains(string(out), pw) {
			t.Fatalf("the password of NATS user %s is %d bytes long or was printed, want a random one of at least 32, kept secret", u, len(pw))
		}
		passwords[u] = pw
	}
	key, err := c.cs.CoreV1().Secrets(ns).Get(t.Context(), "kubeclip-sandbox-key", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading the sandbox key's Secret: %v", err)
	}
	if k := string(key.Data["key"]); len(k) != 64 || strings.Contains(string(out), k) {
		t.Fatalf("the sandbox key holds %d hex digits or was printed, want 64, kept secret", len(k))
	}
	b, err := c.cs.CoreV1().Secrets(ns).Get(t.Context(), "kubeclip-broker", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("reading the broker's Secret: %v", err)
	}
	if k := b.Data["sealing.key"]; len(k) != 32 {
		t.Fatalf("the broker's sealing key is %d bytes, want 32", len(k))
	}
	if k := b.Data["ca.key"]; len(k) == 0 || strings.Contains(string(out), "PRIVATE KEY") || strings.Contains(string(out), string(k)) {
		t.Fatalf("the broker's CA key is %d bytes or was printed, want one, kept secret", len(k))
	}
	return passwords
}
