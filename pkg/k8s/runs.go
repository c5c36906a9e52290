package k8s

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
)

// LabelRunID carries the Paperclip run id on a run's workload and Secret. Two requests for the
// same object name are the same run only if this label matches.
const LabelRunID = "paperclip.io/run-id"

// ErrRunConflict means an object with the run's name already exists and belongs to another run
// (its LabelRunID differs). Retrying cannot fix it.
var ErrRunConflict = errors.New("object belongs to another run")

// CreatedRun is the outcome of a successful StartJobRun, StartPodRun or CreateWorkloadRun.
type CreatedRun struct {
	// JobUID is the UID of the workload (the Job, or the Sandbox CR for CreateWorkloadRun).
	JobUID types.UID
	// Existed is true when the workload was already there for this run id (a redelivered or
	// duplicated request): nothing new was started.
	Existed bool

	// What AdoptSecret needs.
	namespace, secretName, apiVersion, kind, name string
	// adopted: the Secret was created owned by the workload; AdoptSecret has nothing to do.
	adopted bool
}

// AdoptSecret makes the run's workload the owner of its Secret (controller,
// blockOwnerDeletion), so the garbage collector removes the Secret with the workload, unless the
// Secret was created so. The merge patch replaces the whole ownerReferences list, so it is
// idempotent.
func (r CreatedRun) AdoptSecret(ctx context.Context, cs kubernetes.Interface) error {
	if r.adopted {
		return nil
	}
	patch, err := ownerPatch(r.apiVersion, r.kind, r.name, r.JobUID)
	if err != nil {
		return err
	}
	_, err = cs.CoreV1().Secrets(r.namespace).Patch(ctx, r.secretName, types.MergePatchType, patch, metav1.PatchOptions{FieldManager: DefaultFieldManager})
	if err != nil {
		return fmt.Errorf("setting owner of Secret %s/%s to %s: %w", r.namespace, r.secretName, objRef(r.kind, r.namespace, r.name), err)
	}
	return nil
}

// StartJobRun creates a Job run in two steps, so that a redelivered or duplicated request never
// starts a second workload, bad input leaves nothing behind, and no Secret is ever without its
// owner:
//
//  1. Create the Job. AlreadyExists is fine (Existed) when its LabelRunID matches,
//     ErrRunConflict otherwise. If the create fails for good (Invalid, Forbidden (which includes
//     an exceeded ResourceQuota), BadRequest, ...), a Secret of this run an earlier attempt left
//     is deleted and the error returned.
//  2. Create the Secret owned by the Job (controller, blockOwnerDeletion), so the garbage
//     collector removes it with the Job. AlreadyExists is fine when its LabelRunID matches (the
//     caller's AdoptSecret then sets its owner: a merge patch of the whole list, idempotent),
//     ErrRunConflict otherwise. If it fails for good (ErrRunConflict included), the Job this
//     call created is deleted: nothing would ever complete the run.
//
// Two API requests, one after the other, where there were three (the Secret first, the Job,
// then a PATCH of the Secret's owner): on a busy API server kubeclip's acquisitions/s are its
// requests/s over its requests per acquire (issue 16). The pod's envFrom secretRef is not
// optional, so a pod whose Secret is missing reports CreateContainerConfigError until it appears:
// that is why the Secret used to come first. The Secret's POST goes out as soon as the Job's is
// answered, before the Job controller, the scheduler and the kubelet have made, bound and
// started the pod, so it exists first in practice; if it does not (or a retry completes it, a
// redelivery finding the Job), the run classifier's StartErrorGrace covers the wait (the kubelet
// reports `secret "…" not found`); its own "failed to sync secret cache" gets a minute.
//
// secret and job must be in the same namespace and both carry LabelRunID with the same value.
// Neither argument is modified. A retryable error (network, 5xx, 429, Conflict) may leave the Job
// without its Secret; calling again with the same input completes the run, and a lease that fails
// instead has its workload deleted (the dispatcher's failure path, else its reconcile pass).
//
// The run's pod can start once StartJobRun returns. The caller finishes with AdoptSecret, which
// does nothing unless the Secret already existed.
func StartJobRun(ctx context.Context, cs kubernetes.Interface, secret *corev1.Secret, job *batchv1.Job) (CreatedRun, error) {
	if job == nil {
		return CreatedRun{}, fmt.Errorf("creating run: nil Job: %w", ErrInvalidObject)
	}
	return createRun(ctx, cs, secret, &jobWorkload{cs: cs, job: job})
}

