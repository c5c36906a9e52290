// Package sandboxtest is a test-only stand-in for the agent-sandbox controller, which cannot be
// installed on the project's cluster (no registry to pull it from). It does for kubeclip's
// Sandboxes (v1beta1, label paperclip.io/managed-by=kubeclip) what the controller
// (kubernetes-sigs/agent-sandbox v0.5.6, controllers/sandbox_controller.go) does and kubeclip
// relies on, each step citing the function it copies:
//
//   - the claims of spec.volumeClaimTemplates, named "<template>-<sandbox>", owned by the
//     Sandbox, made before the pod and kept in every operating mode (reconcilePVCs);
//   - the pod named after the Sandbox from spec.podTemplate, owned by it, with the claims'
//     volumes in place of the template's volumes of the same names (reconcilePod,
//     MergeVolumeClaimVolumes); deleting the Sandbox deletes both through the garbage collector;
//   - spec.operatingMode Suspended: the pod deleted, no other made; Running again: a new pod
//     (reconcilePod);
//   - the Suspended and Ready conditions (computeSuspendedCondition, computeReadyCondition);
//   - a Sandbox whose spec.shutdownTime has passed deleted when its shutdownPolicy is Delete
//     (handleSandboxExpiry).
//
// Nothing else: no Service, warm pools, adoption of unowned pods or claims, pod metadata
// propagation, PodScheduled or Finished conditions, status podIPs, or a Retain expiry. It polls
// instead of watching, being a test fixture, not the system under test.
package sandboxtest

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
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

// sandboxLabel is the controller's label on a Sandbox's pod and claims: NameHash of its name.
const sandboxLabel = "agents.x-k8s.io/sandbox-name-hash"

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
	// reconcileChildResources: the claims first; the pod is reconciled even when they fail.
	claimErr := reconcileClaims(ctx, cs, sb)
	pod, podErr := reconcilePod(ctx, cs, sb)
	err := errors.Join(claimErr, podErr)
	return errors.Join(err, updateConditions(ctx, dyn, sb, pod, err))
}

// claimTemplate is a v1beta1 PersistentVolumeClaimTemplate.
type claimTemplate struct {
	Metadata struct {
		Name        string            `json:"name"`
		Labels      map[string]string `json:"labels,omitempty"`
		Annotations map[string]string `json:"annotations,omitempty"`
	} `json:"metadata"`
	Spec corev1.PersistentVolumeClaimSpec `json:"spec"`
}

func claimTemplates(sb *unstructured.Unstructured) ([]claimTemplate, error) {
	raw, _, err := unstructured.NestedSlice(sb.Object, "spec", "volumeClaimTemplates")
	if err != nil {
		return nil, fmt.Errorf("reading the volumeClaimTemplates of sandbox %s: %w", sb.GetName(), err)
	}
	out := make([]claimTemplate, len(raw))
	for i, r := range raw {
		m, _ := r.(map[string]any)
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &out[i]); err != nil {
			return nil, fmt.Errorf("decoding a volumeClaimTemplate of sandbox %s: %w", sb.GetName(), err)
		}
	}
	return out, nil
}

