package execsvc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// DefaultDaemonPort is sandboxd's TLS port in an exec-capable pod.
const DefaultDaemonPort = 7070

// runIndex indexes pods by their run: the RunRef.Key of their company-id and run-id labels, so
// two companies' runs with the same run id never meet.
const runIndex = "run"

// PodWatcherOptions configure a PodWatcher.
type PodWatcherOptions struct {
	// Clientset reads pods cluster-wide; required.
	Clientset kubernetes.Interface
	Logger    zerolog.Logger
	// DaemonPort is sandboxd's TLS port (default DefaultDaemonPort).
	DaemonPort int
}

// PodWatcher finds lease pods from a pod informer over the whole cluster, filtered to the pods
// kubeclip manages and indexed by run. Waiting for readiness is watch-driven: every pod change
// wakes the waiters, nothing polls the API server.
type PodWatcher struct {
	opts    PodWatcherOptions
	pods    cache.Indexer
	synced  chan struct{}
	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every pod change
}

var _ Pods = (*PodWatcher)(nil)

// NewPodWatcher validates opts; Run starts watching.
func NewPodWatcher(opts PodWatcherOptions) (*PodWatcher, error) {
	if opts.Clientset == nil {
		return nil, errors.New("execsvc: PodWatcherOptions.Clientset is required")
	}
	if opts.DaemonPort == 0 {
		opts.DaemonPort = DefaultDaemonPort
	}
	return &PodWatcher{opts: opts, synced: make(chan struct{}), changed: make(chan struct{})}, nil
}

// Run watches pods until ctx ends. Synced is closed once the first list is in.
func (w *PodWatcher) Run(ctx context.Context) error {
	factory := informers.NewSharedInformerFactoryWithOptions(w.opts.Clientset, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.LabelSelector = policy.LabelManagedBy + "=" + policy.ManagedBy
		}),
		informers.WithTransform(slimPod),
	)
	inf := factory.Core().V1().Pods().Informer()
	if err := inf.AddIndexers(cache.Indexers{runIndex: indexByRun}); err != nil {
		return fmt.Errorf("adding the run index: %w", err)
	}
	wake := func(any) { w.wake() }
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: wake, UpdateFunc: func(_, o any) { w.wake() }, DeleteFunc: wake,
	}); err != nil {
		return fmt.Errorf("watching pods: %w", err)
	}
	w.pods = inf.GetIndexer()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	close(w.synced)
	w.opts.Logger.Info().Msg("pod cache synced")
	<-ctx.Done()
	return nil
}

// Synced is closed once the pod cache holds the first full list.
func (w *PodWatcher) Synced() <-chan struct{} { return w.synced }

func (w *PodWatcher) wake() {
	w.mu.Lock()
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}

// Ready implements Pods.
func (w *PodWatcher) Ready(ctx context.Context, ref events.RunRef, rec lease.Record) (Pod, error) {
	select {
	case <-w.synced:
	case <-ctx.Done():
		return Pod{}, ctx.Err()
	}
	for {
		w.mu.Lock()
		changed := w.changed
		w.mu.Unlock()
		if p := w.find(ref, rec); p != nil && podReady(p) {
			return w.pod(p), nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return Pod{}, ctx.Err()
		}
	}
}

// Current implements Pods.
func (w *PodWatcher) Current(ref events.RunRef, rec lease.Record) (Pod, bool) {
	select {
	case <-w.synced:
	default:
		return Pod{}, false
	}
	p := w.find(ref, rec)
	if p == nil || p.DeletionTimestamp != nil {
		return Pod{}, false
	}
	return w.pod(p), true
}

// find returns the pod of the lease: in the lease's namespace, named after its workload (a
// bare pod is the workload; a Sandbox's pod is named after the Sandbox), labelled with its
// company and run.
func (w *PodWatcher) find(ref events.RunRef, rec lease.Record) *corev1.Pod {
	objs, err := w.pods.ByIndex(runIndex, ref.Key())
	if err != nil {
		return nil
	}
	for _, o := range objs {
		if p, ok := o.(*corev1.Pod); ok && p.Namespace == rec.Namespace && p.Name == rec.WorkloadName {
			return p
		}
	}
	return nil
}

func (w *PodWatcher) pod(p *corev1.Pod) Pod {
	addr := ""
	if p.Status.PodIP != "" {
		addr = net.JoinHostPort(p.Status.PodIP, strconv.Itoa(w.opts.DaemonPort))
	}
	return Pod{Namespace: p.Namespace, Name: p.Name, UID: string(p.UID), Addr: addr}
}

// podReady: running, ready, addressable and not being deleted.
func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func indexByRun(obj any) ([]string, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, nil
	}
	ref := events.Ref(m.GetLabels()[policy.LabelCompanyID], m.GetLabels()[policy.LabelRunID])
	if ref.CompanyID == "" || ref.RunID == "" {
		return nil, nil
	}
	return []string{ref.Key()}, nil
}

// slimPod keeps what the service reads of a pod: its identity, labels and readiness. A pod's
// spec (commands, env references, volumes) is most of its size and never needed.
func slimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, Labels: p.Labels,
			ResourceVersion: p.ResourceVersion, DeletionTimestamp: p.DeletionTimestamp,
		},
		Status: corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, Conditions: p.Status.Conditions},
	}, nil
}
