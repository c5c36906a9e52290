package policy

import (
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// Exec-capable pods (backends pod and sandbox-cr): the agent container's main process is
// kubeclip's sandboxd, copied into an emptyDir by an init container from kubeclip's own image, so
// any runtime image can serve exec, under Pod Security restricted (docs/exec.md). The agent's
// commands run as sandboxd's user, so what they must not change is on a read-only mount: the
// binary's emptyDir is mounted read-only in the agent container (only the init container writes
// it), and sandboxd's socket and journals are in their own emptyDir. The lease seed never enters
// the agent container's environment, which every Kubernetes exec into it starts with: the init
// container alone gets it from the run Secret and writes it to a memory emptyDir, whence sandboxd
// reads and removes it before it serves.
const (
	// SandboxdPort is where sandboxd serves TLS to the exec-worker.
	SandboxdPort = 7070
	// SandboxdBinDir holds sandboxd's binary: read-only to the agent.
	SandboxdBinDir = "/kubeclip/bin"
	// SandboxdRunDir holds sandboxd's socket (sandboxd.DefaultSocket) and journals.
	SandboxdRunDir = "/kubeclip/run"
	// SandboxdJournalDir holds the commands' output journals.
	SandboxdJournalDir = SandboxdRunDir + "/journal"
	// SandboxdBinary is where the init container puts sandboxd.
	SandboxdBinary = SandboxdBinDir + "/sandboxd"
	// SandboxdSeedDir is a memory-backed emptyDir: the init container writes the lease seed
	// there (SandboxdSeedFile, from the run Secret), sandboxd reads it at start and removes it.
	SandboxdSeedDir = "/kubeclip/seed"
	// SandboxdSeedFile is the seed's file while sandboxd starts.
	SandboxdSeedFile = SandboxdSeedDir + "/seed"
	// SandboxdInitContainerName copies sandboxd into SandboxdBinDir.
	SandboxdInitContainerName = "sandboxd-install"
	// sandboxdBinVolume and sandboxdRunVolume name the emptyDirs.
	sandboxdBinVolume = "kubeclip-bin"
	sandboxdRunVolume = "kubeclip"
	// sandboxdSeedVolume is SandboxdSeedDir's.
	sandboxdSeedVolume = "kubeclip-seed"
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
	switch {
	case s.VolumeClaim != nil:
		// A reusable lease's pod serves its agent's runs one after another, and each resume
		// renews the lease's expiry; a pod's activeDeadlineSeconds counts from its start and can
		// only be shortened, so it would kill a run resumed near it although the host was told a
		// later expiry. The lease's expiry (lease.Record.ExpiresAt) is enforced by the
		// dispatcher's sweep instead, which suspends a lease still in use past it.
		spec.ActiveDeadlineSeconds = nil
	case s.ActiveDeadlineSeconds != nil:
		spec.ActiveDeadlineSeconds = ptrTo(*s.ActiveDeadlineSeconds)
	default:
		spec.ActiveDeadlineSeconds = ptrTo(s.Config.PodActivityDeadlineSec)
	}
	bin := corev1.VolumeMount{Name: sandboxdBinVolume, MountPath: SandboxdBinDir}
	seed := corev1.VolumeMount{Name: sandboxdSeedVolume, MountPath: SandboxdSeedDir}
	agent := &spec.Containers[0]
	// The lease seed is not in the agent container's environment, which every Kubernetes exec
	// into it starts with: the container takes the run Secret's other keys by name, and only
	// the init container has the seed's.
	agent.EnvFrom = nil
	agent.Env = append(agent.Env, s.secretEnv()...)
	// The journal directory is named, not left to the binary's default: the init container's
	// image may hold a sandboxd of another version.
	agent.Command = []string{SandboxdBinary, "serve", "--journal-dir", SandboxdJournalDir, "--seed-file", SandboxdSeedFile}
	agent.WorkingDir = "/workspace"
	agent.Ports = []corev1.ContainerPort{{Name: "sandboxd", ContainerPort: SandboxdPort, Protocol: corev1.ProtocolTCP}}
	agent.VolumeMounts = append(agent.VolumeMounts,
		corev1.VolumeMount{Name: sandboxdBinVolume, MountPath: SandboxdBinDir, ReadOnly: true},
		corev1.VolumeMount{Name: sandboxdRunVolume, MountPath: SandboxdRunDir},
		seed)
	spec.InitContainers = []corev1.Container{{
		Name:            SandboxdInitContainerName,
		Image:           s.SandboxdImage,
		ImagePullPolicy: corev1.PullIfNotPresent,
		// The image's entrypoint is its sandboxd, wherever the image keeps it: the local
		// cluster's image at /sandboxd, the production image at /usr/local/bin/sandboxd.
		Args:            []string{"install", SandboxdBinary, SandboxdSeedFile},
		Env:             []corev1.EnvVar{secretKeyEnv(s.WorkloadName, execspec.SeedEnv)},
		SecurityContext: agent.SecurityContext.DeepCopy(),
		Resources:       *sandboxdResources.DeepCopy(),
		VolumeMounts:    []corev1.VolumeMount{bin, seed},
	}}
	binSize := resource.MustParse("64Mi") // one static binary
	runSize := resource.MustParse("2Gi")  // the socket and the commands' output journals
	seedSize := resource.MustParse("1Mi") // one 64-byte file, in memory
	spec.Volumes = append(spec.Volumes,
		corev1.Volume{Name: sandboxdBinVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &binSize}}},
		corev1.Volume{Name: sandboxdRunVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &runSize}}},
		corev1.Volume{Name: sandboxdSeedVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: &seedSize}}})
	if s.VolumeClaim != nil {
		onLeaseVolume(spec, s.VolumeClaim.Name)
	}
	return tmpl
}