// reconcileClaims is reconcilePVCs: each template's claim "<template>-<sandbox>", created with
// the template's labels (and the controller's) and spec, owned by the Sandbox; one that exists
// and is the Sandbox's is left as it is. The real controller adopts an unowned claim carrying
// its label or agents.x-k8s.io/adoptable; kubeclip makes neither, so the stand-in refuses it.
func reconcileClaims(ctx context.Context, cs kubernetes.Interface, sb *unstructured.Unstructured) error {
	templates, err := claimTemplates(sb)
	if err != nil {
		return err
	}
	claims := cs.CoreV1().PersistentVolumeClaims(sb.GetNamespace())
	for _, t := range templates {
		name := t.Metadata.Name + "-" + sb.GetName()
		got, err := claims.Get(ctx, name, metav1.GetOptions{})
		switch {
		case err == nil:
			if !metav1.IsControlledBy(got, sb) {
				return fmt.Errorf("PVC %q is not owned by sandbox %q", name, sb.GetName())
			}
			continue
		case !apierrors.IsNotFound(err):
			return fmt.Errorf("failed to get PVC: %w", err)
		}
		labels := maps.Clone(t.Metadata.Labels)
		if labels == nil {
			labels = map[string]string{}
		}
		labels[sandboxLabel] = nameHash(sb.GetName())
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{
				Name: name, Namespace: sb.GetNamespace(),
				Labels: labels, Annotations: maps.Clone(t.Metadata.Annotations),
				OwnerReferences: []metav1.OwnerReference{controllerRef(sb)},
			},
			Spec: t.Spec,
		}
		if _, err := claims.Create(ctx, pvc, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// reconcilePod is reconcilePod for kubeclip's Sandboxes (no warm pool, no pod-name annotation):
// Suspended deletes the Sandbox's pod (once; a pod being deleted is left to go) and makes none;
// otherwise a missing pod is made. It returns the pod there is, nil when there is none.
func reconcilePod(ctx context.Context, cs kubernetes.Interface, sb *unstructured.Unstructured) (*corev1.Pod, error) {
	pods := cs.CoreV1().Pods(sb.GetNamespace())
	pod, err := pods.Get(ctx, sb.GetName(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		pod = nil
	case err != nil:
		return nil, fmt.Errorf("pod get failed: %w", err)
	}
	if suspended(sb) {
		if pod != nil && metav1.IsControlledBy(pod, sb) && pod.DeletionTimestamp == nil {
			if err := pods.Delete(ctx, pod.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return pod, fmt.Errorf("failed to delete pod: %w", err)
			}
		}
		return pod, nil
	}
	if pod != nil {
		return pod, nil
	}
	want, err := podFor(sb)
	if err != nil {
		return nil, err
	}
	return pods.Create(ctx, want, metav1.CreateOptions{})
}

// podFor is the pod the controller makes of a Sandbox: its podTemplate, named after it, owned
// by it, each volumeClaimTemplate's claim as a volume of the template's name, replacing the
// template's volume of that name (MergeVolumeClaimVolumes).
func podFor(sb *unstructured.Unstructured) (*corev1.Pod, error) {
	tmpl, found, err := unstructured.NestedMap(sb.Object, "spec", "podTemplate")
	if err != nil || !found {
		return nil, fmt.Errorf("sandbox %s has no podTemplate: %w", sb.GetName(), err)
	}
	var t corev1.PodTemplateSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(tmpl, &t); err != nil {
		return nil, fmt.Errorf("decoding the podTemplate of sandbox %s: %w", sb.GetName(), err)
	}
	claims, err := claimTemplates(sb)
	if err != nil {
		return nil, err
	}
	for _, c := range claims {
		vol := corev1.Volume{Name: c.Metadata.Name, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c.Metadata.Name + "-" + sb.GetName()},
		}}
		kept := t.Spec.Volumes[:0]
		for _, v := range t.Spec.Volumes {
			if v.Name != vol.Name {
				kept = append(kept, v)
			}
		}
		t.Spec.Volumes = append(kept, vol)
	}
	labels := maps.Clone(t.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels[sandboxLabel] = nameHash(sb.GetName())
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: sb.GetName(), Namespace: sb.GetNamespace(),
			Labels: labels, Annotations: t.Annotations,
			OwnerReferences: []metav1.OwnerReference{controllerRef(sb)},
		},
		Spec: t.Spec,
	}, nil
}

// controllerRef is ctrl.SetControllerReference's: the Sandbox as controller, blocking the
// owner's foreground deletion.
func controllerRef(sb *unstructured.Unstructured) metav1.OwnerReference {
	yes := true
	return metav1.OwnerReference{
		APIVersion: sb.GetAPIVersion(), Kind: sb.GetKind(), Name: sb.GetName(), UID: sb.GetUID(),
		Controller: &yes, BlockOwnerDeletion: &yes,
	}
}

