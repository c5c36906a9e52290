package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

// podWatch is the bench's own view of the runs' pods: an informer, on the bench's client,
// independent of the run-watcher's, that records when it first saw each run's agent container
// running and terminated.
type podWatch struct {
	factory informers.SharedInformerFactory

	mu      sync.Mutex
	runs    map[string]*podTimes
	changed chan struct{}
}

// podTimes is what the bench saw of a run's pod; times are receive times.
type podTimes struct {
	namespace, name string
	seen            time.Time // the pod was created (its first informer event)
	running         time.Time
	terminated      time.Time
	exitCode        int32
}

// startPodWatch starts the informer and waits for its cache; stop it with stop.
func startPodWatch(ctx context.Context, cs kubernetes.Interface) (*podWatch, error) {
	w := &podWatch{runs: map[string]*podTimes{}, changed: make(chan struct{})}
	w.factory = informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = policy.ManagedBySelector }))
	inf := w.factory.Core().V1().Pods().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.observe(obj, time.Now()) },
		UpdateFunc: func(_, obj any) { w.observe(obj, time.Now()) },
	}); err != nil {
		return nil, fmt.Errorf("adding the pod handler: %w", err)
	}
	w.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		w.factory.Shutdown()
		return nil, fmt.Errorf("syncing the bench's pod informer: %w", context.Cause(ctx))
	}
	return w, nil
}

// stop waits for the informer to end; the ctx given to startPodWatch must be done first.
func (w *podWatch) stop() { w.factory.Shutdown() }

func (w *podWatch) observe(obj any, at time.Time) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	runID := pod.Labels[policy.LabelRunID]
	if runID == "" {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	t, ok := w.runs[runID]
	if !ok {
		t = &podTimes{namespace: pod.Namespace, name: pod.Name, seen: at}
		w.runs[runID] = t
	}
	st := agentStatus(pod)
	if st == nil {
		return
	}
	changed := false
	if st.State.Running != nil && t.running.IsZero() {
		t.running, changed = at, true
	}
	if term := st.State.Terminated; term != nil && t.terminated.IsZero() {
		t.terminated, t.exitCode, changed = at, term.ExitCode, true
		if t.running.IsZero() {
			t.running = at // ran too briefly to be seen running
		}
	}
	if changed {
		close(w.changed)
		w.changed = make(chan struct{})
	}
}

func agentStatus(pod *corev1.Pod) *corev1.ContainerStatus {
	for i := range pod.Status.ContainerStatuses {
		if pod.Status.ContainerStatuses[i].Name == policy.AgentContainerName {
			return &pod.Status.ContainerStatuses[i]
		}
	}
	return nil
}

// seenBefore counts the runs whose pod the informer saw before t.
func (w *podWatch) seenBefore(runIDs []string, t time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, id := range runIDs {
		if p, ok := w.runs[id]; ok && p.seen.Before(t) {
			n++
		}
	}
	return n
}

// running waits until runID's agent container was seen running (or already terminated).
func (w *podWatch) running(ctx context.Context, runID string) (podTimes, error) {
	return w.waitFor(ctx, runID, "run", func(t podTimes) bool { return !t.running.IsZero() })
}

// terminated waits until runID's agent container was seen terminated.
func (w *podWatch) terminated(ctx context.Context, runID string) (podTimes, error) {
	return w.waitFor(ctx, runID, "end", func(t podTimes) bool { return !t.terminated.IsZero() })
}

func (w *podWatch) waitFor(ctx context.Context, runID, what string, done func(podTimes) bool) (podTimes, error) {
	for {
		w.mu.Lock()
		var seen podTimes
		if t, ok := w.runs[runID]; ok {
			seen = *t
		}
		changed := w.changed
		w.mu.Unlock()
		if done(seen) {
			return seen, nil
		}
		select {
		case <-ctx.Done():
			return seen, fmt.Errorf("waiting for the pod of run %s to %s: %w", runID, what, context.Cause(ctx))
		case <-changed:
		}
	}
}
