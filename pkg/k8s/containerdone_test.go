package k8s

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const agent = "agent"

var now = time.Date(2026, 8, 1, 12, 0, 0, 0, time.UTC)

// podWith builds a Job-style pod (restartPolicy Never) in phase, with the agent container in
// state, then applies mods.
func podWith(phase corev1.PodPhase, state corev1.ContainerState, mods ...func(*corev1.Pod)) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "pc-x", Namespace: "t-x"},
		Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: agent}}},
		Status: corev1.PodStatus{
			Phase:             phase,
			ContainerStatuses: []corev1.ContainerStatus{{Name: agent, State: state}},
		},
	}
	for _, m := range mods {
		m(p)
	}
	return p
}

func running() corev1.ContainerState {
	return corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.NewTime(now.Add(-time.Minute))}}
}

func waiting(reason, msg string) corev1.ContainerState {
	return corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: msg}}
}

func exited(code int32, reason string, finished time.Time) corev1.ContainerState {
	return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: reason, FinishedAt: metav1.NewTime(finished)}}
}

func withRestartPolicy(rp corev1.RestartPolicy) func(*corev1.Pod) {
	return func(p *corev1.Pod) { p.Spec.RestartPolicy = rp }
}

func TestContainerDone(t *testing.T) {
	tests := []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"running", podWith(corev1.PodRunning, running()), false},
		{"waiting", podWith(corev1.PodPending, waiting("ContainerCreating", "")), false},
		{"terminated, never restarted", podWith(corev1.PodRunning, exited(0, "Completed", now)), true},
		{"terminated, will restart", podWith(corev1.PodRunning, exited(1, "Error", now), withRestartPolicy(corev1.RestartPolicyOnFailure)), false},
		{"pod succeeded", podWith(corev1.PodSucceeded, exited(0, "Completed", now)), true},
		{"pod failed before the container started", podWith(corev1.PodFailed, waiting("ErrImageNeverPull", "")), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := containerDone(tc.pod, agent); got != tc.want {
				t.Errorf("containerDone = %v, want %v", got, tc.want)
			}
		})
	}
}
func ptr[T any](v T) *T { return &v }
