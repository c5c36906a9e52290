package policy

import (
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Sandbox API versions (kubernetes-sigs/agent-sandbox). v1beta1 is the storage version since
// agent-sandbox v0.5; v1alpha1 is still served (deprecated) through the controller's
// conversion webhook.
const (
	SandboxAPIVersionV1beta1  = "agents.x-k8s.io/v1beta1"
	SandboxAPIVersionV1alpha1 = "agents.x-k8s.io/v1alpha1"
	SandboxKind               = "Sandbox"
)

// SandboxGVR is the Sandbox resource of the given API version ("" for the default).
func SandboxGVR(apiVersion string) schema.GroupVersionResource {
	gv, _ := schema.ParseGroupVersion(normalizeSandboxAPIVersion(apiVersion))
	return gv.WithResource("sandboxes")
}

// RunSpec is what a run's workload is rendered from.
type RunSpec struct {
	RunID     string
	CompanyID string
	// AgentID labels the workload; empty leaves the label out.
	AgentID string
	// IssueID, when set, is recorded in the paperclip.io/issue-id annotation.
	IssueID     string
	AdapterType string
	// Namespace is the tenant namespace (TenantNamespace).
	Namespace string
	// WorkloadName names the Job or Sandbox (WorkloadName); the Secret is SecretName of it.
	WorkloadName string
	// Image is the resolved image (ResolveImage).
	Image string
	// ImagePullPolicy of the agent container defaults to Always (Operator.PullPolicy says when
	// a cached copy may be used instead).
	ImagePullPolicy corev1.PullPolicy
	// Config must have passed Validate (ParseConfig does that).
	Config Config
	// ActiveDeadlineSeconds, when set, replaces config.podActivityDeadlineSec as the deadline of
	// the run's pod (a bounded lease; see ComputeBoundedLeaseDeadline).
	ActiveDeadlineSeconds *int64
	// ExpiresAt, when set, is the lease's hard stop: a Sandbox's spec.shutdownTime.
	ExpiresAt *time.Time
	// SandboxdImage is kubeclip's sandboxd image (an operator setting, never a tenant's), whose
	// init container copies sandboxd into an exec-capable backend's pod.
	SandboxdImage string
	// SecretEnvKeys are the run Secret's keys an exec-capable pod's agent container gets as
	// environment variables, each by name (SecretEnvKeys of the Secret): that Secret also holds
	// the lease's sandboxd seed, which only the init container reads. A Job's pod takes the
	// whole Secret. BOOTSTRAP_TOKEN is always among them.
	SecretEnvKeys []string
	// VolumeClaim is a reusable lease's PersistentVolumeClaim as Operator.RenderLeaseClaim
	// rendered it: its pod keeps the workspace and the agent's home on it (RenderPod; a
	// Sandbox's controller makes it from RenderSandbox's volumeClaimTemplate). Nil for any other
	// lease.
	VolumeClaim *corev1.PersistentVolumeClaim
	// Broker wires the pod to the credential broker (Operator.Broker, the same for every run of
	// the installation); the zero Broker wires nothing. The tenant holds its CA (RenderTenant).
	Broker Broker
}

// Validate checks the fields the rendered objects need, naming each bad one (runId, agentId,
// companyId, adapterType, namespace, workloadName, image, imagePullPolicy,
// activeDeadlineSeconds). Render functions assume it passed.
func (s RunSpec) Validate() error {
	var errs fieldErrors
	checkID(&errs, "runId", s.RunID)
	if s.AgentID != "" {
		checkID(&errs, "agentId", s.AgentID)
	}
	checkID(&errs, "companyId", s.CompanyID)
	checkID(&errs, "adapterType", s.AdapterType)
	if msg := checkDNSLabel(s.Namespace); msg != "" {
		errs.add("namespace", msg)
	}
	// A Job's name becomes its pods' job-name label value, so it must be a DNS label too.
	if msg := checkDNSLabel(s.WorkloadName); msg != "" {
		errs.add("workloadName", msg)
	}
	if msg := checkImageReference(s.Image); msg != "" {
		errs.add("image", msg)
	}
	switch s.ImagePullPolicy {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		errs.add("imagePullPolicy", fmt.Sprintf("must be one of Always, IfNotPresent, Never, got %s", quoteShort(string(s.ImagePullPolicy))))
	}
	if s.ActiveDeadlineSeconds != nil && *s.ActiveDeadlineSeconds <= 0 {
		errs.add("activeDeadlineSeconds", "must be > 0")
	}
	if s.SandboxdImage != "" {
		if msg := checkImageReference(s.SandboxdImage); msg != "" {
			errs.add("sandboxdImage", msg)
		}
	}
	return errs.err()
}

// Container names, paths and commands of the agent pod (pod-spec-builder.ts,
// sandbox-cr-builder.ts).
const (
	AgentContainerName = "agent"
	agentHome          = "/home/paperclip"
	agentUID           = 1000
)

var jobCommand = []string{"/usr/bin/tini", "--", "/usr/local/bin/paperclip-agent-shim"}

// ContainerResources is the agent container's resources: the defaults (requests 250m/512Mi,
// limits 2/4Gi) with each of defaultResources' fields laid over them.
//
// Deviation: upstream replaces requests or limits wholesale, so {limits: {cpu: "1"}} dropped the
// memory limit; kubeclip overrides field by field and keeps the default memory.
//
// Local storage is not the company's to choose: the agent asks for AgentEphemeralStorageRequest
// and is bounded by AgentEphemeralStorageLimit, which the kubelet counts against everything the
// pod writes locally (its emptyDirs, its logs, its writable layer) and evicts the pod beyond.
func (c Config) ContainerResources() corev1.ResourceRequirements {
	var reqs, lims *ResourceList
	if c.DefaultResources != nil {
		reqs, lims = c.DefaultResources.Requests, c.DefaultResources.Limits
	}
	out := corev1.ResourceRequirements{
		Requests: mergedResources(defaultRequests, reqs),
		Limits:   mergedResources(defaultLimits, lims),
	}
	out.Requests[corev1.ResourceEphemeralStorage] = resource.MustParse(AgentEphemeralStorageRequest)
	out.Limits[corev1.ResourceEphemeralStorage] = resource.MustParse(AgentEphemeralStorageLimit)
	return out
}

// Local storage of a tenant pod (issue 15 item 10). The limit is the sum of the agent pod's
// emptyDir sizes (workspace 8Gi, home 1Gi, cache 1Gi, tmp 2Gi): a pod may fill each of them, not
// more than all of them together (an exec pod's sandboxd directory shares the same bound). The
// request is what the scheduler reserves on the node; a pod using more than it is the first a
// node short of disk evicts.
const (
	AgentEphemeralStorageRequest = "1Gi"
	AgentEphemeralStorageLimit   = "12Gi"
)

func mergedResources(def ResourceList, over *ResourceList) corev1.ResourceList {
	out := cpuMem(def)
	for name, key := range map[string]corev1.ResourceName{"cpu": corev1.ResourceCPU, "memory": corev1.ResourceMemory} {
		if v := over.get(name); v != "" {
			// Validate guarantees it parses; an unvalidated bad value keeps the default.
			if q, err := resource.ParseQuantity(v); err == nil {
				out[key] = q
			}
		}
	}
	return out
}

func (s RunSpec) labels() map[string]string {
	return RunLabels(s.RunID, s.AgentID, s.CompanyID, s.AdapterType)
}

func (s RunSpec) annotations() map[string]string {
	if s.IssueID == "" {
		return nil
	}
	return map[string]string{AnnotationIssueID: s.IssueID}
}

// podTemplate is the Job's pod template; RenderSandbox adjusts restartPolicy and command.
func (s RunSpec) podTemplate() corev1.PodTemplateSpec {
	cfg := s.Config
	podLabels := s.labels()
	podLabels[LabelRole] = RoleAgent
	pull := s.ImagePullPolicy
	if pull == "" {
		// A tenant's image is pulled every time, so the registry checks this pod's
		// credentials: IfNotPresent would run another company's private image cached on the
		// node without them.
		pull = corev1.PullAlways
	}
	spec := corev1.PodSpec{
		ServiceAccountName:           TenantServiceAccount,
		AutomountServiceAccountToken: ptrTo(false),
		RestartPolicy:                corev1.RestartPolicyNever,
		SecurityContext: &corev1.PodSecurityContext{
			RunAsNonRoot:        ptrTo(true),
			RunAsUser:           ptrTo[int64](agentUID),
			RunAsGroup:          ptrTo[int64](agentUID),
			FSGroup:             ptrTo[int64](agentUID),
			FSGroupChangePolicy: ptrTo(corev1.FSGroupChangeOnRootMismatch),
			SeccompProfile:      &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		Containers: []corev1.Container{{
			Name:            AgentContainerName,
			Image:           s.Image,
			ImagePullPolicy: pull,
			Command:         append([]string(nil), jobCommand...),
			Env:             s.baseEnv(),
			EnvFrom:         []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: SecretName(s.WorkloadName)}}}},
			SecurityContext: &corev1.SecurityContext{
				RunAsNonRoot:             ptrTo(true),
				RunAsUser:                ptrTo[int64](agentUID),
				RunAsGroup:               ptrTo[int64](agentUID),
				ReadOnlyRootFilesystem:   ptrTo(true),
				AllowPrivilegeEscalation: ptrTo(false),
				Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			},
			Resources: cfg.ContainerResources(),
			VolumeMounts: []corev1.VolumeMount{
				{Name: "workspace", MountPath: "/workspace"},
				{Name: "home", MountPath: agentHome},
				{Name: "cache", MountPath: agentHome + "/.cache"},
				{Name: "tmp", MountPath: "/tmp"},
			},
		}},
		Volumes: []corev1.Volume{
			emptyDir("workspace", "8Gi"),
			emptyDir("home", "1Gi"),
			emptyDir("cache", "1Gi"),
			emptyDir("tmp", "2Gi"),
		},
	}
	s.Broker.wirePod(&spec)
	if cfg.RuntimeClassName != "" {
		spec.RuntimeClassName = ptrTo(cfg.RuntimeClassName)
	}
	for _, name := range cfg.ImagePullSecrets {
		spec.ImagePullSecrets = append(spec.ImagePullSecrets, corev1.LocalObjectReference{Name: name})
	}
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: s.annotations()},
		Spec:       spec,
	}
}