// StartPodRun is StartJobRun for a bare Pod (the exec-capable backend "pod"): the Pod, then its
// Secret owned by it; the caller finishes with AdoptSecret.
func StartPodRun(ctx context.Context, cs kubernetes.Interface, secret *corev1.Secret, pod *corev1.Pod) (CreatedRun, error) {
	if pod == nil {
		return CreatedRun{}, fmt.Errorf("creating run: nil Pod: %w", ErrInvalidObject)
	}
	return createRun(ctx, cs, secret, &podWorkload{cs: cs, pod: pod})
}

// StartPodRunDeletion starts deleting the pod called name with the grace period of opts and
// does not wait (DeletePodRun waits). A pod that is gone, or already being deleted at least as
// fast, is left as it is.
func StartPodRunDeletion(ctx context.Context, cs kubernetes.Interface, namespace, name string, opts RunDeleteOptions) error {
	opts = opts.withDefaults()
	sel := metav1.ListOptions{FieldSelector: "metadata.name=" + name}
	if err := startPodDeletion(ctx, cs, namespace, sel, opts.PodGracePeriod); err != nil {
		return fmt.Errorf("deleting pod %s/%s: %w", namespace, name, err)
	}
	return nil
}

// DeletePodRun deletes a run's bare Pod with the grace period of opts and returns once it is
// gone; like DeleteRun it is idempotent.
func DeletePodRun(ctx context.Context, cs kubernetes.Interface, namespace, name string, opts RunDeleteOptions) error {
	opts = opts.withDefaults()
	sel := metav1.ListOptions{FieldSelector: "metadata.name=" + name}
	if err := deletePodsAndWait(ctx, cs, namespace, sel, opts.PodGracePeriod); err != nil {
		return fmt.Errorf("deleting pod %s/%s: %w", namespace, name, err)
	}
	return nil
}

// CreateWorkloadRun is CreateJobRun for a workload given as an unstructured object (the
// agent-sandbox Sandbox CR), created through dyn at gvr. The Secret's owner reference takes
// obj's apiVersion and kind.
func CreateWorkloadRun(ctx context.Context, cs kubernetes.Interface, dyn dynamic.Interface, gvr schema.GroupVersionResource, secret *corev1.Secret, obj *unstructured.Unstructured) (CreatedRun, error) {
	if obj == nil || dyn == nil {
		return CreatedRun{}, fmt.Errorf("creating run: nil workload or dynamic client: %w", ErrInvalidObject)
	}
	run, err := createRun(ctx, cs, secret, &unstructuredWorkload{dyn: dyn, gvr: gvr, obj: obj})
	if err != nil {
		return CreatedRun{}, err
	}
	return run, run.AdoptSecret(ctx, cs)
}

// workload is the part of a run that creates pods: a Job or a Sandbox CR.
type workload interface {
	meta() metav1.Object
	apiVersionKind() (apiVersion, kind string)
	create(ctx context.Context) (types.UID, error)
	get(ctx context.Context) (metav1.Object, error)
	// discard starts deleting the incarnation uid; gone already is success.
	discard(ctx context.Context, uid types.UID) error
}

// runPart is the outcome of one of createRun's two creates.
type runPart struct {
	uid     types.UID // of the object made now, or found with the run's id
	created bool      // this call made it
	err     error
}

func createRun(ctx context.Context, cs kubernetes.Interface, secret *corev1.Secret, w workload) (CreatedRun, error) {
	wm := w.meta()
	apiVersion, kind := w.apiVersionKind()
	ns, name := wm.GetNamespace(), wm.GetName()
	if err := validateRunInput(secret, w); err != nil {
		return CreatedRun{}, fmt.Errorf("creating run %s: %w", objRef(kind, ns, name), err)
	}
	runID := wm.GetLabels()[LabelRunID]
	secrets := cs.CoreV1().Secrets(ns)

	// 1. The workload.
	wp := createRunWorkload(ctx, w, runID)
	if wp.err != nil {
		if isPermanentCreateError(wp.err) {
			// Nothing will ever own a Secret an earlier attempt of this run left: remove it.
			return CreatedRun{}, errors.Join(wp.err, deleteRunSecret(ctx, secrets, secret.Name, runID))
		}
		return CreatedRun{}, wp.err
	}

	// 2. The Secret, owned by the workload.
	run := CreatedRun{JobUID: wp.uid, Existed: !wp.created}
	run.namespace, run.secretName, run.apiVersion, run.kind, run.name = ns, secret.Name, apiVersion, kind, name
	sp := createRunSecret(ctx, secrets, secret, runID, secretOwner(apiVersion, kind, name, wp.uid))
	switch {
	case sp.err == nil:
		run.adopted = sp.created
		return run, nil
	case wp.created && (isPermanentCreateError(sp.err) || errors.Is(sp.err, ErrRunConflict)):
		return CreatedRun{}, errors.Join(sp.err, w.discard(ctx, wp.uid))
	default:
		return CreatedRun{}, sp.err
	}
}

