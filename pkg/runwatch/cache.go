package runwatch

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/runwatch/verdict"
)

// jobEventIndex indexes FailedCreate events by the namespace/name of their Job.
const jobEventIndex = "job"

// quotaEventSelector selects the events the Job controller records when it cannot create a
// Job's pod; a ResourceQuota refusal is one of them, and the only sign of it.
const quotaEventSelector = "reason=FailedCreate,involvedObject.kind=Job"

// runIndex indexes Jobs and Pods by their run: the RunRef.Key of their company-id and run-id
// labels, so two companies' runs with the same run id never meet.
const runIndex = "run"

// clusterCache is the informers' view of the cluster: kubeclip's Jobs and pods, indexed by run,
// and the Job controller's FailedCreate events, indexed by Job.
type clusterCache struct {
	jobs, pods cache.Indexer
	// jobEvents holds the Job controller's FailedCreate events, by Job; nil means none.
	jobEvents cache.Indexer
	factories []informers.SharedInformerFactory
}

// clusterHandlers are told what the informers see.
type clusterHandlers struct {
	// object is called for every add, update and delete of a managed Job or pod.
	object func(obj any)
	// jobEvent is called for every FailedCreate event of a Job.
	jobEvent func(obj any)
}

// newClusterCache builds the informers of the cluster's kubeclip objects with their indexes and
// handlers; start starts them.
func newClusterCache(cs kubernetes.Interface, h clusterHandlers) (*clusterCache, error) {
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = policy.LabelManagedBy + "=" + policy.ManagedBy
		}),
		informers.WithTransform(trimCached),
	)
	jobInf := factory.Batch().V1().Jobs().Informer()
	podInf := factory.Core().V1().Pods().Informer()
	for _, inf := range []cache.SharedIndexInformer{jobInf, podInf} {
		if err := inf.AddIndexers(cache.Indexers{runIndex: indexByRun}); err != nil {
			return nil, fmt.Errorf("adding run index: %w", err)
		}
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    h.object,
			UpdateFunc: func(_, obj any) { h.object(obj) },
			DeleteFunc: h.object,
		}); err != nil {
			return nil, fmt.Errorf("adding event handler: %w", err)
		}
	}

	// Events carry no labels of kubeclip's: their informer selects by field instead.
	eventFactory := informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = quotaEventSelector }),
		informers.WithTransform(stripManagedFields),
	)
	eventInf := eventFactory.Core().V1().Events().Informer()
	if err := eventInf.AddIndexers(cache.Indexers{jobEventIndex: indexByJob}); err != nil {
		return nil, fmt.Errorf("adding job index: %w", err)
	}
	if _, err := eventInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    h.jobEvent,
		UpdateFunc: func(_, obj any) { h.jobEvent(obj) },
	}); err != nil {
		return nil, fmt.Errorf("adding event handler: %w", err)
	}
	return &clusterCache{
		jobs: jobInf.GetIndexer(), pods: podInf.GetIndexer(), jobEvents: eventInf.GetIndexer(),
		factories: []informers.SharedInformerFactory{factory, eventFactory},
	}, nil
}

// start starts the informers and returns once their caches are in; they stop when ctx ends
// or stop is called.
func (c *clusterCache) start(ctx context.Context) error {
	for _, f := range c.factories {
		f.Start(ctx.Done())
	}
	for _, f := range c.factories {
		for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
			if !ok {
				c.stop()
				return fmt.Errorf("syncing the %v informer: %w", typ, context.Cause(ctx))
			}
		}
	}
	return nil
}

// stop shuts the informers down and waits for their handlers.
func (c *clusterCache) stop() {
	for _, f := range c.factories {
		f.Shutdown()
	}
}

// objects returns every Job and pod labelled with the run in namespace (the run's workload
// picks out what its verdict reads: workload.Workload.Observe).
func (c *clusterCache) objects(ref events.RunRef, namespace string) ([]*batchv1.Job, []*corev1.Pod) {
	var jobs []*batchv1.Job
	if objs, err := c.jobs.ByIndex(runIndex, ref.Key()); err == nil {
		for _, o := range objs {
			if j, ok := o.(*batchv1.Job); ok && j.Namespace == namespace {
				jobs = append(jobs, j)
			}
		}
	}
	var pods []*corev1.Pod
	if objs, err := c.pods.ByIndex(runIndex, ref.Key()); err == nil {
		for _, o := range objs {
			if p, ok := o.(*corev1.Pod); ok && p.Namespace == namespace {
				pods = append(pods, p)
			}
		}
	}
	return jobs, pods
}