// baseEnv is the agent container's environment before the run's: HOME, and the broker's
// (Broker.env). Agent runtimes exit 0 without output when HOME is unwritable; the root
// filesystem is read-only, so HOME is an emptyDir.
func (s RunSpec) baseEnv() []corev1.EnvVar {
	return append([]corev1.EnvVar{{Name: "HOME", Value: agentHome}}, s.Broker.env()...)
}

func emptyDir(name, size string) corev1.Volume {
	q := resource.MustParse(size)
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &q}}}
}

// RenderJob renders a run's Job (backend "job"; pod-spec-builder.ts): no retries, deleted
// ttlSecondsAfterFinished after it ends, killed after activeDeadlineSeconds. Its pod passes
// Pod Security "restricted".
func RenderJob(spec RunSpec) *batchv1.Job {
	deadline := spec.Config.PodActivityDeadlineSec
	if spec.ActiveDeadlineSeconds != nil {
		deadline = *spec.ActiveDeadlineSeconds
	}
	return &batchv1.Job{
		TypeMeta: metav1.TypeMeta{APIVersion: "batch/v1", Kind: "Job"},
		ObjectMeta: metav1.ObjectMeta{
			Name: spec.WorkloadName, Namespace: spec.Namespace,
			Labels: spec.labels(), Annotations: spec.annotations(),
		},
		Spec: batchv1.JobSpec{
			BackoffLimit:            ptrTo[int32](0),
			TTLSecondsAfterFinished: ptrTo(spec.Config.JobTTLSecondsAfterFinished),
			ActiveDeadlineSeconds:   ptrTo(deadline),
			Template:                spec.podTemplate(),
		},
	}
}

