package isolation

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// TestCompanyKnobsAndListsAreRefused is issue 15 items 9 and 18 through the real tenant-worker
// and dispatcher, each from the corpus of hostile requests: a knob the operator did not allow
// (the workers run with the default bounds), an invalid image reference that became a Job, a
// list of 40,000 FQDNs rendered into one policy, a custom adapter collecting the built-in
// adapters' API keys. Each is one `failed` naming the field, and nothing is applied.
func TestCompanyKnobsAndListsAreRefused(t *testing.T) {
	cs := clustertest.Clientset(t)
	fqdns := make([]string, 40000)
	for i := range fqdns {
		fqdns[i] = fmt.Sprintf("h%d.example.com", i)
	}
	adapter := func(kv ...any) func(map[string]any) {
		return func(c map[string]any) {
			a := c["adapters"].([]any)[0].(map[string]any)
			for i := 0; i+1 < len(kv); i += 2 {
				a[kv[i].(string)] = kv[i+1]
			}
		}
	}
	for _, tc := range []struct {
		name   string
		code   events.Code
		field  string
		config json.RawMessage
	}{{
		name: "opting out of the runtime class", code: events.CodeInvalidConfig, field: "config.runtimeClassName",
		config: sleeping(withConfig("runtimeClassName", "runc")),
	}, {
		name: "another company's cloud identity", code: events.CodeInvalidConfig, field: `config.serviceAccountAnnotations["eks.amazonaws.com/role-arn"]`,
		config: sleeping(withConfig("serviceAccountAnnotations", map[string]string{"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/other"})),
	}, {
		name: "an invalid image reference", code: events.CodeInvalidConfig, field: "config.adapters[0].runtimeImage",
		config: sleeping(adapter("runtimeImage", "UPPER/Case@sha256:zz")),
	}, {
		name: "40,000 egress FQDNs", code: events.CodeInvalidConfig, field: "config.egressAllowFqdns",
		config: sleeping(withConfig("egressAllowFqdns", fqdns)),
	}, {
		name: "a custom adapter naming the built-ins' keys", code: events.CodeInvalidConfig, field: "config.adapters[0].envKeys[0]",
		config: sleeping(withConfig("adapterType", "custom_local"), adapter("adapterType", "custom_local", "envKeys", []string{"ANTHROPIC_API_KEY", "OPENAI_API_KEY"})),
	}} {
		t.Run(tc.name, func(t *testing.T) {
			company := pt.NewID("co")
			pt.CleanupTenant(t, cs, company)
			r := env.NewRun(t, company, pt.NewID("agent"))
			r.Collect()
			subj, _ := env.Subjects.Lease(company, events.LeaseAcquire)
			msg := nats.NewMsg(subj)
			msg.Header.Set(events.HeaderMsgID, r.RunID+".acquire")
			msg.Data = acquireJSON(r.Request(tc.config))
			if _, err := env.JS.PublishMsg(t.Context(), msg); err != nil {
				t.Fatal(err)
			}
			failed := waitFailed(t, r, events.LeaseAcquire)
			checkFailed(t, failed, tc.code, tc.field)
			if !strings.Contains(failed.Message, tc.field) {
				t.Errorf("message %q does not name %s", failed.Message, tc.field)
			}
			if strings.Contains(failed.Message, "arn:aws") {
				t.Errorf("message %q echoes the annotation's value", failed.Message)
			}
			checkNothingApplied(t, cs, company, r.RunID)
		})
	}
}

// TestTenantPodsAreBounded is issue 15 items 9, 10 and 16 on the live cluster: an exec pod (the
// sandboxd init container included) is admitted under the tenant quota, which now counts local
// storage, every container asks for and is bounded in it, the node-loaded stub image runs
// as it is, and the tenant's CiliumNetworkPolicy with its deny rule passes the CRD schema.
func TestTenantPodsAreBounded(t *testing.T) {
	cs := clustertest.Clientset(t)
	ctx := t.Context()
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	r := env.Acquire(t, company, pt.NewID("agent"), sleeping(withConfig("backend", "pod", "podActivityDeadlineSec", 600, "egressMode", "cilium")))
	created := pt.WaitKind[events.RunCreatedEvent](r, runTimeout)
	t.Cleanup(func() { r.Release(created.ProviderLeaseID, true) })

	pod, err := cs.CoreV1().Pods(created.Namespace).Get(ctx, created.WorkloadName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range append(append([]corev1.Container(nil), pod.Spec.InitContainers...), pod.Spec.Containers...) {
		req, lim := c.Resources.Requests[corev1.ResourceEphemeralStorage], c.Resources.Limits[corev1.ResourceEphemeralStorage]
		if req.IsZero() || lim.IsZero() {
			t.Errorf("container %s: ephemeral-storage request %s, limit %s", c.Name, req.String(), lim.String())
		}
	}
	if got := pod.Spec.Containers[0].ImagePullPolicy; got != corev1.PullIfNotPresent {
		t.Errorf("the preloaded stub image pulls %s, want IfNotPresent (--preloaded-images)", got)
	}
	quota, err := cs.CoreV1().ResourceQuotas(created.Namespace).Get(ctx, policy.TenantResourceQuota, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []corev1.ResourceName{corev1.ResourceRequestsEphemeralStorage, corev1.ResourceLimitsEphemeralStorage} {
		if q := quota.Spec.Hard[name]; q.IsZero() {
			t.Errorf("tenant quota has no %s", name)
		}
	}

	dyn, err := dynamic.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	cnp, err := dyn.Resource(policy.CiliumNetworkPolicyGVR).Namespace(created.Namespace).Get(ctx, policy.EgressFQDNPolicyName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the tenant's CiliumNetworkPolicy: %v", err)
	}
	deny, _ := cnp.Object["spec"].(map[string]any)["egressDeny"].([]any)
	if len(deny) == 0 || !strings.Contains(fmt.Sprint(deny), "169.254.0.0/16") {
		t.Errorf("egressDeny = %v, want the private and reserved ranges", deny)
	}
}

// TestTenantImagesArePulled is issue 15 item 9: a tenant image the nodes do not hold preloaded
// is pulled Always, so the registry checks the pod's own credentials rather than trusting a
// copy another company's pull secret brought to the node.
func TestTenantImagesArePulled(t *testing.T) {
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	cfg := sleeping(func(c map[string]any) { delete(c, "adapters") })
	r := env.Acquire(t, company, pt.NewID("agent"), cfg)
	created := pt.WaitKind[events.RunCreatedEvent](r, runTimeout)
	t.Cleanup(func() { r.Release(created.ProviderLeaseID, true) })
	job, err := cs.BatchV1().Jobs(created.Namespace).Get(t.Context(), created.WorkloadName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if c := job.Spec.Template.Spec.Containers[0]; c.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("%s pulls %s, want Always", c.Image, c.ImagePullPolicy)
	}
}
