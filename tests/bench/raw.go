package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"github.com/oklog/ulid/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// The bench's own client is not throttled client-side: its numbers are the API server's.
const (
	rawQPS   = 5000
	rawBurst = 10000
)

const (
	// benchFieldManager owns what the bench writes itself.
	benchFieldManager = "kubeclip-bench"
	// rawManagedBy replaces the managed-by label on the raw runs' Secret, Job and pod template,
	// so the run-watcher (which selects managed-by=kubeclip) does not track them: the raw
	// creates must not add work to the pipeline they are compared with.
	rawManagedBy = "kubeclip-bench"
)

// rawKube is the bench's own Kubernetes access, for the raw side of each comparison and for
// watching and cleaning up.
type rawKube struct {
	cs     kubernetes.Interface
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func newRawKube(kubeconfig string) (*rawKube, error) {
	cfg, err := k8s.RESTConfig(kubeconfig, rawQPS, rawBurst)
	if err != nil {
		return nil, err
	}
	cfg = k8s.ForComponent(cfg, "bench")
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building the bench's clientset: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building the bench's dynamic client: %w", err)
	}
	return &rawKube{cs: cs, dyn: dyn, mapper: k8s.NewRESTMapper(cs.Discovery())}, nil
}

// rendered is one run's Secret and Job exactly as the dispatcher renders them (pkg/lease and
// pkg/policy), except for the managed-by label (rawManagedBy) and a suspended Job: the create
// is the same request, but the Job controller starts no pod, so the raw side does not double
// the pods the node has to run (it has CPU for about 20 agent pods at once).
type rendered struct {
	plan   lease.Plan
	secret *corev1.Secret
	job    *batchv1.Job
}

// render renders req's run. The Secret has no owner, as k8s.StartJobRun creates it (the owner
// is patched in once the Job has a UID).
func render(req events.AcquireRequest) (rendered, error) {
	plan, err := lease.New(req, time.Now(), benchOperator())
	if err != nil {
		return rendered{}, fmt.Errorf("planning raw run %s: %w", req.RunID, err)
	}
	spec := plan.RunSpec(policy.WorkloadName(ulid.Make()))
	token, err := policy.NewBootstrapToken(rand.Reader)
	if err != nil {
		return rendered{}, err
	}
	env := policy.BuildAdapterEnv(plan.Adapter, func(string) (string, bool) { return "", false })
	owner := policy.OwnerReference("batch/v1", "Job", spec.WorkloadName, "set-on-create")
	secret, err := policy.RenderSecret(spec, owner, token, env)
	if err != nil {
		return rendered{}, fmt.Errorf("rendering raw run %s's Secret: %w", req.RunID, err)
	}
	secret.OwnerReferences = nil
	job := policy.RenderJob(spec)
	suspend := true
	job.Spec.Suspend = &suspend
	for _, labels := range []map[string]string{secret.Labels, job.Labels, job.Spec.Template.Labels} {
		labels[policy.LabelManagedBy] = rawManagedBy
	}
	return rendered{plan: plan, secret: secret, job: job}, nil
}

// renderTenant renders plan's tenant objects in apply order, the Namespace labelled with the
// bench session so cleanup finds it.
func renderTenant(plan lease.Plan, session string) ([]*unstructured.Unstructured, error) {
	t, err := plan.Tenant()
	if err != nil {
		return nil, fmt.Errorf("rendering tenant %s: %w", plan.Namespace, err)
	}
	objs, err := t.Objects()
	if err != nil {
		return nil, fmt.Errorf("rendering tenant %s: %w", plan.Namespace, err)
	}
	labels := objs[0].GetLabels()
	labels[sessionLabel] = session
	objs[0].SetLabels(labels)
	return objs, nil
}

// createRun creates the Secret, then the Job: the two creates the dispatcher's run rides on.
func (r *rawKube) createRun(ctx context.Context, ro rendered) error {
	opts := metav1.CreateOptions{FieldManager: benchFieldManager}
	if err := createRetryingConflicts(func() error {
		_, err := r.cs.CoreV1().Secrets(ro.secret.Namespace).Create(ctx, ro.secret, opts)
		return err
	}); err != nil {
		return fmt.Errorf("creating Secret %s/%s: %w", ro.secret.Namespace, ro.secret.Name, err)
	}
	if err := createRetryingConflicts(func() error {
		_, err := r.cs.BatchV1().Jobs(ro.job.Namespace).Create(ctx, ro.job, opts)
		return err
	}); err != nil {
		return fmt.Errorf("creating Job %s/%s: %w", ro.job.Namespace, ro.job.Name, err)
	}
	return nil
}

// createRetryingConflicts runs a raw create again while the API server refuses it with Conflict,
// as kubeclip's workers do (k8s.Meaning): a ResourceQuota's admission refuses a create with
// Conflict when another create in the namespace updated the quota's usage at the same moment,
// and the raw side must not fail a phase on what kubeclip's side rides out.
func createRetryingConflicts(create func() error) error {
	return retry.OnError(retry.DefaultRetry, apierrors.IsConflict, create)
}

// apply server-side applies objs one by one, in order, as the tenant-worker does.
func (r *rawKube) apply(ctx context.Context, objs []*unstructured.Unstructured) error {
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		m, err := r.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("mapping %s: %w", gvk, err)
		}
		var ri dynamic.ResourceInterface = r.dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = r.dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
		}
		if _, err := ri.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: benchFieldManager, Force: true}); err != nil {
			return fmt.Errorf("applying %s %s/%s: %w", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
		}
	}
	return nil
}