// updateConditions writes the Sandbox's Suspended and Ready conditions when they changed.
func updateConditions(ctx context.Context, dyn dynamic.Interface, sb *unstructured.Unstructured, pod *corev1.Pod, reconcileErr error) error {
	var status struct {
		Conditions []metav1.Condition `json:"conditions,omitempty"`
	}
	if raw, ok, _ := unstructured.NestedMap(sb.Object, "status"); ok {
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &status); err != nil {
			return fmt.Errorf("decoding the status of sandbox %s: %w", sb.GetName(), err)
		}
	}
	before := append([]metav1.Condition(nil), status.Conditions...)
	for _, c := range []metav1.Condition{suspendedCondition(sb, pod), readyCondition(sb, pod, reconcileErr)} {
		c.ObservedGeneration = sb.GetGeneration()
		meta.SetStatusCondition(&status.Conditions, c)
	}
	if equality.Semantic.DeepEqual(before, status.Conditions) {
		return nil
	}
	raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&status)
	if err != nil {
		return err
	}
	if err := unstructured.SetNestedField(sb.Object, raw, "status"); err != nil {
		return err
	}
	_, err = dyn.Resource(policy.SandboxGVR(sb.GetAPIVersion())).Namespace(sb.GetNamespace()).UpdateStatus(ctx, sb, metav1.UpdateOptions{})
	return err
}

// suspendedCondition is computeSuspendedCondition.
func suspendedCondition(sb *unstructured.Unstructured, pod *corev1.Pod) metav1.Condition {
	c := metav1.Condition{Type: "Suspended", Status: metav1.ConditionFalse, Reason: "NotSuspended", Message: "Sandbox is not suspended"}
	switch {
	case !suspended(sb):
	case pod == nil:
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, "PodTerminated", "Pod has been terminated. Sandbox is suspended"
	case !metav1.IsControlledBy(pod, sb):
		c.Reason, c.Message = "PodNotOwned", "Refused to delete pod because it is not owned by this sandbox"
	default:
		c.Reason, c.Message = "PodTerminating", "Pod is terminating. Sandbox is suspending"
	}
	return c
}

// readyCondition is computeReadyCondition without the Service (kubeclip asks for none).
func readyCondition(sb *unstructured.Unstructured, pod *corev1.Pod, reconcileErr error) metav1.Condition {
	c := metav1.Condition{Type: "Ready", Status: metav1.ConditionFalse, Reason: "DependenciesNotReady"}
	switch {
	case reconcileErr != nil:
		c.Reason, c.Message = "ReconcilerError", "Error seen: "+reconcileErr.Error()
	case suspended(sb) && pod != nil:
		c.Reason, c.Message = "SandboxSuspended", "Sandbox is suspending"
	case suspended(sb):
		c.Reason, c.Message = "SandboxSuspended", "Sandbox is suspended"
	case pod == nil:
		c.Message = "Pod does not exist"
	case pod.Status.Phase == corev1.PodSucceeded:
		c.Reason, c.Message = "PodSucceeded", "Pod completed successfully"
	case pod.Status.Phase == corev1.PodFailed:
		c.Reason, c.Message = "PodFailed", "Pod failed"
	case ready(pod):
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, "DependenciesReady", "Pod is Ready"
	default:
		c.Message = "Pod exists with phase: " + string(pod.Status.Phase)
	}
	return c
}

func suspended(sb *unstructured.Unstructured) bool {
	mode, _, _ := unstructured.NestedString(sb.Object, "spec", "operatingMode")
	return mode == "Suspended"
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

// nameHash is NameHash: FNV-1a of the name as eight hex digits.
func nameHash(name string) string {
	h := fnv.New32a()
	h.Write([]byte(name))
	return fmt.Sprintf("%08x", h.Sum32())
}
