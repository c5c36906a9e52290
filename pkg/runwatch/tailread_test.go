package runwatch

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	k8sfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	fakerest "k8s.io/client-go/rest/fake"

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

// slowTail is a clientset whose non-follow log reads (the tracker's final read of a run's
// tail) answer after delay, as the API server's do on a busy node (bench (c): 15–106 ms p50).
type slowTail struct {
	*k8sfake.Clientset
	delay time.Duration
}

func (c slowTail) CoreV1() typedcorev1.CoreV1Interface {
	return slowTailCore{CoreV1Interface: c.Clientset.CoreV1(), delay: c.delay}
}

type slowTailCore struct {
	typedcorev1.CoreV1Interface
	delay time.Duration
}

func (c slowTailCore) Pods(ns string) typedcorev1.PodInterface {
	return slowTailPods{PodInterface: c.CoreV1Interface.Pods(ns), delay: c.delay}
}

type slowTailPods struct {
	typedcorev1.PodInterface
	delay time.Duration
}

func (p slowTailPods) GetLogs(string, *corev1.PodLogOptions) *rest.Request {
	c := &fakerest.RESTClient{
		NegotiatedSerializer: scheme.Codecs.WithoutConversion(),
		Client: fakerest.CreateHTTPClient(func(req *http.Request) (*http.Response, error) {
			if req.URL.Query().Get("follow") != "true" {
				select {
				case <-time.After(p.delay):
				case <-req.Context().Done():
					return nil, req.Context().Err()
				}
			}
			return &http.Response{StatusCode: http.StatusOK, Body: io.NopCloser(strings.NewReader("2026-11-26T08:00:00.000000000Z last line\n"))}, nil
		}),
	}
	return c.Request()
}

// A run's result goes out as soon as the log's tail is read. The step that sees the run end
// stops the follower and returns (a step worker serves every run); the follower pokes the
// tracker once it has read the tail. That poke used to come before the follower said it was
// finished (follower.go called done before it closed doneCh): a tracker that looked at once saw
// the follower still running and slept until the run's next event (the Job's own status, a
// second or so later), bench (c)'s p99 of 1.3 s.
func TestTrackerPublishesTheResultWhenTheTailIsRead(t *testing.T) {
	h := newHarness(t)
	jobs, pods := withInformerCaches(t, h)
	const runID = "run-tail-result"
	h.lease(t, runID)
	running := pod(corev1.PodRunning, corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}, startedAgo(time.Second))
	running.Labels = runLabels(runID)
	h.d.opts.Clientset = slowTail{Clientset: k8sfake.NewClientset(running), delay: 200 * time.Millisecond}
	// The follower's pokes, and whether it said it was finished when it poked.
	pokes := make(chan bool, 16)
	var tr *tracker
	tr = newTracker(h.d, testNamespace, events.Ref(testCompany, runID), func() {
		pokes <- tr.follow != nil && tr.follow.finished()
	})
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
	if err := pods.Add(running); err != nil {
		t.Fatal(err)
	}
	if err := tr.step(t.Context()); err != nil {
		t.Fatalf("step() with the container running: %v", err)
	}
	done := pod(corev1.PodSucceeded, corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}, startedAgo(time.Second))
	done.Labels = runLabels(runID)
	if err := pods.Update(done); err != nil {
		t.Fatal(err)
	}
	if err := tr.step(t.Context()); err != nil {
		t.Fatalf("step() with the container terminated: %v", err)
	}
	// The tail read answers after 200 ms; the follower's poke must then find it finished, so
	// the step it brings publishes the result.
	select {
	case finished := <-pokes:
		if !finished {
			t.Fatal("the follower poked its tracker before it was finished: the result would wait for the run's next event")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the follower never poked its tracker after the tail read")
	}
	if err := tr.step(t.Context()); err != nil {
		t.Fatalf("step() after the follower's poke: %v", err)
	}
	if got := runEvents[events.RunResultEvent](t, h, runID, events.KindResult); len(got) != 1 || !tr.done {
		t.Fatalf("after the follower's poke: %d results, done %v; want the result published", len(got), tr.done)
	}
	logs := runEvents[events.RunLogEvent](t, h, runID, events.KindLog)
	if len(logs) == 0 || logs[len(logs)-1].Lines[len(logs[len(logs)-1].Lines)-1].Text != "last line" {
		t.Errorf("log events %+v, want the tail's last line published before the result", logs)
	}
}
