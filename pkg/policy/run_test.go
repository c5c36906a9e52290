package policy_test

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

const (
	testRunID    = "7c9e6679-7425-40de-944b-e07fc1f90ae7"
	testAgentID  = "a1b2c3d4-0000-4000-8000-00000000a9e7"
	testWorkload = "pc-01j9zxkq3v4w5x6y7z8a9b0c1d"
	testUID      = "0b6f1c52-3c1d-4f8e-9d2a-6a7b8c9d0e1f"
)

func testRunSpec(cfg policy.Config) policy.RunSpec {
	return policy.RunSpec{
		RunID:         testRunID,
		CompanyID:     testCompanyID,
		AgentID:       testAgentID,
		AdapterType:   "claude_local",
		Namespace:     "paperclip-" + testCompanyID,
		WorkloadName:  testWorkload,
		Image:         "ghcr.io/paperclipai/agent-runtime-claude:v1",
		Config:        cfg,
		SandboxdImage: "kubeclip.local/sandboxd:dev",
	}
}

func overrideSpec(t *testing.T) policy.RunSpec {
	t.Helper()
	cfg := mustConfig(t, `{
		"runtimeClassName": "gvisor",
		"imagePullSecrets": ["regcred", "mirror-cred"],
		"defaultResources": {"limits": {"cpu": "1"}, "requests": {"memory": "1Gi"}},
		"jobTtlSecondsAfterFinished": 0,
		"podActivityDeadlineSec": 7200}`)
	spec := testRunSpec(cfg)
	spec.IssueID = "PAP-123"
	spec.AdapterType = "codex_local"
	spec.SecretEnvKeys = []string{"OPENAI_API_KEY", execspec.SeedEnv}
	spec.Image = "kubeclip.local/agent-stub:dev"
	spec.ImagePullPolicy = corev1.PullNever
	deadline := int64(900)
	spec.ActiveDeadlineSeconds = &deadline
	expires := time.Date(2026, 8, 24, 10, 45, 0, 0, time.UTC)
	spec.ExpiresAt = &expires
	return spec
}

func TestRenderJobGolden(t *testing.T) {
	spec := testRunSpec(policy.DefaultConfig())
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
	job := policy.RenderJob(spec)
	checkGoldenUnstructured(t, "run/job-defaults.yaml", job)

	over := overrideSpec(t)
	if err := over.Validate(); err != nil {
		t.Fatal(err)
	}
	job = policy.RenderJob(over)
	checkGoldenUnstructured(t, "run/job-overrides.yaml", job)

	// The override's partial limits keep the default memory limit (the TS builder dropped it).
	c := job.Spec.Template.Spec.Containers[0]
	if got := c.Resources.Limits.Memory().String() + " " + c.Resources.Limits.Cpu().String() + " " + c.Resources.Requests.Memory().String() + " " + c.Resources.Requests.Cpu().String(); got != "4Gi 1 1Gi 250m" {
		t.Errorf("resources = %s, want 4Gi 1 1Gi 250m", got)
	}
	if got := *job.Spec.ActiveDeadlineSeconds; got != 900 {
		t.Errorf("activeDeadlineSeconds = %d, want the RunSpec override 900", got)
	}
}

func TestRenderSandboxGolden(t *testing.T) {
	spec := testRunSpec(policy.DefaultConfig())
	tests := []struct {
		apiVersion, golden, wantAPIVersion string
	}{
		{"", "run/sandbox-v1beta1.yaml", "agents.x-k8s.io/v1beta1"},
		{"agents.x-k8s.io/v1beta1", "run/sandbox-v1beta1.yaml", "agents.x-k8s.io/v1beta1"},
		{"v1beta1", "run/sandbox-v1beta1.yaml", "agents.x-k8s.io/v1beta1"},
		{"agents.x-k8s.io/v1alpha1", "run/sandbox-v1alpha1.yaml", "agents.x-k8s.io/v1alpha1"},
	}
	for _, tc := range tests {
		t.Run(tc.apiVersion, func(t *testing.T) {
			sb := policy.RenderSandbox(spec, tc.apiVersion)
			if sb.GetAPIVersion() != tc.wantAPIVersion || sb.GetKind() != "Sandbox" {
				t.Fatalf("rendered %s %s", sb.GetAPIVersion(), sb.GetKind())
			}
			checkGolden(t, tc.golden, sb.Object)
		})
	}
	if got := policy.SandboxGVR("").String(); got != "agents.x-k8s.io/v1beta1, Resource=sandboxes" {
		t.Errorf("SandboxGVR = %s", got)
	}
}

