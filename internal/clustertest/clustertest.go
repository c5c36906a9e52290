// Package clustertest gives tests the local Kubernetes cluster (or the one the user points at).
//
// Tests that need a real API server and kubelet call Config. It never skips: when no cluster
// answers it fails the test and says how to bring one up.
package clustertest

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// DefaultKubeconfig is where hack/cluster/cluster.sh writes the admin kubeconfig of the local cluster.
const DefaultKubeconfig = "/var/lib/kubeclip/cluster/admin.kubeconfig"

// KubeconfigEnv names the variable that points the tests (and the harness) at an existing cluster.
const KubeconfigEnv = "KUBECLIP_KUBECONFIG"

// Kubeconfig returns the path of the kubeconfig the tests use.
func Kubeconfig() string {
	if p := os.Getenv(KubeconfigEnv); p != "" {
		return p
	}
	return DefaultKubeconfig
}

// Config returns a rest.Config for the test cluster, failing t if the cluster does not answer.
func Config(t testing.TB) *rest.Config {
	t.Helper()
	path := Kubeconfig()
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatalf("loading kubeconfig %s: %v\nbring the local cluster up with `make cluster-up`, or set %s to an existing cluster's kubeconfig", path, err, KubeconfigEnv)
	}
	cfg.QPS, cfg.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("building clientset: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx); err != nil {
		t.Fatalf("cluster at %s is not ready: %v\nbring the local cluster up with `make cluster-up`, or set %s", cfg.Host, err, KubeconfigEnv)
	}
	return cfg
}

// Clientset returns a typed clientset for the test cluster.
func Clientset(t testing.TB) kubernetes.Interface {
	t.Helper()
	cs, err := kubernetes.NewForConfig(Config(t))
	if err != nil {
		t.Fatalf("building clientset: %v", err)
	}
	return cs
}

// SandboxControllerProbe is where the local cluster's agent-sandbox controller answers /readyz
// (AGENT_SANDBOX_PROBE in hack/cluster/cluster.sh, which starts it).
const SandboxControllerProbe = "127.0.0.1:10281"

// RequireSandboxController fails t unless agent-sandbox's controller runs for the test cluster,
// so that a sandbox-cr test says why instead of waiting out its timeout for a pod no one makes.
// On the local cluster it asks the controller cluster.sh runs; on a cluster of
// KUBECLIP_KUBECONFIG, whose controller runs where its operator put it, it checks that the
// Sandbox API is served.
func RequireSandboxController(t testing.TB) {
	t.Helper()
	if os.Getenv(KubeconfigEnv) != "" {
		cs := Clientset(t)
		if _, err := cs.Discovery().ServerResourcesForGroupVersion("agents.x-k8s.io/v1beta1"); err != nil {
			t.Fatalf("the cluster of %s does not serve agent-sandbox's Sandbox (agents.x-k8s.io/v1beta1): %v\ninstall agent-sandbox (its CRDs and controller) there", KubeconfigEnv, err)
		}
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+SandboxControllerProbe+"/readyz", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return
		}
		err = fmt.Errorf("/readyz answered %s", resp.Status)
	}
	t.Fatalf("the local cluster's agent-sandbox controller is not ready at %s: %v\n`make cluster-up` (re)starts it (log: /var/lib/kubeclip/cluster/logs/agent-sandbox-controller.log)", SandboxControllerProbe, err)
}
