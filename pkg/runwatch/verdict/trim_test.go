package verdict

import (
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
)

// forms runs a verdict test on the objects as given and as the run-watcher's informer stores
// them (TrimJob, TrimPod): every case must decide the same on both.
func forms(t *testing.T, name string, job *batchv1.Job, pod *corev1.Pod, test func(t *testing.T, job *batchv1.Job, pod *corev1.Pod)) {
	t.Helper()
	t.Run(name, func(t *testing.T) { test(t, job, pod) })
	t.Run(name+"/trimmed", func(t *testing.T) { test(t, TrimJob(job), TrimPod(pod)) })
}