// createRunSecret creates the run's Secret owned by owner, or finds it made for runID.
func createRunSecret(ctx context.Context, secrets typedcorev1.SecretInterface, secret *corev1.Secret, runID string, owner metav1.OwnerReference) runPart {
	sec := secret.DeepCopy()
	sec.OwnerReferences = []metav1.OwnerReference{owner}
	sec.ResourceVersion = ""
	got, err := secrets.Create(ctx, sec, metav1.CreateOptions{FieldManager: DefaultFieldManager})
	switch {
	case err == nil:
		return runPart{uid: got.UID, created: true}
	case !apierrors.IsAlreadyExists(err):
		return runPart{err: fmt.Errorf("creating Secret %s/%s: %w", sec.Namespace, sec.Name, err)}
	}
	got, err = secrets.Get(ctx, sec.Name, metav1.GetOptions{})
	if err != nil {
		return runPart{err: fmt.Errorf("reading existing Secret %s/%s: %w", sec.Namespace, sec.Name, err)}
	}
	if label := got.Labels[LabelRunID]; label != runID {
		return runPart{err: fmt.Errorf("creating Secret %s/%s: exists with %s=%q: %w", sec.Namespace, sec.Name, LabelRunID, label, ErrRunConflict)}
	}
	return runPart{uid: got.UID}
}

// deleteRunSecret deletes the Secret name if it is runID's.
func deleteRunSecret(ctx context.Context, secrets typedcorev1.SecretInterface, name, runID string) error {
	got, err := secrets.Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("reading Secret %s: %w", name, err)
	case got.Labels[LabelRunID] != runID:
		return nil
	}
	return deleteSecretUID(ctx, secrets, name, got.UID)
}

// createRunWorkload creates the run's workload, or finds it made for runID.
func createRunWorkload(ctx context.Context, w workload, runID string) runPart {
	wm := w.meta()
	_, kind := w.apiVersionKind()
	ref := objRef(kind, wm.GetNamespace(), wm.GetName())
	uid, err := w.create(ctx)
	switch {
	case err == nil:
		return runPart{uid: uid, created: true}
	case !apierrors.IsAlreadyExists(err):
		return runPart{err: fmt.Errorf("creating %s: %w", ref, err)}
	}
	existing, err := w.get(ctx)
	if err != nil {
		return runPart{err: fmt.Errorf("reading existing %s: %w", ref, err)}
	}
	if label := existing.GetLabels()[LabelRunID]; label != runID {
		return runPart{err: fmt.Errorf("creating %s: exists with %s=%q: %w", ref, LabelRunID, label, ErrRunConflict)}
	}
	return runPart{uid: existing.GetUID()}
}

// discardOptions deletes the incarnation uid in the background.
func discardOptions(uid types.UID) metav1.DeleteOptions {
	prop := metav1.DeletePropagationBackground
	return metav1.DeleteOptions{PropagationPolicy: &prop, Preconditions: &metav1.Preconditions{UID: &uid}}
}

// discarded is the outcome of a discard: gone already, or replaced by another incarnation, is
// success.
func discarded(err error, kind, namespace, name string) error {
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return fmt.Errorf("cleaning up %s: %w", objRef(kind, namespace, name), err)
}

