package dryrun_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubeclip/kubeclip/pkg/broker/ca"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// TestBrokeredObjectsPassServerDryRun is TestRenderedObjectsPassServerDryRun for an
// installation wired to the credential broker (issue 27): the tenant with the CA's ConfigMap
// and both egress modes' policies admitting the broker and no bound host, and every backend's
// pod with hostAliases, the CA mounted and named (policy.BrokerCAEnv), judged by the API server, the
// Cilium and agent-sandbox CRD schemas and Pod Security "restricted" (a real Pod is created).
func TestBrokeredObjectsPassServerDryRun(t *testing.T) {
	warnings := &warningRecorder{}
	c := newCluster(t, warnings)
	ctx := t.Context()
	t.Cleanup(func() {
		for _, w := range warnings.take() {
			t.Errorf("API server warning: %s", w)
		}
	})
	c.requireResource(t, policy.CiliumNetworkPolicyGVR, "cilium.io_ciliumnetworkpolicies.yaml")
	c.requireResource(t, policy.SandboxGVR(policy.SandboxAPIVersionV1beta1), "agents.x-k8s.io_sandboxes.yaml")

	hosts := []string{"api.anthropic.com", "api.openai.com"}
	authority, err := ca.Generate(ca.Options{Hosts: hosts})
	if err != nil {
		t.Fatal(err)
	}
	op := policy.DefaultOperator()
	op.Broker = policy.Broker{Address: "10.96.0.42", Hosts: hosts, CACert: string(authority.CertPEM())}
	if err := op.Validate(); err != nil {
		t.Fatalf("Operator.Validate: %v", err)
	}

	companyID := "dryrun-broker-" + strings.ToLower(ulid.Make().String())
	cfg, err := policy.ParseConfig([]byte(`{"namespacePrefix": "kubeclip-test-", "egressAllowFqdns": ["github.com", "*.anthropic.com"]}`))
	if err != nil {
		t.Fatalf("ParseConfig: %v", err)
	}
	adapter, err := cfg.Adapter("opencode_local")
	if err != nil {
		t.Fatal(err)
	}
	standard, err := policy.RenderTenant(cfg, companyID, op, adapter)
	if err != nil {
		t.Fatalf("RenderTenant: %v", err)
	}
	ciliumCfg := cfg
	ciliumCfg.EgressMode = policy.EgressCilium
	cilium, err := policy.RenderTenant(ciliumCfg, companyID, op, adapter)
	if err != nil {
		t.Fatalf("RenderTenant (cilium): %v", err)
	}
	if standard.BrokerCA == nil {
		t.Fatal("the wired tenant has no CA ConfigMap")
	}
	ns := standard.Namespace.Name
	if _, err := c.cs.CoreV1().Namespaces().Create(ctx, standard.Namespace, metav1.CreateOptions{FieldValidation: strict}); err != nil {
		t.Fatalf("creating namespace %s: %v", ns, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("deleting namespace %s: %v", ns, err)
		}
	})

	for name, tenant := range map[string]policy.Tenant{"standard": standard, "cilium": cilium} {
		t.Run("tenant/"+name, func(t *testing.T) {
			objs, err := tenant.Objects()
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range objs {
				if err := c.apply(ctx, t, o, true); err != nil {
					t.Errorf("dry-run apply of %s %s: %v", o.GetKind(), o.GetName(), err)
				}
			}
		})
	}
	// The pods' ServiceAccount and the CA they mount, and the LimitRange and quota that take
	// part in admission, for real.
	objs, err := standard.Objects()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceAccount", "LimitRange", "ResourceQuota", "ConfigMap":
			if err := c.apply(ctx, t, o, false); err != nil {
				t.Fatalf("applying %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		}
	}

	spec := policy.RunSpec{
		RunID: "run-" + strings.ToLower(ulid.Make().String()), CompanyID: companyID, AgentID: "agent-dryrun",
		AdapterType: "opencode_local", Namespace: ns, WorkloadName: policy.WorkloadName(ulid.Make()),
		Image: agentImage, Config: cfg, SandboxdImage: "kubeclip.local/sandboxd:dev", Broker: op.Broker,
	}
	if err := spec.Validate(); err != nil {
		t.Fatalf("RunSpec.Validate: %v", err)
	}
	job := policy.RenderJob(spec)
	pod := policy.RenderPod(spec)
	warm, _ := policy.RenderWarmPod(policy.WarmSpec(spec), policy.WorkloadName(ulid.Make()), make([]byte, 32))
	for name, obj := range map[string]runtime.Object{"job": job, "pod": pod, "warm pod": warm} {
		t.Run(name, func(t *testing.T) {
			u, err := policy.ToUnstructured(obj)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.dryRunCreate(ctx, t, u); err != nil {
				t.Fatalf("dry-run create: %v", err)
			}
		})
	}
	t.Run("sandbox/v1beta1", func(t *testing.T) {
		if _, err := c.dryRunCreate(ctx, t, policy.RenderSandbox(spec, policy.SandboxAPIVersionV1beta1)); err != nil {
			t.Fatalf("dry-run create of Sandbox: %v", err)
		}
	})
	t.Run("scoped-egress", func(t *testing.T) {
		owner := policy.OwnerReference("batch/v1", "Job", job.Name, types.UID("00000000-0000-4000-8000-000000000001"))
		for _, cfg := range []policy.Config{cfg, ciliumCfg} {
			s := spec
			s.Config = cfg
			u, err := policy.RenderScopedEgress(s, policy.EgressGrant{AllowFqdns: []string{"api.openai.com", "registry.npmjs.org"}}, owner)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.dryRunCreate(ctx, t, u); err != nil {
				t.Errorf("dry-run create of %s: %v", u.GetKind(), err)
			}
		}
	})
	t.Run("pod-security", func(t *testing.T) {
		// A real Pod from the wired Job's template is admitted by "restricted", and its CA
		// ConfigMap exists for the kubelet to mount.
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: job.Name + "-psa", Namespace: ns, Labels: job.Spec.Template.Labels},
			Spec:       *job.Spec.Template.Spec.DeepCopy(),
		}
		created, err := c.cs.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{FieldValidation: strict})
		if err != nil {
			t.Fatalf("creating a Pod from the wired Job's template: %v", err)
		}
		if len(created.Spec.HostAliases) != 1 || created.Spec.HostAliases[0].IP != op.Broker.Address {
			t.Errorf("the created Pod's hostAliases are %+v", created.Spec.HostAliases)
		}
		if err := c.cs.CoreV1().Pods(ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr[int64](0)}); err != nil {
			t.Errorf("deleting Pod: %v", err)
		}
		if _, err := c.cs.CoreV1().ConfigMaps(ns).Get(ctx, policy.BrokerCAConfigMap, metav1.GetOptions{}); err != nil {
			t.Errorf("the tenant's CA ConfigMap: %v", err)
		}
	})
}
