package workload

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// A reusable lease (docs/reuse.md, The host's rules) outlives its run: its workspace and the agent's
// home are on a volume claim of its own (policy.RenderLeaseClaim), its pod is deleted when it
// has been idle for the operator's window (suspend) and made again on the same claim when the
// host resumes it. This file is backend pod's way; sandbox-cr keeps one through agent-sandbox's
// own operatingMode and volumeClaimTemplates where v1beta1 is served (sandbox.go); job refuses a
// reusable lease at its acquire (Reuse), before anything is created.

// PodTemplateAnnotation is the claim annotation holding the pod a reusable lease's Create made
// (as JSON): a resume of a suspended lease makes exactly that pod again, whatever the company's
// config says by then (the host destroys a lease whose config changed), and with no need of
// the acquire, which is long gone from the work queue. The pod holds no secret: the agent
// takes the run Secret's keys by reference.
const PodTemplateAnnotation = "kubeclip.io/pod"

// notReusable is the refusal of a backend that keeps no reusable lease.
func notReusable(b policy.Backend) error {
	return events.Terminalf(events.CodeBackendUnavailable, "config.backend",
		"backend %q cannot keep a reusable lease (reuseLease); use backend %q", b, policy.BackendPod)
}

// CreateClaim creates a reusable lease's volume claim; one that exists for the same run (a
// redelivered dispatch) is fine, one of another run under the name is k8s.ErrRunConflict.
// What a refusal means (the tenant quota: quota_exceeded) is k8s.Meaning's. The claim is read
// before it is created: quota admission runs before the name check, so a redelivered dispatch's
// create of the lease's own claim would be refused quota_exceeded at the company's claim limit.
func CreateClaim(ctx context.Context, cs kubernetes.Interface, pvc *corev1.PersistentVolumeClaim) error {
	claims := cs.CoreV1().PersistentVolumeClaims(pvc.Namespace)
	got, err := claims.Get(ctx, pvc.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = claims.Create(ctx, pvc, metav1.CreateOptions{FieldManager: k8s.DefaultFieldManager})
		if !apierrors.IsAlreadyExists(err) {
			if err != nil {
				return fmt.Errorf("creating PersistentVolumeClaim %s/%s: %w", pvc.Namespace, pvc.Name, err)
			}
			return nil
		}
		got, err = claims.Get(ctx, pvc.Name, metav1.GetOptions{}) // made meanwhile
	}
	if err != nil {
		return fmt.Errorf("reading PersistentVolumeClaim %s/%s: %w", pvc.Namespace, pvc.Name, err)
	}
	if run := got.Labels[policy.LabelRunID]; run != pvc.Labels[policy.LabelRunID] {
		return fmt.Errorf("creating PersistentVolumeClaim %s/%s: exists with %s=%q: %w", pvc.Namespace, pvc.Name, policy.LabelRunID, run, k8s.ErrRunConflict)
	}
	return nil
}

// DeleteClaim deletes a reusable lease's volume claim (its volume goes with it, the storage
// class's reclaim policy permitting) and, as the claim owns it, its run Secret. Gone already is
// success.
func DeleteClaim(ctx context.Context, cs kubernetes.Interface, namespace, name string) error {
	err := cs.CoreV1().PersistentVolumeClaims(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting PersistentVolumeClaim %s/%s: %w", namespace, name, err)
	}
	return nil
}

// createOnClaim is the pod backend's Create of a reusable lease: the pod is recorded on the
// claim (PodTemplateAnnotation) before it is created, so a resume can always make it again, and
// the Secret and what belongs to the run (its scoped egress policy) are owned by the claim, not
// the pod: a suspend deletes the pod and keeps them.
func (w podWorkload) createOnClaim(ctx context.Context, spec policy.RunSpec, secret *corev1.Secret, pod *corev1.Pod) (Created, error) {
	cs := w.d.Clientset
	claims := cs.CoreV1().PersistentVolumeClaims(spec.Namespace)
	claim, err := claims.Get(ctx, spec.VolumeClaim.Name, metav1.GetOptions{})
	if err != nil {
		return Created{}, fmt.Errorf("reading PersistentVolumeClaim %s/%s: %w", spec.Namespace, spec.VolumeClaim.Name, err)
	}
	tmpl, err := json.Marshal(pod)
	if err != nil {
		return Created{}, fmt.Errorf("encoding pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	if claim.Annotations[PodTemplateAnnotation] != string(tmpl) {
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{PodTemplateAnnotation: string(tmpl)}}})
		if err != nil {
			return Created{}, fmt.Errorf("encoding claim patch: %w", err)
		}
		if _, err := claims.Patch(ctx, claim.Name, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: k8s.DefaultFieldManager}); err != nil {
			return Created{}, fmt.Errorf("recording the pod on PersistentVolumeClaim %s/%s: %w", claim.Namespace, claim.Name, err)
		}
	}
	run, err := k8s.StartPodRun(ctx, cs, secret, pod)
	if err != nil {
		return Created{}, err
	}
	owner := policy.OwnerReference("v1", "PersistentVolumeClaim", claim.Name, claim.UID)
	return Created{
		Owner: owner, Existed: run.Existed,
		adopt: func(ctx context.Context) error { return adoptBy(ctx, cs, secret.Namespace, secret.Name, owner) },
	}, nil
}

// adoptBy makes owner the controller of the Secret; the merge patch replaces the whole list, so
// it is idempotent.
func adoptBy(ctx context.Context, cs kubernetes.Interface, namespace, secret string, owner metav1.OwnerReference) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{owner}}})
	if err != nil {
		return fmt.Errorf("encoding owner patch: %w", err)
	}
	if _, err := cs.CoreV1().Secrets(namespace).Patch(ctx, secret, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: k8s.DefaultFieldManager}); err != nil {
		return fmt.Errorf("setting owner of Secret %s/%s to PersistentVolumeClaim %s: %w", namespace, secret, owner.Name, err)
	}
	return nil
}