func validateRunInput(secret *corev1.Secret, w workload) error {
	wm := w.meta()
	if secret == nil {
		return fmt.Errorf("nil Secret: %w", ErrInvalidObject)
	}
	if wm.GetName() == "" || wm.GetNamespace() == "" || secret.Name == "" {
		return fmt.Errorf("workload and Secret need a name and a namespace: %w", ErrInvalidObject)
	}
	if secret.Namespace != wm.GetNamespace() {
		return fmt.Errorf("the Secret's namespace %q differs from the workload's %q: %w", secret.Namespace, wm.GetNamespace(), ErrInvalidObject)
	}
	runID := wm.GetLabels()[LabelRunID]
	if runID == "" {
		return fmt.Errorf("workload has no %s label: %w", LabelRunID, ErrInvalidObject)
	}
	if got := secret.Labels[LabelRunID]; got != runID {
		return fmt.Errorf("the Secret's %s=%q differs from the workload's %q: %w", LabelRunID, got, runID, ErrInvalidObject)
	}
	return nil
}

// isPermanentCreateError reports whether a create failed in a way a retry cannot fix, so the
// pieces already created must be removed.
func isPermanentCreateError(err error) bool {
	return apierrors.IsInvalid(err) || apierrors.IsForbidden(err) || apierrors.IsBadRequest(err) ||
		apierrors.IsNotFound(err) || apierrors.IsMethodNotSupported(err) ||
		apierrors.IsRequestEntityTooLargeError(err) || apierrors.IsUnsupportedMediaType(err) ||
		apierrors.IsNotAcceptable(err)
}

// secretOwner is the run's workload as its Secret's owner: the controller, and the workload's
// foreground deletion waits for the Secret.
func secretOwner(apiVersion, kind, name string, uid types.UID) metav1.OwnerReference {
	yes := true
	return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: uid, Controller: &yes, BlockOwnerDeletion: &yes}
}

func ownerPatch(apiVersion, kind, name string, uid types.UID) ([]byte, error) {
	p := map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{secretOwner(apiVersion, kind, name, uid)}}}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encoding owner patch: %w", err)
	}
	return b, nil
}

type secretDeleter interface {
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// deleteSecretUID deletes the Secret only if it is still the incarnation we saw.
func deleteSecretUID(ctx context.Context, secrets secretDeleter, name string, uid types.UID) error {
	opts := metav1.DeleteOptions{}
	if uid != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	err := secrets.Delete(ctx, name, opts)
	if err == nil || apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return fmt.Errorf("cleaning up Secret %s: %w", name, err)
}

type jobWorkload struct {
	cs  kubernetes.Interface
	job *batchv1.Job
}

func (w *jobWorkload) meta() metav1.Object              { return w.job }
func (w *jobWorkload) apiVersionKind() (string, string) { return "batch/v1", "Job" }
func (w *jobWorkload) get(ctx context.Context) (metav1.Object, error) {
	return w.cs.BatchV1().Jobs(w.job.Namespace).Get(ctx, w.job.Name, metav1.GetOptions{})
}

func (w *jobWorkload) discard(ctx context.Context, uid types.UID) error {
	err := w.cs.BatchV1().Jobs(w.job.Namespace).Delete(ctx, w.job.Name, discardOptions(uid))
	return discarded(err, "Job", w.job.Namespace, w.job.Name)
}

func (w *jobWorkload) create(ctx context.Context) (types.UID, error) {
	j := w.job.DeepCopy()
	j.ResourceVersion = ""
	got, err := w.cs.BatchV1().Jobs(j.Namespace).Create(ctx, j, metav1.CreateOptions{FieldManager: DefaultFieldManager})
	if err != nil {
		return "", err
	}
	return got.UID, nil
}

type podWorkload struct {
	cs  kubernetes.Interface
	pod *corev1.Pod
}

func (w *podWorkload) meta() metav1.Object              { return w.pod }
func (w *podWorkload) apiVersionKind() (string, string) { return "v1", "Pod" }
func (w *podWorkload) get(ctx context.Context) (metav1.Object, error) {
	return w.cs.CoreV1().Pods(w.pod.Namespace).Get(ctx, w.pod.Name, metav1.GetOptions{})
}

func (w *podWorkload) discard(ctx context.Context, uid types.UID) error {
	err := w.cs.CoreV1().Pods(w.pod.Namespace).Delete(ctx, w.pod.Name, discardOptions(uid))
	return discarded(err, "Pod", w.pod.Namespace, w.pod.Name)
}

func (w *podWorkload) create(ctx context.Context) (types.UID, error) {
	p := w.pod.DeepCopy()
	p.ResourceVersion = ""
	got, err := w.cs.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{FieldManager: DefaultFieldManager})
	if err != nil {
		return "", err
	}
	return got.UID, nil
}