// A reusable lease's Sandbox (issue 19): its claim as a volumeClaimTemplate of the operator's
// class and size, named so that the controller's claim is SandboxClaimName; the pod template
// mounts that claim where the pod backend mounts its own; no shutdownTime, though the lease
// has an expiry (RenderSandbox says why).
func TestRenderReusableSandboxGolden(t *testing.T) {
	spec := overrideSpec(t)
	op := policy.DefaultOperator()
	op.LeaseVolume = policy.DefaultLeaseVolume()
	op.LeaseVolume.StorageClass = "fast-rwo"
	pvc, err := op.RenderLeaseClaim(policy.LeaseClaim{
		Namespace: spec.Namespace, Name: policy.SandboxClaimName(spec.WorkloadName),
		RunID: spec.RunID, CompanyID: spec.CompanyID, AgentID: spec.AgentID, Size: "5Gi",
	})
	if err != nil {
		t.Fatal(err)
	}
	spec.VolumeClaim = pvc
	sb := policy.RenderSandbox(spec, policy.SandboxAPIVersionV1beta1)
	checkGolden(t, "run/sandbox-v1beta1-reusable.yaml", sb.Object)
	if want := policy.LeaseVolumeName + "-" + spec.WorkloadName; pvc.Name != want {
		t.Errorf("claim name %s, want agent-sandbox's <template>-<sandbox> %s", pvc.Name, want)
	}
}

func TestRenderPodGolden(t *testing.T) {
	checkGoldenUnstructured(t, "run/pod-defaults.yaml", policy.RenderPod(testRunSpec(policy.DefaultConfig())))
	checkGoldenUnstructured(t, "run/pod-overrides.yaml", policy.RenderPod(overrideSpec(t)))
	reusable := testRunSpec(policy.DefaultConfig())
	reusable.VolumeClaim = &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: policy.LeaseClaimName(reusable.WorkloadName)}}
	checkGoldenUnstructured(t, "run/pod-reusable.yaml", policy.RenderPod(reusable))
}

// A reusable lease's pod is the exec pod with its workspace and home on the lease's claim: the
// same mount paths (so the agent finds them where it always does), each a directory of the
// claim, and nothing else moved there.
func TestReusablePodKeepsWorkspaceAndHomeOnItsClaim(t *testing.T) {
	spec := testRunSpec(policy.DefaultConfig())
	plain := policy.RenderPod(spec)
	spec.VolumeClaim = &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "lease-1-data"}}
	pod := policy.RenderPod(spec)

	type mount struct{ Volume, SubPath string }
	mounts := map[string]mount{}
	for _, m := range pod.Spec.Containers[0].VolumeMounts {
		mounts[m.MountPath] = mount{m.Name, m.SubPath}
	}
	if diff := cmp.Diff(mount{policy.LeaseVolumeName, policy.LeaseWorkspaceDir}, mounts["/workspace"]); diff != "" {
		t.Errorf("/workspace mount (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(mount{policy.LeaseVolumeName, policy.LeaseHomeDir}, mounts["/home/paperclip"]); diff != "" {
		t.Errorf("$HOME mount (-want +got):\n%s", diff)
	}
	var claims []string
	volumes := map[string]bool{}
	for _, v := range pod.Spec.Volumes {
		volumes[v.Name] = true
		if v.PersistentVolumeClaim != nil {
			claims = append(claims, v.Name+"="+v.PersistentVolumeClaim.ClaimName)
		}
	}
	if diff := cmp.Diff([]string{policy.LeaseVolumeName + "=lease-1-data"}, claims); diff != "" {
		t.Errorf("claim volumes (-want +got):\n%s", diff)
	}
	if volumes["workspace"] || volumes["home"] {
		t.Errorf("the workspace and home emptyDirs are still there: %v", volumes)
	}
	if got, want := len(pod.Spec.Volumes), len(plain.Spec.Volumes)-1; got != want {
		t.Errorf("%d volumes, want %d (two emptyDirs replaced by the claim)", got, want)
	}
}

// A reusable lease's pod has no activeDeadlineSeconds, whatever deadline the lease was acquired
// with: it serves many runs and each resume renews the lease's expiry, which a pod's deadline
// (counted from its start, never moved later) would cut short; the dispatcher's sweep enforces
// the expiry. Any other exec pod keeps the lease's deadline.
func TestReusablePodHasNoKubeletDeadline(t *testing.T) {
	spec := testRunSpec(policy.DefaultConfig())
	secs := int64(900)
	spec.ActiveDeadlineSeconds = &secs
	if got := policy.RenderPod(spec).Spec.ActiveDeadlineSeconds; got == nil || *got != secs {
		t.Fatalf("a lease's pod: activeDeadlineSeconds %v, want %d", got, secs)
	}
	spec.VolumeClaim = &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "lease-1-data"}}
	if got := policy.RenderPod(spec).Spec.ActiveDeadlineSeconds; got != nil {
		t.Errorf("a reusable lease's pod: activeDeadlineSeconds %d, want none", *got)
	}
}

