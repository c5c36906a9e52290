package policy_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

// Issue 15 item 10: no ephemeral-storage requests, limits or quota, so one tenant's pods could
// fill a node's disk (≈14 GiB of emptyDir each). Every tenant container asks for and is bounded
// in local storage (the agent container explicitly, any other through the LimitRange's
// defaults), every emptyDir has a size, and the tenant quota bounds the namespace's total.
func TestTenantLocalStorageIsBounded(t *testing.T) {
	spec := testRunSpec(policy.DefaultConfig())
	for name, pod := range renderedPods(t, spec) {
		agent := pod.Spec.Containers[0]
		req, lim := agent.Resources.Requests[corev1.ResourceEphemeralStorage], agent.Resources.Limits[corev1.ResourceEphemeralStorage]
		if req.IsZero() || lim.IsZero() || req.Cmp(lim) > 0 {
			t.Errorf("%s: agent ephemeral-storage request %s, limit %s; want both, request <= limit", name, req.String(), lim.String())
		}
		for _, v := range pod.Spec.Volumes {
			if v.EmptyDir != nil && (v.EmptyDir.SizeLimit == nil || v.EmptyDir.SizeLimit.IsZero()) {
				t.Errorf("%s: emptyDir %s has no sizeLimit", name, v.Name)
			}
		}
	}
	ten := mustTenant(t, policy.DefaultConfig(), mustAdapter(t, policy.DefaultConfig(), "claude_local"))
	lr := ten.LimitRange.Spec.Limits[0]
	for what, list := range map[string]corev1.ResourceList{"default": lr.Default, "defaultRequest": lr.DefaultRequest, "max": lr.Max} {
		if q := list[corev1.ResourceEphemeralStorage]; q.IsZero() {
			t.Errorf("LimitRange %s has no ephemeral-storage", what)
		}
	}
	for _, name := range []corev1.ResourceName{corev1.ResourceRequestsEphemeralStorage, corev1.ResourceLimitsEphemeralStorage} {
		if q := ten.ResourceQuota.Spec.Hard[name]; q.IsZero() {
			t.Errorf("ResourceQuota has no %s", name)
		}
	}
	// The agent's own limit fits the LimitRange it is checked against.
	agentLim := renderedPods(t, spec)["job"].Spec.Containers[0].Resources.Limits[corev1.ResourceEphemeralStorage]
	if max := lr.Max[corev1.ResourceEphemeralStorage]; agentLim.Cmp(max) > 0 {
		t.Errorf("agent ephemeral-storage limit %s exceeds the LimitRange max %s", agentLim.String(), max.String())
	}
}

// renderedPods are the pod specs of the three backends: the Job's template, the bare Pod and the
// Sandbox's podTemplate.
func renderedPods(t *testing.T, spec policy.RunSpec) map[string]corev1.PodTemplateSpec {
	t.Helper()
	job := policy.RenderJob(spec)
	pod := policy.RenderPod(spec)
	sb := policy.RenderSandbox(spec, "")
	tmpl, _ := sb.Object["spec"].(map[string]any)["podTemplate"].(map[string]any)
	var sandbox corev1.PodTemplateSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(tmpl, &sandbox); err != nil {
		t.Fatal(err)
	}
	return map[string]corev1.PodTemplateSpec{
		"job":     job.Spec.Template,
		"pod":     {ObjectMeta: pod.ObjectMeta, Spec: pod.Spec},
		"sandbox": sandbox,
	}
}

// Issue 15 item 10: the tenant quota is the operator's (--tenant-quota), defaulting to the
// values it had when it was hard-coded, plus local storage, and (issue 19) volume claims and the
// storage they request, which every tenant quota counts whatever the operator's names.
func TestTenantQuotaFromOperator(t *testing.T) {
	def, err := policy.ParseResourceList("pods=20,requests.cpu=10,requests.memory=20Gi,limits.cpu=20,limits.memory=40Gi,requests.ephemeral-storage=20Gi,limits.ephemeral-storage=240Gi,persistentvolumeclaims=20,requests.storage=200Gi")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(policy.FormatResourceList(def), policy.FormatResourceList(policy.DefaultTenantQuota())); diff != "" {
		t.Errorf("DefaultTenantQuota (-want +got):\n%s", diff)
	}
	quota, err := policy.ParseResourceList("pods=5, limits.ephemeral-storage=100Gi,count/jobs.batch=10")
	if err != nil {
		t.Fatal(err)
	}
	op := policy.DefaultOperator()
	op.TenantQuota = quota
	ten, err := policy.RenderTenant(policy.DefaultConfig(), testCompanyID, op, mustAdapter(t, policy.DefaultConfig(), "claude_local"))
	if err != nil {
		t.Fatal(err)
	}
	if got := policy.FormatResourceList(ten.ResourceQuota.Spec.Hard); got != "count/jobs.batch=10,limits.ephemeral-storage=100Gi,persistentvolumeclaims=20,pods=5,requests.storage=200Gi" {
		t.Errorf("rendered quota %s", got)
	}
	if got := policy.FormatResourceList(mustTenant(t, policy.DefaultConfig()).ResourceQuota.Spec.Hard); got != policy.FormatResourceList(def) {
		t.Errorf("quota without an operator setting %s", got)
	}
	for _, bad := range []string{"pods", "pods=-1", "pods=x", "bad name!=1", "pods=1,pods=2"} {
		if _, err := policy.ParseResourceList(bad); err == nil {
			t.Errorf("ParseResourceList(%q) accepted", bad)
		}
	}
	op.TenantQuota = corev1.ResourceList{corev1.ResourceLimitsEphemeralStorage: resource.MustParse("1Gi")}
	if err := op.Validate(); err == nil {
		t.Errorf("a quota no agent pod fits was accepted")
	}
}