type unstructuredWorkload struct {
	dyn dynamic.Interface
	gvr schema.GroupVersionResource
	obj *unstructured.Unstructured
}

func (w *unstructuredWorkload) meta() metav1.Object { return w.obj }
func (w *unstructuredWorkload) apiVersionKind() (string, string) {
	return w.obj.GetAPIVersion(), w.obj.GetKind()
}

func (w *unstructuredWorkload) get(ctx context.Context) (metav1.Object, error) {
	return w.dyn.Resource(w.gvr).Namespace(w.obj.GetNamespace()).Get(ctx, w.obj.GetName(), metav1.GetOptions{})
}

func (w *unstructuredWorkload) discard(ctx context.Context, uid types.UID) error {
	err := w.dyn.Resource(w.gvr).Namespace(w.obj.GetNamespace()).Delete(ctx, w.obj.GetName(), discardOptions(uid))
	return discarded(err, w.obj.GetKind(), w.obj.GetNamespace(), w.obj.GetName())
}

func (w *unstructuredWorkload) create(ctx context.Context) (types.UID, error) {
	o := w.obj.DeepCopy()
	o.SetResourceVersion("")
	got, err := w.dyn.Resource(w.gvr).Namespace(o.GetNamespace()).Create(ctx, o, metav1.CreateOptions{FieldManager: DefaultFieldManager})
	if err != nil {
		return "", err
	}
	return got.GetUID(), nil
}

// DefaultPodGracePeriod is the grace period DeleteRun gives a run's pods. The agent gets SIGTERM
// (forwarded by tini) and this long to flush its last stream-json lines before SIGKILL; it is
// short because a release waits for it, and an agent has nothing to save beyond its log.
const DefaultPodGracePeriod = 5 * time.Second

// RunDeleteOptions tunes DeleteRun and DeleteWorkloadRun.
type RunDeleteOptions struct {
	// Propagation of the workload's deletion. Default Foreground for a Job (see DeleteRun) and
	// Background otherwise: the workload disappears at once and its pods are deleted directly
	// (and waited for).
	Propagation metav1.DeletionPropagation
	// PodGracePeriod is the pods' termination grace period. Zero means DefaultPodGracePeriod;
	// anything below a second is raised to one second, because a zero grace period is a force
	// delete: the pod object vanishes while its containers may still run, and waiting for it
	// would prove nothing.
	PodGracePeriod time.Duration
}

func (o RunDeleteOptions) withDefaults() RunDeleteOptions {
	if o.Propagation == "" {
		o.Propagation = metav1.DeletePropagationBackground
	}
	if o.PodGracePeriod == 0 {
		o.PodGracePeriod = DefaultPodGracePeriod
	}
	if o.PodGracePeriod < time.Second {
		o.PodGracePeriod = time.Second
	}
	return o
}

// DeleteRun deletes a run's Job and its pods and returns once neither exists any more, that is
// once the kubelet has confirmed the containers stopped. A missing Job or pod is not an error, so
// DeleteRun is idempotent.
//
// The Job is deleted in the foreground (unless opts says otherwise): it stays, marked for
// deletion, until the garbage collector has removed its pods, and the Job controller never
// creates a pod for a Job so marked. Waiting for the Job itself to be gone therefore also covers
// a pod the controller was creating when the deletion came (background propagation removes the
// Job at once, and such a pod could appear after its run was reported released). The pods are
// selected by the batch.kubernetes.io/job-name label and deleted directly with opts' grace
// period rather than the pod's own, longer one.
//
// The `released` event must only be published after DeleteRun returned nil: until then the
// agent may still be running and holding the tenant's quota. The wait is bounded by ctx only (a
// pod on a dead node stays Terminating until the node is removed); give ctx a deadline.
func DeleteRun(ctx context.Context, cs kubernetes.Interface, namespace, jobName string, opts RunDeleteOptions) error {
	if opts.Propagation == "" {
		opts.Propagation = metav1.DeletePropagationForeground
	}
	opts = opts.withDefaults()
	prop := opts.Propagation
	jobs := cs.BatchV1().Jobs(namespace)
	err := jobs.Delete(ctx, jobName, metav1.DeleteOptions{PropagationPolicy: &prop})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting Job %s/%s: %w", namespace, jobName, err)
	}
	sel := labels.Set{batchv1.JobNameLabel: jobName}.String()
	if err := deletePodsAndWait(ctx, cs, namespace, metav1.ListOptions{LabelSelector: sel}, opts.PodGracePeriod); err != nil {
		return fmt.Errorf("deleting pods of Job %s/%s: %w", namespace, jobName, err)
	}
	if err := waitJobGone(ctx, jobs, jobName); err != nil {
		return fmt.Errorf("waiting for Job %s/%s to go: %w", namespace, jobName, err)
	}
	// A pod the Job controller created just before it saw the deletion (after the list above)
	// may outlive its Job: the garbage collector can finish the Job's foreground deletion
	// before its graph holds that pod, and collects it as a dangling dependent only later.
	// The Job is gone now, so no pod can follow this second pass.
	if err := deletePodsAndWait(ctx, cs, namespace, metav1.ListOptions{LabelSelector: sel}, opts.PodGracePeriod); err != nil {
		return fmt.Errorf("deleting pods of Job %s/%s: %w", namespace, jobName, err)
	}
	return nil
}

