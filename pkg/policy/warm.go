package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// Warm pods (issue 17): pods of backend pod started ahead of demand in a company's namespace,
// with sandboxd unbound (`sandboxd serve --unbound`: it answers only the bind call, made with a
// key derived from the installation's master key, execspec.DeriveBindSeed). An acquire binds one:
// the pod gets the run's labels (one update at the pod's resourceVersion, so two acquires never
// get one pod) and the bind call installs the lease's sandboxd seed and its environment (the run
// Secret's keys, which a cold pod's agent container gets from the Secret). A bound pod is the
// lease's workload under its own name, deleted at release like any other; it never serves
// another lease.
//
// A warm pod carries neither the run labels nor managed-by, so nothing that follows runs (the
// run-watcher, the exec-worker, the reconcile pass) sees it before it is bound; it carries the
// company and the agent role, so the tenant's deny-all and egress policies hold it from its
// start. Its shape (WarmShape) is what it was rendered from minus the run's identity: an acquire
// binds only a pod of its own shape, so a warm pod runs exactly what a cold one would.
const (
	// LabelWarmPool marks an unbound warm pod; the value is its shape (WarmShape). Binding
	// removes it.
	LabelWarmPool = "paperclip.io/warm-pool"
	// AnnotationWarmShape records, on a bound pod, the shape it was warmed for.
	AnnotationWarmShape = "paperclip.io/warm-shape"
	// warmSecretSuffix names a warm pod's bind Secret: the bind seed, for its init container.
	warmSecretSuffix = "-bind"
	// warmShapeName stands for the pod's name while its shape is hashed.
	warmShapeName = "pc-warm-shape"
)

// WarmSecretName is the Secret holding a warm pod's bind seed (execspec.SeedEnv), owned by
// the pod. It is not the run Secret (SecretName), which a bind creates.
func WarmSecretName(pod string) string { return pod + warmSecretSuffix }

// WarmSpec is spec without the run's identity: what every warm pod of a pool is rendered from.
func WarmSpec(spec RunSpec) RunSpec {
	return RunSpec{
		CompanyID: spec.CompanyID, Namespace: spec.Namespace,
		// adapterType is a label of the run, set at bind; the rendered pod does not depend on it.
		Image: spec.Image, ImagePullPolicy: spec.ImagePullPolicy,
		Config: spec.Config, SandboxdImage: spec.SandboxdImage,
		// The broker wiring is the installation's, present from the pod's creation: a pod's
		// hostAliases and volumes cannot change at bind.
		Broker: spec.Broker,
	}
}

// RenderWarmPod renders warm pod name of spec (WarmSpec of an acquire) and its bind Secret,
// holding seed (execspec.DeriveBindSeed of the pod), to be owned by the pod once it exists. The
// pod is the exec pod a cold acquire would make (RenderPod) but: sandboxd starts unbound; the
// agent container takes nothing from a Secret (the run's environment comes with the bind);
// there is no deadline yet (BindWarmPod sets the lease's); and it is labelled as warm.
func RenderWarmPod(spec RunSpec, name string, seed []byte) (*corev1.Pod, *corev1.Secret) {
	spec.WorkloadName = name
	shape := WarmShape(spec)
	tmpl := spec.execPodTemplate()
	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: spec.Namespace,
			Labels: map[string]string{LabelCompanyID: spec.CompanyID, LabelRole: RoleAgent, LabelWarmPool: shape},
		},
		Spec: tmpl.Spec,
	}
	pod.Spec.ActiveDeadlineSeconds = nil
	agent := &pod.Spec.Containers[0]
	agent.Env = spec.baseEnv()
	agent.Command = append(agent.Command, "--unbound")
	init := &pod.Spec.InitContainers[0]
	init.Env = []corev1.EnvVar{{Name: execspec.SeedEnv, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: WarmSecretName(name)}, Key: execspec.SeedEnv,
	}}}}
	secret := &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{
			Name: WarmSecretName(name), Namespace: spec.Namespace,
			Labels: map[string]string{LabelCompanyID: spec.CompanyID, LabelWarmPool: shape},
		},
		Type:       corev1.SecretTypeOpaque,
		StringData: map[string]string{execspec.SeedEnv: hex.EncodeToString(seed)},
	}
	return pod, secret
}

// WarmShape is the shape of the pods spec renders: a hash of the warm pod rendered under a
// placeholder name, so two acquires whose pods would differ in anything but the run's identity
// (image, pull policy, resources, runtime class, pull secrets, sandboxd's image, the broker
// wiring) never share a
// pool. Only the namespace is left out of the hash (a pool is a namespace's).
func WarmShape(spec RunSpec) string {
	spec = WarmSpec(spec)
	spec.WorkloadName = warmShapeName
	spec.Namespace = ""
	tmpl := spec.execPodTemplate()
	tmpl.Spec.ActiveDeadlineSeconds = nil
	b, err := json.Marshal(tmpl.Spec)
	if err != nil {
		panic("policy: a pod spec that does not marshal: " + err.Error()) // a PodSpec always does
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// BindWarmPod turns warm pod into the workload of the run of spec (whose WorkloadName must be
// the pod's name): the run's labels and annotations in place of the warm label, and the run's
// deadline counted from now (a pod's activeDeadlineSeconds counts from its start, which was
// earlier). It changes only what a pod update may change; the caller updates it at the pod's
// resourceVersion.
func BindWarmPod(pod *corev1.Pod, spec RunSpec, now time.Time) {
	shape := pod.Labels[LabelWarmPool]
	pod.Labels = spec.labels()
	pod.Labels[LabelRole] = RoleAgent
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	for k, v := range spec.annotations() {
		pod.Annotations[k] = v
	}
	pod.Annotations[AnnotationWarmShape] = shape
	deadline := spec.Config.PodActivityDeadlineSec
	if spec.ActiveDeadlineSeconds != nil {
		deadline = *spec.ActiveDeadlineSeconds
	}
	if pod.Status.StartTime != nil {
		deadline += int64(now.Sub(pod.Status.StartTime.Time) / time.Second)
	}
	pod.Spec.ActiveDeadlineSeconds = ptrTo(deadline)
}
