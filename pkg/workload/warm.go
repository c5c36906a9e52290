package workload

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// Warm pods of backend pod (policy.RenderWarmPod): made ahead of demand, claimed by an acquire
// with one update at the pod's resourceVersion, then the run's workload like any pod lease.

// Warmable: a warm pod is a bare pod of this backend, bound instead of created (StartBound).
func (podWorkload) Warmable() bool { return true }

// ErrWarmTaken is a claim that lost: another acquire bound the pod first, or it is gone.
var ErrWarmTaken = errors.New("warm pod taken or gone")

// CreateWarmPod creates a warm pod and then its bind Secret, owned by the pod so it goes with
// it. A Secret that cannot be made takes the pod with it: nothing is left half-created.
func CreateWarmPod(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod, secret *corev1.Secret) error {
	got, err := cs.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{FieldManager: k8s.DefaultFieldManager})
	if err != nil {
		return fmt.Errorf("creating warm pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	sec := secret.DeepCopy()
	yes := true
	sec.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: got.Name, UID: got.UID, Controller: &yes, BlockOwnerDeletion: &yes}}
	if _, err := cs.CoreV1().Secrets(sec.Namespace).Create(ctx, sec, metav1.CreateOptions{FieldManager: k8s.DefaultFieldManager}); err != nil && !apierrors.IsAlreadyExists(err) {
		return errors.Join(fmt.Errorf("creating the bind Secret of warm pod %s/%s: %w", pod.Namespace, pod.Name, err),
			EvictWarmPod(ctx, cs, got))
	}
	return nil
}

// ClaimWarmPod writes bound (a warm pod policy.BindWarmPod turned into a run's workload) at the
// resourceVersion it was read at, and returns the pod as stored. A pod changed meanwhile
// (another acquire bound it) or gone is ErrWarmTaken.
func ClaimWarmPod(ctx context.Context, cs kubernetes.Interface, bound *corev1.Pod) (*corev1.Pod, error) {
	if bound.ResourceVersion == "" {
		return nil, fmt.Errorf("claiming warm pod %s/%s: no resourceVersion to claim it at", bound.Namespace, bound.Name)
	}
	got, err := cs.CoreV1().Pods(bound.Namespace).Update(ctx, bound, metav1.UpdateOptions{FieldManager: k8s.DefaultFieldManager})
	switch {
	case err == nil:
		return got, nil
	case apierrors.IsConflict(err), apierrors.IsNotFound(err):
		return nil, ErrWarmTaken
	}
	return nil, fmt.Errorf("claiming warm pod %s/%s: %w", bound.Namespace, bound.Name, err)
}

// EvictWarmPod deletes a warm pod at once (grace 0: nothing runs in it), only the incarnation
// given; gone already is success.
func EvictWarmPod(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod) error {
	grace := int64(0)
	opts := metav1.DeleteOptions{GracePeriodSeconds: &grace, Preconditions: &metav1.Preconditions{UID: &pod.UID}}
	err := cs.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, opts)
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return fmt.Errorf("deleting warm pod %s/%s: %w", pod.Namespace, pod.Name, err)
}

// DeleteWarmSecret deletes a bound pod's bind Secret, which nothing reads once the pod's
// sandboxd is bound (the pod's deletion would take it anyway); gone already is success.
func DeleteWarmSecret(ctx context.Context, cs kubernetes.Interface, namespace, pod string) error {
	err := cs.CoreV1().Secrets(namespace).Delete(ctx, policy.WarmSecretName(pod), metav1.DeleteOptions{})
	if err == nil || apierrors.IsNotFound(err) {
		return nil
	}
	return fmt.Errorf("deleting the bind Secret of pod %s/%s: %w", namespace, pod, err)
}

// StartBound makes pod, a warm pod bound to the run of secret, the run's workload. Nothing
// reads the run's Secret in it (the bind hands its keys to sandboxd), so the Secret is created,
// owned by the pod, only by Created.AdoptSecret, after `created` went out
// (k8s.StartBoundPodRun: or found made for the run, on a redelivery). The Created is never
// Existed: the run's workload is this pod whatever an earlier attempt did.
func StartBound(cs kubernetes.Interface, secret *corev1.Secret, pod *corev1.Pod) Created {
	return Created{
		Owner: policy.OwnerReference("v1", "Pod", pod.Name, pod.UID),
		adopt: func(ctx context.Context) error {
			_, err := k8s.StartBoundPodRun(ctx, cs, secret, pod)
			return err
		},
	}
}
