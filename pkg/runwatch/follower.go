package runwatch

import (
	"context"
	"errors"
	"sync"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/pkg/k8s"
)

// follower runs k8s.FollowLogs for one pod in its own goroutine, handing every line to the run's
// journal.
type follower struct {
	cancel  context.CancelFunc
	mu      sync.Mutex
	stopReq bool
	doneCh  chan struct{}
	lastErr error
}

// followTarget is the container a follower reads.
type followTarget struct {
	clientset kubernetes.Interface
	namespace string
	pod       string
	container string
}

// startFollower follows target's log from the journal's cursor into the journal until the
// container ends, ctx ends or stop is called; done is called when it has returned (the tracker
// looks at the run again then). A gap in the log (k8s.LogGap) is logged and told to obs, if it
// is a LogGapObserver.
func startFollower(ctx context.Context, target followTarget, j *journal, log zerolog.Logger, obs Observer, done func()) *follower {
	fctx, cancel := context.WithCancel(ctx)
	f := &follower{cancel: cancel, doneCh: make(chan struct{})}
	// Lines are added with the run's context, not the follow stream's: a chunk the flush timer
	// publishes outlives the stream it was read from.
	add := func(line k8s.Line) error { return j.add(ctx, line) }
	gapObs, _ := obs.(LogGapObserver)
	gap := func(g k8s.LogGap) {
		log.Warn().Time("after", g.After).Time("next", g.Next).
			Msg("the kubelet no longer serves the last log line read: lines printed between after and next may be lost (its log rotated before they were read; raise the kubelet's containerLogMaxSize)")
		if gapObs != nil {
			gapObs.LogGap()
		}
	}
	go func() {
		// Deferred calls run last first: the follower is finished (doneCh closed) before done
		// pokes the tracker, so a tracker that looks at once sees it finished.
		defer done()
		defer close(f.doneCh)
		cur, err := k8s.FollowLogs(fctx, target.clientset, target.namespace, target.pod, target.container, j.cursor(), add, k8s.FollowOptions{Logger: log, OnGap: gap})
		if errors.Is(err, context.Canceled) && ctx.Err() == nil && f.stopRequested() {
			// The run is over and the follow stream was cut short rather than waiting for the
			// kubelet to notice the exit: read the tail once, without following.
			_, err = k8s.ReadLogs(ctx, target.clientset, target.namespace, target.pod, target.container, cur, add, gap)
		}
		f.mu.Lock()
		f.lastErr = err
		f.mu.Unlock()
	}()
	return f
}

func (f *follower) stop() {
	f.mu.Lock()
	already := f.stopReq
	f.stopReq = true
	f.mu.Unlock()
	if !already {
		f.cancel()
	}
}

func (f *follower) stopRequested() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.stopReq
}

func (f *follower) stopAndWait() {
	f.cancel()
	<-f.doneCh
}

func (f *follower) finished() bool {
	select {
	case <-f.doneCh:
		return true
	default:
		return false
	}
}

func (f *follower) err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastErr
}

// containerStarted reports whether the container has run, so its log can be read.
func containerStarted(pod *corev1.Pod, container string) bool {
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == container {
			return st.State.Running != nil || st.State.Terminated != nil || st.LastTerminationState.Terminated != nil
		}
	}
	return false
}
