package runwatch

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	k8sfake "k8s.io/client-go/kubernetes/fake"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// statusWatch is the tracker's publisher, telling onTerminal about the run's terminal status
// before it is published.
type statusWatch struct {
	publisher
	onTerminal func()
}

func (p statusWatch) Publish(ctx context.Context, ev events.Event, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if st, ok := ev.(events.RunStatusEvent); ok && (st.Phase == events.PhaseSucceeded || st.Phase == events.PhaseFailed) {
		p.onTerminal()
	}
	return p.publisher.Publish(ctx, ev, opts...)
}

// The log's tail is read (the follower stopped, k8s.ReadLogs) while the terminal status is
// published, not after it: bench (c), container terminated → result, waits on the final read,
// and the status publish ahead of it was one more JetStream round trip on the way. Whether the
// follower ran before the end (a long agent) or the pod is first seen terminated (a short one).
func TestTrackerReadsTheLogTailBeforeItPublishesTheTerminalStatus(t *testing.T) {
	for _, tc := range []struct {
		name        string
		seenRunning bool
	}{{"follower running at the end", true}, {"pod first seen terminated", false}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			jobs, pods := withInformerCaches(t, h)
			const runID = "run-tail"
			h.lease(t, runID)
			running := pod(corev1.PodRunning, corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}, startedAgo(time.Second))
			running.Labels = runLabels(runID)
			h.d.opts.Clientset = k8sfake.NewClientset(running)
			tr := newTracker(h.d, testNamespace, events.Ref(testCompany, runID), func() {})
			var stopRequested, published bool
			h.d.pub = statusWatch{publisher: h.d.pub, onTerminal: func() {
				published = true
				stopRequested = tr.follow != nil && tr.follow.stopRequested()
			}}
			t.Cleanup(func() {
				if tr.follow != nil {
					tr.follow.stopAndWait()
				}
			})
			j := job(active)
			j.Labels = runLabels(runID)
			if err := jobs.Add(j); err != nil {
				t.Fatal(err)
			}
			if tc.seenRunning {
				if err := pods.Add(running); err != nil {
					t.Fatal(err)
				}
				if err := tr.step(t.Context()); err != nil {
					t.Fatalf("step() with the container running: %v", err)
				}
				if tr.follow == nil {
					t.Fatal("no follower while the container runs")
				}
			}

			done := pod(corev1.PodSucceeded, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}, startedAgo(time.Second))
			done.Labels = runLabels(runID)
			if err := pods.Update(done); err != nil {
				t.Fatal(err)
			}
			if err := tr.step(t.Context()); err != nil {
				t.Fatalf("step() with the container terminated: %v", err)
			}
			if !published {
				t.Fatal("no terminal status was published")
			}
			if !stopRequested {
				t.Error("the terminal status was published before a follower was stopped to read the log's tail")
			}
		})
	}
}