// gone reports whether neither a Job nor a pod of the run is left in namespace.
func (c *clusterCache) gone(ref events.RunRef, namespace string) bool {
	jobs, pods := c.objects(ref, namespace)
	return len(jobs) == 0 && len(pods) == 0
}

// runOfJobEvent is the run of the Job a FailedCreate event is about.
func (c *clusterCache) runOfJobEvent(obj any) (events.RunRef, bool) {
	ev, ok := obj.(*corev1.Event)
	if !ok {
		return events.RunRef{}, false
	}
	o, exists, err := c.jobs.GetByKey(ev.InvolvedObject.Namespace + "/" + ev.InvolvedObject.Name)
	if err != nil || !exists {
		return events.RunRef{}, false
	}
	if job, ok := o.(*batchv1.Job); ok {
		return runOf(job)
	}
	return events.RunRef{}, false
}

// quotaRefusal reports whether the Job controller recorded that a ResourceQuota refused to let
// this Job (this incarnation: by UID) create its pod, and which quota.
func (c *clusterCache) quotaRefusal(job *batchv1.Job) (k8s.Quota, bool) {
	if c.jobEvents == nil {
		return k8s.Quota{}, false
	}
	objs, err := c.jobEvents.ByIndex(jobEventIndex, job.Namespace+"/"+job.Name)
	if err != nil {
		return k8s.Quota{}, false
	}
	for _, o := range objs {
		ev, ok := o.(*corev1.Event)
		if !ok || ev.InvolvedObject.UID != job.UID {
			continue
		}
		if q, ok := k8s.QuotaFromMessage(ev.Message); ok {
			return q, true
		}
	}
	return k8s.Quota{}, false
}

func indexByJob(obj any) ([]string, error) {
	ev, ok := obj.(*corev1.Event)
	if !ok {
		return nil, nil
	}
	return []string{ev.InvolvedObject.Namespace + "/" + ev.InvolvedObject.Name}, nil
}

func indexByRun(obj any) ([]string, error) {
	m, err := metaOf(obj)
	if err != nil {
		return nil, nil //nolint:nilerr // objects without metadata are not indexed
	}
	if ref, ok := runOf(m); ok {
		return []string{ref.Key()}, nil
	}
	return nil, nil
}

// runOf is the run an object's labels name.
func runOf(m metav1.Object) (events.RunRef, bool) {
	ref := events.Ref(m.GetLabels()[policy.LabelCompanyID], m.GetLabels()[policy.LabelRunID])
	return ref, ref.CompanyID != "" && ref.RunID != ""
}

func metaOf(obj any) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no object metadata", obj)
	}
	return m, nil
}

// trimCached keeps of a Job or pod what the run-watcher reads (verdict.TrimJob,
// verdict.TrimPod): an idle run-watcher holds one cached pod per live run, and most of a pod is
// its spec.
func trimCached(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		p := verdict.TrimPod(o)
		p.Labels = runLabelsOf(p.Labels)
		return p, nil
	case *batchv1.Job:
		j := verdict.TrimJob(o)
		j.Labels = runLabelsOf(j.Labels)
		return j, nil
	}
	return stripManagedFields(obj)
}

// runLabelsOf keeps of an object's labels the two that name its run (runOf): the informers
// select by the others on the server, and nothing here reads them.
func runLabelsOf(labels map[string]string) map[string]string {
	kept := make(map[string]string, 2)
	for _, k := range []string{policy.LabelCompanyID, policy.LabelRunID} {
		if v, ok := labels[k]; ok {
			kept[k] = v
		}
	}
	return kept
}

// stripManagedFields drops managedFields from cached objects: the watcher never reads them and
// they are often the largest part of an object.
func stripManagedFields(obj any) (any, error) {
	if m, ok := obj.(metav1.Object); ok {
		m.SetManagedFields(nil)
	}
	return obj, nil
}