// Reuse: the pod backend keeps reusable leases.
func (podWorkload) Reuse() error { return nil }

// Suspend deletes the lease's pod and waits until it is gone; its claim and Secret stay.
func (w podWorkload) Suspend(ctx context.Context, namespace, name string, opts k8s.RunDeleteOptions) error {
	return k8s.DeletePodRun(ctx, w.d.Clientset, namespace, name, opts)
}

// Resume makes sure the lease's pod runs and is ready: a running pod is waited for; one that
// is gone is made again from the pod recorded on the claim; one that ended (its deadline, a
// crash) or is being deleted is waited for until gone and then made again. It reports whether
// it made a pod. A redelivered resume finds the pod it made (AlreadyExists, same run): no
// second pod.
func (w podWorkload) Resume(ctx context.Context, namespace, name, claimName string) (Resumed, error) {
	cs := w.d.Clientset
	pods := cs.CoreV1().Pods(namespace)
	pod, err := pods.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return Resumed{}, fmt.Errorf("reading pod %s/%s: %w", namespace, name, err)
	case pod.DeletionTimestamp == nil && !podEnded(pod):
		ip, err := waitReady(ctx, cs, namespace, name)
		return Resumed{PodIP: ip}, err
	default:
		if err := k8s.DeletePodRun(ctx, cs, namespace, name, k8s.RunDeleteOptions{PodGracePeriod: 1}); err != nil {
			return Resumed{}, err
		}
	}
	claim, err := cs.CoreV1().PersistentVolumeClaims(namespace).Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		return Resumed{}, fmt.Errorf("reading PersistentVolumeClaim %s/%s: %w", namespace, claimName, err)
	}
	tmpl, ok := claim.Annotations[PodTemplateAnnotation]
	if !ok {
		return Resumed{}, events.Terminalf(events.CodeInternal, "", "PersistentVolumeClaim %s/%s records no pod (%s)", namespace, claimName, PodTemplateAnnotation)
	}
	var next corev1.Pod
	if err := json.Unmarshal([]byte(tmpl), &next); err != nil || next.Name != name || next.Namespace != namespace {
		return Resumed{}, events.Terminalf(events.CodeInternal, "", "PersistentVolumeClaim %s/%s records no pod %s it can make (%s)", namespace, claimName, name, PodTemplateAnnotation)
	}
	next.ResourceVersion, next.UID = "", ""
	_, err = pods.Create(ctx, &next, metav1.CreateOptions{FieldManager: k8s.DefaultFieldManager})
	if apierrors.IsAlreadyExists(err) {
		err = nil // a redelivered resume made it
	}
	if err != nil {
		return Resumed{}, fmt.Errorf("creating pod %s/%s: %w", namespace, name, err)
	}
	ip, err := waitReady(ctx, cs, namespace, name)
	return Resumed{Made: true, PodIP: ip}, err
}

// podEnded reports a pod that will run no more commands.
func podEnded(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// ErrPodEnded is returned by a resume whose pod ended, or was deleted, before it was ready.
var ErrPodEnded = errors.New("pod ended before it was ready")

// waitReady watches the pod until its Ready condition holds (sandboxd serves), it ends or is
// deleted (ErrPodEnded), or ctx is done. It returns the ready pod's IP.
func waitReady(ctx context.Context, cs kubernetes.Interface, namespace, name string) (string, error) {
	pods := cs.CoreV1().Pods(namespace)
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	for {
		list, err := pods.List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return "", fmt.Errorf("reading pod %s/%s: %w", namespace, name, err)
		}
		if len(list.Items) == 0 {
			return "", fmt.Errorf("pod %s/%s: %w (deleted)", namespace, name, ErrPodEnded)
		}
		if done, err := readiness(&list.Items[0]); done {
			return list.Items[0].Status.PodIP, err
		}
		wch, err := pods.Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
		if err != nil {
			return "", fmt.Errorf("watching pod %s/%s: %w", namespace, name, err)
		}
		done, ip, err := watchReady(ctx, wch)
		wch.Stop()
		if done {
			return ip, err
		}
	}
}

// watchReady reads wch until the pod is ready (its IP) or ended; done false: the watch closed,
// list again.
func watchReady(ctx context.Context, wch watch.Interface) (done bool, podIP string, err error) {
	for {
		select {
		case <-ctx.Done():
			return true, "", fmt.Errorf("waiting for the pod to be ready: %w", context.Cause(ctx))
		case ev, ok := <-wch.ResultChan():
			if !ok {
				return false, "", nil
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod {
				continue
			}
			if ev.Type == watch.Deleted {
				return true, "", fmt.Errorf("pod %s/%s: %w (deleted)", p.Namespace, p.Name, ErrPodEnded)
			}
			if done, err := readiness(p); done {
				return true, p.Status.PodIP, err
			}
		}
	}
}

// readiness reports whether the wait for p is over: ready, or never going to be: ended, or
// being deleted (a destroy, or a suspend after a release, deleted the pod the resume waits for).
func readiness(p *corev1.Pod) (bool, error) {
	if podEnded(p) {
		return true, fmt.Errorf("pod %s/%s: %w (%s)", p.Namespace, p.Name, ErrPodEnded, p.Status.Phase)
	}
	if p.DeletionTimestamp != nil {
		return true, fmt.Errorf("pod %s/%s: %w (being deleted)", p.Namespace, p.Name, ErrPodEnded)
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true, nil
		}
	}
	return false, nil
}