type jobGetWatcher interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*batchv1.Job, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// waitJobGone returns once the Job name no longer exists: a Get, then a watch from its
// resourceVersion until the deletion.
func waitJobGone(ctx context.Context, jobs jobGetWatcher, name string) error {
	for {
		job, err := jobs.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		w, err := jobs.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + name, ResourceVersion: job.ResourceVersion})
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			continue
		}
		gone := false
		for ev := range w.ResultChan() {
			if ev.Type == watch.Deleted {
				gone = true
				break
			}
		}
		w.Stop()
		if gone {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// DeleteWorkloadRun is DeleteRun for a workload created through dyn at gvr (a Sandbox CR). pods
// selects the workload's pods: agent-sandbox names the pod after the Sandbox, so
// metav1.ListOptions{FieldSelector: "metadata.name=<name>"} is the usual choice.
func DeleteWorkloadRun(ctx context.Context, cs kubernetes.Interface, dyn dynamic.Interface, gvr schema.GroupVersionResource, namespace, name string, pods metav1.ListOptions, opts RunDeleteOptions) error {
	opts = opts.withDefaults()
	if pods.LabelSelector == "" && pods.FieldSelector == "" {
		return fmt.Errorf("deleting pods of %s %s/%s: empty pod selector: %w", gvr.Resource, namespace, name, ErrInvalidObject)
	}
	// The pods first, with opts' grace period: the workload's garbage collection would delete
	// them with their own terminationGracePeriodSeconds, and a kubelet does not shorten a
	// termination it has begun. A pod being deleted still exists, so the workload's controller
	// does not replace it before the workload itself goes.
	if err := startPodDeletion(ctx, cs, namespace, pods, opts.PodGracePeriod); err != nil {
		return fmt.Errorf("deleting pods of %s %s/%s: %w", gvr.Resource, namespace, name, err)
	}
	prop := opts.Propagation
	err := dyn.Resource(gvr).Namespace(namespace).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &prop})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting %s %s/%s: %w", gvr.Resource, namespace, name, err)
	}
	if err := deletePodsAndWait(ctx, cs, namespace, pods, opts.PodGracePeriod); err != nil {
		return fmt.Errorf("deleting pods of %s %s/%s: %w", gvr.Resource, namespace, name, err)
	}
	return nil
}

// DeleteSecret deletes a run's Secret; NotFound is success. A Secret owned by its Job goes with
// it anyway; this is for a destroy that must not depend on the garbage collector.
func DeleteSecret(ctx context.Context, cs kubernetes.Interface, namespace, name string) error {
	err := cs.CoreV1().Secrets(namespace).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting Secret %s/%s: %w", namespace, name, err)
	}
	return nil
}

// deletePodsAndWait deletes every pod sel matches and returns when none is left.
func deletePodsAndWait(ctx context.Context, cs kubernetes.Interface, namespace string, sel metav1.ListOptions, grace time.Duration) error {
	pods := cs.CoreV1().Pods(namespace)
	deletePod := podDeleter(ctx, pods, grace)
	for {
		list, err := pods.List(ctx, sel)
		if err != nil {
			return fmt.Errorf("listing pods: %w", err)
		}
		left := make(map[types.UID]bool, len(list.Items))
		for i := range list.Items {
			if err := deletePod(&list.Items[i]); err != nil {
				return err
			}
			left[list.Items[i].UID] = true
		}
		if len(left) == 0 {
			return nil
		}
		wopts := sel
		wopts.ResourceVersion = list.ResourceVersion
		wopts.AllowWatchBookmarks = true
		w, err := pods.Watch(ctx, wopts)
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("waiting for %d pod(s) to go: %w", len(left), ctx.Err())
			}
			continue // e.g. 410 Gone: list again
		}
		done, err := drainPodWatch(ctx, w, left, deletePod)
		w.Stop()
		if err != nil || done {
			return err
		}
		// The watch ended (server timeout, 410 Gone, connection reset): list again.
	}
}

