// Package workload is a run's workload in the cluster, one implementation per backend: a Job
// (backend job), kubeclip's own bare Pod (pod) and agent-sandbox's Sandbox (sandbox-cr). Each
// says how its workload is created, which of the objects the run-watcher sees are the run's,
// how it is deleted, and how the ones kubeclip manages are found again. For chooses the
// implementation from a lease's backend, once; no other code switches on the backend.
//
// The shape is kueue's jobframework.GenericJob: one small interface every kind of workload
// implements, so the dispatcher, its reconcile pass and the run-watcher treat a Sandbox exactly
// as they treat a Job. Suspend and resume (a reusable lease's pod deleted, its volume kept) join
// the interface the same way: pod does them itself (reuse.go), sandbox-cr through
// agent-sandbox's operatingMode (sandbox.go).
//
// What a Kubernetes error means is not decided here: errors keep the API server's status
// (wrapped with %w) for k8s.Meaning, except the one answer only a backend can give (the
// cluster does not serve the Sandbox API), which is already a terminal backend_unavailable.
package workload

import (
	"context"
	"fmt"
	"slices"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// Workload is one backend's run workload.
type Workload interface {
	// Backend is the backend it implements.
	Backend() policy.Backend
	// Kind is the workload's Kubernetes kind, for logs: Job, Pod, Sandbox.
	Kind() string

	// Create creates the run's Secret and workload under spec's names, idempotently (a
	// redelivered dispatch finds them and reports Existed); see k8s.StartJobRun for the order
	// and what a failure leaves behind. The Secret is owned by the workload once
	// Created.AdoptSecret returned.
	Create(ctx context.Context, spec policy.RunSpec, secret *corev1.Secret) (Created, error)

	// Observe picks what the run's verdict reads out of what the run-watcher's informers hold
	// of the run in its namespace (every Job and pod labelled with it): the Job (nil for a
	// backend without one, so a Job that is not the run's never decides it) and the run's
	// newest pod (nil before it exists).
	Observe(jobs []*batchv1.Job, pods []*corev1.Pod) (*batchv1.Job, *corev1.Pod)

	// Delete deletes the run's workload and returns once its pods are gone (their containers
	// stopped), with opts' grace period; a workload already gone is success.
	Delete(ctx context.Context, namespace, name string, opts k8s.RunDeleteOptions) error
	// Discard starts deleting the workload (and with it its pods) and does not wait. uid, when
	// set, limits it to that incarnation; gone already, or replaced by another incarnation,
	// is success.
	Discard(ctx context.Context, namespace, name string, uid types.UID) error
	// List hands each the metadata of every workload of this backend kubeclip manages, in
	// every namespace (the dispatcher's reconcile pass), pageSize at a time (listPages); none
	// where the cluster does not serve its API. An error of each stops the list and is
	// returned as it is.
	List(ctx context.Context, pageSize int64, each func(*metav1.PartialObjectMetadata) error) error
	// Exists reports whether the workload is still in the cluster, being deleted or not. The
	// run-watcher asks before it ends a run it saw no Job or pod of: a Sandbox waits for its
	// controller to make its pod. It lists (by name) rather than gets, so the run-watcher's
	// read-only list and watch suffice.
	Exists(ctx context.Context, namespace, name string) (bool, error)

	// Warmable reports whether a warm pod (policy.RenderWarmPod: a bare pod, sandboxd unbound,
	// made ahead of demand) can be this backend's workload. The dispatcher's warm pools serve
	// only the acquires whose workload says so: a warm pod given to a backend that cannot take
	// one would be a run of the wrong kind (no Job, no Sandbox).
	Warmable() bool

	// Reuse is nil when the backend keeps reusable leases (reuse.go; sandbox.go where the
	// cluster serves agent-sandbox's v1beta1), else the terminal backend_unavailable naming
	// config.backend a reusable acquire fails with, before anything is created.
	Reuse() error
	// ClaimName is the name of the volume claim of the reusable lease whose workload is name:
	// the lease record holds it from its dispatch on, so destroy, collection and the suspended
	// event name the real claim. Create makes the claim from RunSpec.VolumeClaim (pod: kubeclip
	// creates it; sandbox-cr: the Sandbox's controller does).
	ClaimName(name string) string
	// Suspend deletes a reusable lease's pod and returns once it is gone; its volume claim and
	// Secret stay for a resume.
	Suspend(ctx context.Context, namespace, name string, opts k8s.RunDeleteOptions) error
	// Resume makes sure a reusable lease has a pod on its claim, ready to run commands: the
	// pod it has, or a new one as Create made it. It reports whether it made one, and the
	// ready pod's IP.
	Resume(ctx context.Context, namespace, name, claim string) (Resumed, error)
}

// Resumed is what a resume left the lease with.
type Resumed struct {
	// Made: the resume made the pod (a suspended lease's, or one that had ended).
	Made bool
	// PodIP is the ready pod's IP. The dispatcher names it on the lease's resumed event, from
	// which the credential broker binds the grants of the lease's runs to the pod: the
	// run-watcher's status events name only the pod of the lease's first generation.
	PodIP string
}

// Deps is what the backends reach the cluster with.
type Deps struct {
	// Clientset reaches Jobs, pods and Secrets, and discovers the Sandbox API.
	Clientset kubernetes.Interface
	// Dynamic reaches Sandboxes; only Backend, Kind and Observe do without it.
	Dynamic dynamic.Interface
	// Metadata lists the workloads kubeclip manages, their metadata only; only List needs it.
	Metadata metadata.Interface
}

// All is every backend's workload, in the order the reconcile pass visits them.
func All(d Deps) []Workload {
	return []Workload{jobWorkload{d}, podWorkload{d}, sandboxWorkload{d}}
}

// For is the workload of backend: the one place a backend is chosen. A backend no
// implementation knows (a lease record written by something else) is a terminal internal error.
func For(backend policy.Backend, d Deps) (Workload, error) {
	for _, w := range All(d) {
		if w.Backend() == backend {
			return w, nil
		}
	}
	return nil, events.Terminalf(events.CodeInternal, "backend", "the lease's backend %q has no workload", backend)
}

// Created is a run whose workload was created (or found, Existed).
type Created struct {
	// Owner references the workload; what belongs to the run (its scoped egress policy) is
	// owned by it and goes with it.
	Owner metav1.OwnerReference
	// Existed is true when the workload was already there for this run.
	Existed bool

	run     k8s.CreatedRun
	cs      kubernetes.Interface
	adopted bool // Create adopted the Secret already
	// adopt, when set, adopts the Secret instead of run (a reusable lease's claim owns it), or
	// creates it owned by the workload (a warm pod's, StartBound).
	adopt func(ctx context.Context) error
}

// AdoptSecret makes the workload the owner of the run's Secret (k8s.CreatedRun.AdoptSecret);
// it is idempotent. The dispatcher calls it once `created` is out: the pod starts without it.
func (c Created) AdoptSecret(ctx context.Context) error {
	switch {
	case c.adopted:
		return nil
	case c.adopt != nil:
		return c.adopt(ctx)
	}
	return c.run.AdoptSecret(ctx, c.cs)
}

func created(run k8s.CreatedRun, cs kubernetes.Interface, apiVersion, kind, name string) Created {
	return Created{
		Owner:   policy.OwnerReference(apiVersion, kind, name, run.JobUID),
		Existed: run.Existed,
		run:     run,
		cs:      cs,
	}
}

// discardOptions deletes in the background: the workload goes at once, the garbage collector
// deletes its pods, and nothing waits for it.
func discardOptions(uid types.UID) metav1.DeleteOptions {
	prop := metav1.DeletePropagationBackground
	opts := metav1.DeleteOptions{PropagationPolicy: &prop}
	if uid != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	return opts
}

// discarded is the outcome of a Discard's delete: gone already, or another incarnation under
// the name (the UID precondition failed), is success.
func discarded(err error, uid types.UID, kind, namespace, name string) error {
	if k8s.Meaning(k8s.OpDelete, err) == nil || (uid != "" && apierrors.IsConflict(err)) {
		return nil
	}
	return fmt.Errorf("deleting %s %s/%s: %w", kind, namespace, name, err)
}

// newest is the pod created last.
func newest(pods []*corev1.Pod) *corev1.Pod {
	if len(pods) == 0 {
		return nil
	}
	return slices.MaxFunc(pods, func(a, b *corev1.Pod) int {
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
}

// DefaultListPageSize is how many workloads one page of List holds: client-go's pager's default,
// and small enough (metadata only, a few KiB each) that a page is a few MiB at most.
const DefaultListPageSize = 500

// maxListRestarts bounds how often one List starts again after its continue token expired.
const maxListRestarts = 3

// listFunc is one page's LIST (a metadata client's List).
type listFunc func(ctx context.Context, opts metav1.ListOptions) (*metav1.PartialObjectMetadataList, error)

// listPages lists what kubeclip labelled as its own, in every namespace, metadata only, and
// hands each object to each before it asks for the next page: whatever the cluster's size, the
// caller holds one page of metadata, not every object in full (the dispatcher's reconcile pass
// held 10,000 whole pods and grew to 410 MiB). The pages are one consistent snapshot; a continue
// token that expired meanwhile (410 Gone: etcd compacted past the snapshot while the pass took
// its time) starts the list again from the beginning, so objects already seen are handed again
// (each must be idempotent; the reconcile pass is), at most maxListRestarts times.
func listPages(ctx context.Context, resource string, list listFunc, pageSize int64, each func(*metav1.PartialObjectMetadata) error) error {
	if pageSize <= 0 {
		pageSize = DefaultListPageSize
	}
	opts := metav1.ListOptions{LabelSelector: policy.ManagedBySelector, Limit: pageSize}
	restarts := 0
	for {
		page, err := list(ctx, opts)
		switch {
		case err == nil:
		case opts.Continue != "" && apierrors.IsResourceExpired(err) && restarts < maxListRestarts:
			restarts++
			opts.Continue = ""
			continue
		default:
			return fmt.Errorf("listing %s: %w", resource, err)
		}
		for i := range page.Items {
			if err := each(&page.Items[i]); err != nil {
				return err
			}
		}
		if page.Continue == "" {
			return nil
		}
		opts.Continue = page.Continue
	}
}

// byName lists the one object called name that kubeclip labelled as its own.
func byName(name string) metav1.ListOptions {
	return metav1.ListOptions{LabelSelector: policy.ManagedBySelector, FieldSelector: "metadata.name=" + name}
}