// A reusable lease's pod keeps the workspace and the agent's home on the lease's volume claim,
// each in a directory of its own, so the agent's next run (the same pod, or a new one on the same
// claim) finds both: the files it left, its sessions under $HOME (Claude Code's ~/.claude). The
// cache under $HOME/.cache, /tmp and sandboxd's directories stay per pod.
const (
	// LeaseVolumeName is the pod volume of the lease's claim.
	LeaseVolumeName = "lease-data"
	// LeaseWorkspaceDir and LeaseHomeDir are the claim's directories mounted at /workspace and
	// at $HOME.
	LeaseWorkspaceDir = "workspace"
	LeaseHomeDir      = "home"
)

// onLeaseVolume mounts the claim's directories where the pod's workspace and home emptyDirs
// were, and drops those.
func onLeaseVolume(spec *corev1.PodSpec, claim string) {
	onClaim := map[string]string{"workspace": LeaseWorkspaceDir, "home": LeaseHomeDir}
	agent := &spec.Containers[0]
	for i, m := range agent.VolumeMounts {
		if dir, ok := onClaim[m.Name]; ok {
			agent.VolumeMounts[i].Name, agent.VolumeMounts[i].SubPath = LeaseVolumeName, dir
		}
	}
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v corev1.Volume) bool { _, ok := onClaim[v.Name]; return ok })
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: LeaseVolumeName, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim},
	}})
}

// secretEnv is the agent container's environment from the run Secret: BOOTSTRAP_TOKEN and
// SecretEnvKeys, sorted, without the seed.
func (s RunSpec) secretEnv() []corev1.EnvVar {
	keys := append([]string{BootstrapTokenKey}, s.SecretEnvKeys...)
	slices.Sort(keys)
	keys = slices.Compact(keys)
	env := make([]corev1.EnvVar, 0, len(keys))
	for _, k := range keys {
		if k != execspec.SeedEnv {
			env = append(env, secretKeyEnv(s.WorkloadName, k))
		}
	}
	return env
}

// secretKeyEnv is the environment variable key from the workload's run Secret.
func secretKeyEnv(workload, key string) corev1.EnvVar {
	return corev1.EnvVar{Name: key, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
		LocalObjectReference: corev1.LocalObjectReference{Name: SecretName(workload)}, Key: key,
	}}}
}

// SecretEnvKeys are the keys of a run Secret (RenderSecret's) that its exec-capable pod's agent
// container gets as environment variables: all but the sandboxd seed (RunSpec.SecretEnvKeys).
func SecretEnvKeys(secret *corev1.Secret) []string {
	keys := make([]string, 0, len(secret.StringData))
	for k := range secret.StringData {
		if k != execspec.SeedEnv {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// RenderPod renders a run's bare Pod (backend "pod", kubeclip's exec-capable lease for clusters
// without agent-sandbox): the exec pod template under the workload's name, bounded by the
// lease's deadline (activeDeadlineSeconds; a reusable lease's by the dispatcher's sweep), owned
// by nothing (the lease record is its owner;
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