// startPodDeletion deletes every pod sel matches with the grace period and does not wait.
func startPodDeletion(ctx context.Context, cs kubernetes.Interface, namespace string, sel metav1.ListOptions, grace time.Duration) error {
	pods := cs.CoreV1().Pods(namespace)
	list, err := pods.List(ctx, sel)
	if err != nil {
		return fmt.Errorf("listing pods: %w", err)
	}
	deletePod := podDeleter(ctx, pods, grace)
	for i := range list.Items {
		if err := deletePod(&list.Items[i]); err != nil {
			return err
		}
	}
	return nil
}

// podDeleter deletes a pod with the grace period, unless it is already being deleted at least
// as fast. Gone already, or replaced by a pod of the same name, is success.
func podDeleter(ctx context.Context, pods typedcorev1.PodInterface, grace time.Duration) func(*corev1.Pod) error {
	graceSec := int64(grace / time.Second)
	return func(p *corev1.Pod) error {
		if p.DeletionTimestamp != nil && p.DeletionGracePeriodSeconds != nil && *p.DeletionGracePeriodSeconds <= graceSec {
			return nil
		}
		uid := p.UID
		err := pods.Delete(ctx, p.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &graceSec,
			Preconditions:      &metav1.Preconditions{UID: &uid},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("deleting pod %s: %w", p.Name, err)
		}
		return nil
	}
}

// drainPodWatch consumes w until no pod in left remains (true), the watch ends (false) or ctx
// is done.
func drainPodWatch(ctx context.Context, w watch.Interface, left map[types.UID]bool, deletePod func(*corev1.Pod) error) (bool, error) {
	for {
		select {
		case <-ctx.Done():
			return false, fmt.Errorf("waiting for %d pod(s) to go: %w", len(left), ctx.Err())
		case ev, ok := <-w.ResultChan():
			if !ok {
				return false, nil
			}
			p, isPod := ev.Object.(*corev1.Pod)
			switch {
			case ev.Type == watch.Error:
				return false, nil
			case !isPod:
				continue
			case ev.Type == watch.Deleted:
				delete(left, p.UID)
			case ev.Type == watch.Added || ev.Type == watch.Modified:
				left[p.UID] = true
				if err := deletePod(p); err != nil {
					return false, err
				}
			}
			if len(left) == 0 {
				return true, nil
			}
		}
	}
}

// StartBoundPodRun is StartPodRun for a pod that exists already (a warm pod an acquire bound,
// labelled with the run's id): it creates only the run's Secret, owned by the pod, or finds it
// made for the run (a redelivery). The pod's run-id label must be the Secret's.
func StartBoundPodRun(ctx context.Context, cs kubernetes.Interface, secret *corev1.Secret, pod *corev1.Pod) (CreatedRun, error) {
	if pod == nil || secret == nil || pod.UID == "" {
		return CreatedRun{}, fmt.Errorf("creating run: nil Pod or Secret, or a Pod without uid: %w", ErrInvalidObject)
	}
	runID := pod.Labels[LabelRunID]
	if runID == "" || secret.Labels[LabelRunID] != runID || secret.Namespace != pod.Namespace {
		return CreatedRun{}, fmt.Errorf("creating run %s: the Secret is not of the pod's run: %w", objRef("Pod", pod.Namespace, pod.Name), ErrInvalidObject)
	}
	sp := createRunSecret(ctx, cs.CoreV1().Secrets(pod.Namespace), secret, runID, secretOwner("v1", "Pod", pod.Name, pod.UID))
	if sp.err != nil {
		return CreatedRun{}, sp.err
	}
	run := CreatedRun{JobUID: pod.UID, adopted: sp.created}
	run.namespace, run.secretName, run.apiVersion, run.kind, run.name = pod.Namespace, secret.Name, "v1", "Pod", pod.Name
	return run, nil
}