// An exec-capable pod is the Job's pod with sandboxd as its main process: the same container,
// security context, resources, Secret values and volumes, plus sandboxd's init container,
// volumes and port, no restarts, and the lease's deadline. A Sandbox's pod template is exactly
// that pod. The run Secret's sandboxd seed reaches only the init container, which writes it to a
// memory volume sandboxd reads it from: the agent container takes the Secret's other keys by
// name, not the whole Secret.
func TestExecPodsAreTheJobPodPlusSandboxd(t *testing.T) {
	spec := overrideSpec(t)
	spec.SecretEnvKeys = []string{"OPENAI_API_KEY", execspec.SeedEnv}
	jobTmpl, err := policy.ToUnstructured(&corev1.PodTemplate{TypeMeta: typeMeta("v1", "PodTemplate"), Template: policy.RenderJob(spec).Spec.Template})
	if err != nil {
		t.Fatal(err)
	}
	want := jobTmpl.Object["template"].(map[string]any)
	podSpec := want["spec"].(map[string]any)
	podSpec["restartPolicy"] = "Never"
	podSpec["activeDeadlineSeconds"] = int64(900) // the bounded-lease override reaches the pod
	podSpec["terminationGracePeriodSeconds"] = int64(120)
	agent := podSpec["containers"].([]any)[0].(map[string]any)
	secretKey := func(key string) map[string]any {
		return map[string]any{"name": key, "valueFrom": map[string]any{"secretKeyRef": map[string]any{"name": testWorkload + "-env", "key": key}}}
	}
	if got := agent["envFrom"].([]any); len(got) != 1 {
		t.Fatalf("the Job's agent container: envFrom %v, want the run Secret", got)
	}
	delete(agent, "envFrom")
	agent["env"] = append(agent["env"].([]any), secretKey("BOOTSTRAP_TOKEN"), secretKey("OPENAI_API_KEY"))
	agent["command"] = []any{"/kubeclip/bin/sandboxd", "serve", "--journal-dir", "/kubeclip/run/journal", "--seed-file", "/kubeclip/seed/seed"}
	agent["workingDir"] = "/workspace"
	agent["ports"] = []any{map[string]any{"name": "sandboxd", "containerPort": int64(7070), "protocol": "TCP"}}
	// sandboxd's binary is read-only to the agent (only the init container writes it); its
	// socket and journals are in their own directory.
	agent["volumeMounts"] = append(agent["volumeMounts"].([]any),
		map[string]any{"name": "kubeclip-bin", "mountPath": "/kubeclip/bin", "readOnly": true},
		map[string]any{"name": "kubeclip", "mountPath": "/kubeclip/run"},
		map[string]any{"name": "kubeclip-seed", "mountPath": "/kubeclip/seed"})
	podSpec["initContainers"] = []any{map[string]any{
		"name": "sandboxd-install", "image": "kubeclip.local/sandboxd:dev", "imagePullPolicy": "IfNotPresent",
		"args":            []any{"install", "/kubeclip/bin/sandboxd", "/kubeclip/seed/seed"},
		"env":             []any{secretKey(execspec.SeedEnv)},
		"securityContext": agent["securityContext"],
		"resources": map[string]any{
			"requests": map[string]any{"cpu": "100m", "memory": "128Mi"},
			"limits":   map[string]any{"cpu": "100m", "memory": "128Mi"},
		},
		"volumeMounts": []any{
			map[string]any{"name": "kubeclip-bin", "mountPath": "/kubeclip/bin"},
			map[string]any{"name": "kubeclip-seed", "mountPath": "/kubeclip/seed"},
		},
	}}
	podSpec["volumes"] = append(podSpec["volumes"].([]any),
		map[string]any{"name": "kubeclip-bin", "emptyDir": map[string]any{"sizeLimit": "64Mi"}},
		map[string]any{"name": "kubeclip", "emptyDir": map[string]any{"sizeLimit": "2Gi"}},
		map[string]any{"name": "kubeclip-seed", "emptyDir": map[string]any{"medium": "Memory", "sizeLimit": "1Mi"}})

	pod, err := policy.ToUnstructured(policy.RenderPod(spec))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want["spec"], pod.Object["spec"]); diff != "" {
		t.Errorf("exec pod spec differs from the Job's pod plus sandboxd (-want +got):\n%s", diff)
	}
	sb := policy.RenderSandbox(spec, "")
	sbSpec := sb.Object["spec"].(map[string]any)
	if diff := cmp.Diff(want, sbSpec["podTemplate"]); diff != "" {
		t.Errorf("Sandbox pod template differs from the exec pod (-want +got):\n%s", diff)
	}
	if _, ok := sbSpec["replicas"]; ok {
		t.Errorf("Sandbox has spec.replicas")
	}
	if sbSpec["shutdownTime"] != "2026-08-24T10:45:00Z" || sbSpec["shutdownPolicy"] != "Delete" {
		t.Errorf("Sandbox shutdown = %v, %v; want the lease's expiry, Delete", sbSpec["shutdownTime"], sbSpec["shutdownPolicy"])
	}
}

