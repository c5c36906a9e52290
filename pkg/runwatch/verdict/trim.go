package verdict

import (
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TrimPod is pod with only what a verdict on it reads (its restart policy and status, the
// containers' states, its deletion and owner) and the identity the run-watcher keeps it by
// (name, namespace, UID, resource version, labels, creation time). The run-watcher's informer
// stores pods so trimmed: a pod's spec, its containers' images, resources and mounts are most
// of its size, and an idle run-watcher holds one pod per live run. Decide gives the same
// decision on a trimmed pod as on the whole one (TestDecide and the others run on both).
func TrimPod(pod *corev1.Pod) *corev1.Pod {
	if pod == nil {
		return nil
	}
	s := pod.Status
	return &corev1.Pod{
		ObjectMeta: trimMeta(pod.ObjectMeta),
		Spec:       corev1.PodSpec{RestartPolicy: pod.Spec.RestartPolicy},
		Status: corev1.PodStatus{
			Phase: s.Phase, Reason: s.Reason, Message: s.Message, Conditions: s.Conditions,
			StartTime: s.StartTime, PodIP: s.PodIP,
			InitContainerStatuses: trimContainerStatuses(s.InitContainerStatuses),
			ContainerStatuses:     trimContainerStatuses(s.ContainerStatuses),
		},
	}
}

// TrimJob is job without its spec (its pod template is most of its size; a verdict reads
// the Job's status and deletion only) and its metadata trimmed as TrimPod's.
func TrimJob(job *batchv1.Job) *batchv1.Job {
	if job == nil {
		return nil
	}
	return &batchv1.Job{ObjectMeta: trimMeta(job.ObjectMeta), Status: job.Status}
}

func trimMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		Labels: m.Labels, OwnerReferences: m.OwnerReferences, CreationTimestamp: m.CreationTimestamp,
		DeletionTimestamp: m.DeletionTimestamp, DeletionGracePeriodSeconds: m.DeletionGracePeriodSeconds,
	}
}

// trimContainerStatuses keeps each container's name, state and readiness.
func trimContainerStatuses(in []corev1.ContainerStatus) []corev1.ContainerStatus {
	if in == nil {
		return nil
	}
	out := make([]corev1.ContainerStatus, len(in))
	for i, c := range in {
		out[i] = corev1.ContainerStatus{
			Name: c.Name, State: c.State, LastTerminationState: c.LastTerminationState,
			Ready: c.Ready, RestartCount: c.RestartCount, Started: c.Started,
		}
	}
	return out
}