// RenderSandbox renders a run's agent-sandbox Sandbox (backend "sandbox-cr";
// sandbox-cr-builder.ts) for apiVersion SandboxAPIVersionV1beta1 (the default, also for "")
// or SandboxAPIVersionV1alpha1; a bare "v1beta1"/"v1alpha1" is accepted too. The pod template
// is the exec pod's (sandboxd as the main process: commands arrive by exec). The lease's expiry
// becomes spec.shutdownTime with shutdownPolicy Delete, so the controller ends the sandbox at
// the deadline even if kubeclip is gone. Neither version gets spec.replicas (v1alpha1 defaults
// it to 1; v1beta1 has operatingMode, defaulting to Running). No ownerReferences: nothing owns
// a Sandbox.
//
// A reusable lease's Sandbox (spec.VolumeClaim, v1beta1 only: the workload refuses it on
// v1alpha1) keeps its volume through agent-sandbox's own suspend. Its claim is a
// volumeClaimTemplate named LeaseVolumeName, of the claim's labels and spec (the operator's
// class and size, RenderLeaseClaim's decisions), which the controller makes as
// SandboxClaimName(sandbox), owned by the Sandbox; the pod template mounts it where the pod
// backend mounts its claim (the controller puts the same volume in the pod: a template's
// volume replaces the pod template's of that name). It has no shutdownTime: with
// shutdownPolicy Delete the controller would delete the Sandbox, and with it the claim, at the
// first run's expiry; with Retain it would never make a pod again. A reusable lease's life is
// kubeclip's (its idle window and maximum age), as the pod backend's claim is; each pod still
// ends at its activeDeadlineSeconds.
//
// Deviation: upstream's sandbox slept (sleep infinity) and was exec'd through the API server.
func RenderSandbox(spec RunSpec, apiVersion string) *unstructured.Unstructured {
	tmpl := spec.execPodTemplate()
	// PodTemplate carries a PodTemplateSpec in "template"; converting it yields the
	// unstructured form of the template with int64 numbers.
	holder, err := toUnstructured(&corev1.PodTemplate{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodTemplate"}, Template: tmpl})
	podTemplate := map[string]any{}
	if err == nil {
		podTemplate, _ = holder.Object["template"].(map[string]any)
	}
	sbSpec := map[string]any{"podTemplate": podTemplate}
	switch {
	case spec.VolumeClaim != nil:
		sbSpec["volumeClaimTemplates"] = []any{claimTemplate(spec.VolumeClaim)}
	case spec.ExpiresAt != nil:
		sbSpec["shutdownTime"] = spec.ExpiresAt.UTC().Format(time.RFC3339)
		sbSpec["shutdownPolicy"] = "Delete"
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": normalizeSandboxAPIVersion(apiVersion),
		"kind":       SandboxKind,
		"metadata": map[string]any{
			"name":      spec.WorkloadName,
			"namespace": spec.Namespace,
			"labels":    stringMapToAny(spec.labels()),
		},
		"spec": sbSpec,
	}}
	if a := spec.annotations(); a != nil {
		u.SetAnnotations(a)
	}
	return u
}

// claimTemplate is the Sandbox's volumeClaimTemplate of a reusable lease's claim: its labels
// and spec under the name LeaseVolumeName (the controller names the claim, SandboxClaimName).
func claimTemplate(pvc *corev1.PersistentVolumeClaim) map[string]any {
	claimSpec := map[string]any{}
	if holder, err := toUnstructured(&corev1.PersistentVolumeClaim{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PersistentVolumeClaim"}, Spec: pvc.Spec,
	}); err == nil {
		claimSpec, _ = holder.Object["spec"].(map[string]any)
	}
	return map[string]any{
		"metadata": map[string]any{"name": LeaseVolumeName, "labels": stringMapToAny(pvc.Labels)},
		"spec":     claimSpec,
	}
}

func normalizeSandboxAPIVersion(v string) string {
	switch v {
	case "", "v1beta1":
		return SandboxAPIVersionV1beta1
	case "v1alpha1":
		return SandboxAPIVersionV1alpha1
	}
	return v
}

func ptrTo[T any](v T) *T { return &v }
