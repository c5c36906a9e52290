// Package sandboxtest is a test-only stand-in for the agent-sandbox controller, which cannot be
// installed on the project's cluster (no registry to pull it from). It does for kubeclip's
// Sandboxes (v1beta1, label paperclip.io/managed-by=kubeclip) what the controller does and
// kubeclip relies on: it creates the pod named after the Sandbox from spec.podTemplate, owned by
// the Sandbox (so deleting the Sandbox deletes the pod), reports the Ready condition once the pod
// is Ready, and deletes a Sandbox whose spec.shutdownTime has passed when its shutdownPolicy is
// Delete. Nothing else: no Service, volume claims, warm pools or suspension.
package sandboxtest

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

// resync is how often every Sandbox is looked at again: the stand-in polls, being a test
// fixture, not the system under test.
const resync = 200 * time.Millisecond

// Run reconciles Sandboxes until ctx is done.
func Run(ctx context.Context, cs kubernetes.Interface, dyn dynamic.Interface) error {
	gvr := policy.SandboxGVR(policy.SandboxAPIVersionV1beta1)
	tick := time.NewTicker(resync)
	defer tick.Stop()
	for {
		list, err := dyn.Resource(gvr).Namespace(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: policy.ManagedBySelector})
		if err == nil {
			for i := range list.Items {
				// A failure is tried again on the next pass, as a controller's requeue would.
				_ = reconcile(ctx, cs, dyn, &list.Items[i])
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func reconcile(ctx context.Context, cs kubernetes.Interface, dyn dynamic.Interface, sb *unstructured.Unstructured) error {
	if sb.GetDeletionTimestamp() != nil {
		return nil
	}
	gvr := policy.SandboxGVR(sb.GetAPIVersion())
	if expired(sb) {
		return dyn.Resource(gvr).Namespace(sb.GetNamespace()).Delete(ctx, sb.GetName(), metav1.DeleteOptions{})
	}
	pods := cs.CoreV1().Pods(sb.GetNamespace())
	pod, err := pods.Get(ctx, sb.GetName(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		pod, err = podFor(sb)
		if err != nil {
			return err
		}
		_, err = pods.Create(ctx, pod, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	if !ready(pod) || readyCondition(sb) {
		return nil
	}
	status := map[string]any{"conditions": []any{map[string]any{
		"type": "Ready", "status": "True", "reason": "DependenciesReady", "message": "Pod is Ready",
		"lastTransitionTime": time.Now().UTC().Format(time.RFC3339), "observedGeneration": sb.GetGeneration(),
	}}}
	if err := unstructured.SetNestedField(sb.Object, status, "status"); err != nil {
		return err
	}
	_, err = dyn.Resource(gvr).Namespace(sb.GetNamespace()).UpdateStatus(ctx, sb, metav1.UpdateOptions{})
	return err
}

// podFor is the pod the controller makes of a Sandbox: its podTemplate, named after it, owned
// by it.
func podFor(sb *unstructured.Unstructured) (*corev1.Pod, error) {
	tmpl, found, err := unstructured.NestedMap(sb.Object, "spec", "podTemplate")
	if err != nil || !found {
		return nil, fmt.Errorf("sandbox %s has no podTemplate: %w", sb.GetName(), err)
	}
	var t corev1.PodTemplateSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(tmpl, &t); err != nil {
		return nil, fmt.Errorf("decoding the podTemplate of sandbox %s: %w", sb.GetName(), err)
	}
	yes := true
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: sb.GetName(), Namespace: sb.GetNamespace(),
			Labels: t.Labels, Annotations: t.Annotations,
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: sb.GetAPIVersion(), Kind: sb.GetKind(), Name: sb.GetName(), UID: sb.GetUID(),
				Controller: &yes, BlockOwnerDeletion: &yes,
			}},
		},
		Spec: t.Spec,
	}, nil
}

func expired(sb *unstructured.Unstructured) bool {
	at, _, _ := unstructured.NestedString(sb.Object, "spec", "shutdownTime")
	policyName, _, _ := unstructured.NestedString(sb.Object, "spec", "shutdownPolicy")
	t, err := time.Parse(time.RFC3339, at)
	return err == nil && policyName == "Delete" && !time.Now().Before(t)
}

func ready(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func readyCondition(sb *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(sb.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Ready" && m["status"] == "True" {
			return true
		}
	}
	return false
}
