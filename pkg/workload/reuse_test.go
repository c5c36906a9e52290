package workload

import (
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestReadiness: a resume's wait for its pod ends when the pod is ready, and also when it never
// will be: ended, or being deleted (a destroy deleted the pod the resume waits for; before, the
// wait went on until the release timeout).
func TestReadiness(t *testing.T) {
	ready := []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	deleting := metav1.NewTime(time.Unix(1, 0))
	tests := []struct {
		name     string
		pod      corev1.Pod
		wantDone bool
		wantErr  error
	}{
		{"starting", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending}}, false, nil},
		{"ready", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: ready}}, true, nil},
		{"ended", corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodFailed}}, true, ErrPodEnded},
		{"being deleted while it starts", corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &deleting}, Status: corev1.PodStatus{Phase: corev1.PodPending}}, true, ErrPodEnded},
		{"being deleted once ready", corev1.Pod{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &deleting}, Status: corev1.PodStatus{Phase: corev1.PodRunning, Conditions: ready}}, true, ErrPodEnded},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			done, err := readiness(&tc.pod)
			if done != tc.wantDone || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Errorf("readiness() = %v, %v; want %v, %v", done, err, tc.wantDone, tc.wantErr)
			}
		})
	}
}
