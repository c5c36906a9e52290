package policy

import (
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Exec-capable pods (backends pod and sandbox-cr): the agent container's main process is
// kubeclip's sandboxd, copied into a shared emptyDir by an init container from kubeclip's own
// image, so any runtime image can serve exec, under Pod Security restricted (docs/exec.md).
const (
	// SandboxdPort is where sandboxd serves TLS to the exec-worker.
	SandboxdPort = 7070
	// SandboxdDir is the emptyDir holding sandboxd's binary, socket and journals.
	SandboxdDir = "/kubeclip"
	// SandboxdBinary is where the init container puts sandboxd.
	SandboxdBinary = SandboxdDir + "/bin/sandboxd"
	// SandboxdInitContainerName copies sandboxd into SandboxdDir.
	SandboxdInitContainerName = "sandboxd-install"
	// sandboxdVolume names the emptyDir.
	sandboxdVolume = "kubeclip"
	// DefaultExecGracePeriod is an exec-capable pod's termination grace period: on SIGTERM
	// sandboxd refuses new commands and waits for the running ones, so a release that does not
	// cancel active work lets them finish this long (the dispatcher's release deletes with its
	// own, shorter grace to cancel them). It is the dispatcher's default release timeout.
	DefaultExecGracePeriod = 2 * time.Minute
)

// sandboxdResources keep the init container within the tenant LimitRange's minimum and far
// below the agent container; an init container's resources count only while it runs.
var sandboxdResources = corev1.ResourceRequirements{
	Requests: cpuMem(limitRangeMin),
	Limits:   cpuMem(limitRangeMin),
}

// execPodTemplate is the run's pod template for an exec-capable backend: the Job's, with
// sandboxd as the agent container's main process, its init container and volume, its port, and
// no restarts (a restarted sandboxd would have lost its commands' journals).
func (s RunSpec) execPodTemplate() corev1.PodTemplateSpec {
	tmpl := s.podTemplate()
	spec := &tmpl.Spec
	spec.RestartPolicy = corev1.RestartPolicyNever
	spec.TerminationGracePeriodSeconds = ptrTo(int64(DefaultExecGracePeriod / time.Second))
	if s.ActiveDeadlineSeconds != nil {
		spec.ActiveDeadlineSeconds = ptrTo(*s.ActiveDeadlineSeconds)
	} else {
		spec.ActiveDeadlineSeconds = ptrTo(s.Config.PodActivityDeadlineSec)
	}
	mount := corev1.VolumeMount{Name: sandboxdVolume, MountPath: SandboxdDir}
	agent := &spec.Containers[0]
	agent.Command = []string{SandboxdBinary, "serve"}
	agent.WorkingDir = "/workspace"
	agent.Ports = []corev1.ContainerPort{{Name: "sandboxd", ContainerPort: SandboxdPort, Protocol: corev1.ProtocolTCP}}
	agent.VolumeMounts = append(agent.VolumeMounts, mount)
	spec.InitContainers = []corev1.Container{{
		Name:            SandboxdInitContainerName,
		Image:           s.SandboxdImage,
		ImagePullPolicy: corev1.PullIfNotPresent,
		// The image's entrypoint is its sandboxd, wherever the image keeps it: the local
		// cluster's image at /sandboxd, the production image at /usr/local/bin/sandboxd.
		Args:            []string{"install", SandboxdBinary},
		SecurityContext: agent.SecurityContext.DeepCopy(),
		Resources:       *sandboxdResources.DeepCopy(),
		VolumeMounts:    []corev1.VolumeMount{mount},
	}}
	q := resource.MustParse("2Gi") // the binary, the socket and the commands' output journals
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: sandboxdVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &q}}})
	return tmpl
}

// RenderPod renders a run's bare Pod (backend "pod", kubeclip's exec-capable lease for clusters
// without agent-sandbox): the exec pod template under the workload's name, bounded by the
// lease's deadline (activeDeadlineSeconds), owned by nothing (the lease record is its owner;
// release deletes it, reconciliation finds it by its labels).
func RenderPod(spec RunSpec) *corev1.Pod {
	tmpl := spec.execPodTemplate()
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name: spec.WorkloadName, Namespace: spec.Namespace,
			Labels: tmpl.Labels, Annotations: tmpl.Annotations,
		},
		Spec: tmpl.Spec,
	}
}