// Every field the Sandbox sets exists in the agent-sandbox CRD schema of its version (so the
// API server prunes nothing), with the right type, and required fields are present. The CRD is
// agent-sandbox v0.5.6's (pkg/policy/testdata/crds), the last to serve both versions.
func TestSandboxMatchesCRDSchema(t *testing.T) {
	schemas := loadCRDSchemas(t, "agents.x-k8s.io_sandboxes.yaml")
	for _, spec := range []policy.RunSpec{testRunSpec(policy.DefaultConfig()), overrideSpec(t)} {
		for _, version := range []string{"v1beta1", "v1alpha1"} {
			t.Run(version, func(t *testing.T) {
				schema, ok := schemas[version]
				if !ok {
					t.Fatalf("CRD has no version %s", version)
				}
				sb := policy.RenderSandbox(spec, "agents.x-k8s.io/"+version)
				var problems []string
				checkSchema("", sb.Object, schema, &problems)
				if len(problems) > 0 {
					t.Errorf("Sandbox %s does not match the CRD schema:\n%s", version, strings.Join(problems, "\n"))
				}
			})
		}
	}
	// The walker itself must catch an unknown field.
	bad := policy.RenderSandbox(testRunSpec(policy.DefaultConfig()), "")
	bad.Object["spec"].(map[string]any)["replicas"] = int64(1)
	var problems []string
	checkSchema("", bad.Object, schemas["v1beta1"], &problems)
	if !slices.Contains(problems, ".spec.replicas: not in the schema") {
		t.Errorf("schema walker missed spec.replicas in v1beta1: %v", problems)
	}
}

func TestRenderSecret(t *testing.T) {
	spec := testRunSpec(policy.DefaultConfig())
	owner := policy.OwnerReference("batch/v1", "Job", testWorkload, testUID)
	env := map[string]string{"ANTHROPIC_API_KEY": "sk-ant-test", "MODE": "fast"}
	for k, v := range policy.EgressGrantEnv(policy.EgressGrant{AllowFqdns: []string{"github.com"}, AllowCidrs: []string{"10.0.0.0/8", "192.168.0.0/16"}}) {
		env[k] = v
	}
	sec, err := policy.RenderSecret(spec, owner, strings.Repeat("ab", 32), env)
	if err != nil {
		t.Fatal(err)
	}
	checkGoldenUnstructured(t, "run/secret.yaml", sec)

	tests := []struct {
		name    string
		owner   string
		token   string
		env     map[string]string
		wantIs  error
		wantMsg string
	}{
		{name: "reserved key", owner: testUID, token: "t", env: map[string]string{"BOOTSTRAP_TOKEN": "sekrit"}, wantIs: policy.ErrReservedEnvKey,
			wantMsg: "rendering run secret: adapterEnv must not contain BOOTSTRAP_TOKEN (reserved key): reserved env key"},
		{name: "no owner uid", owner: "", token: "t", wantMsg: "rendering run secret: the owner reference needs the workload's uid"},
		{name: "no token", owner: testUID, token: "", wantMsg: "rendering run secret: empty bootstrap token"},
		{name: "bad key", owner: testUID, token: "t", env: map[string]string{"A B": "sekrit"}, wantMsg: `rendering run secret: key "A B" is not a valid Secret key`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := policy.OwnerReference("batch/v1", "Job", testWorkload, "")
			o.UID = typesUID(tc.owner)
			_, err := policy.RenderSecret(spec, o, tc.token, tc.env)
			if err == nil || err.Error() != tc.wantMsg {
				t.Fatalf("error = %v, want %q", err, tc.wantMsg)
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("errors.Is(%v, %v) = false", err, tc.wantIs)
			}
			if strings.Contains(err.Error(), "sekrit") {
				t.Errorf("error echoes a secret value")
			}
		})
	}
}

func TestNewBootstrapToken(t *testing.T) {
	tok, err := policy.NewBootstrapToken(bytes.NewReader(bytes.Repeat([]byte{0xab}, 40)))
	if err != nil {
		t.Fatal(err)
	}
	if tok != strings.Repeat("ab", 32) {
		t.Errorf("token = %q, want 32 bytes hex-encoded", tok)
	}
	if _, err := policy.NewBootstrapToken(bytes.NewReader(make([]byte, 31))); err == nil {
		t.Errorf("a short random source did not fail")
	}
}
