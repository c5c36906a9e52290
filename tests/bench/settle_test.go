package main

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/internal/pipelinetest"
)

// A phase starts only once the pods of the phases before it have stopped and they and their
// namespaces are gone; until then (bounded) the error names the pod still running.
func TestSettleWaitsForPodsThenDeletesThem(t *testing.T) {
	// settle deletes every namespace with the bench's prefix: never beside a running bench
	// (it holds the lock exclusively).
	unlock, err := pipelinetest.LockCluster(false)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	cfg := clustertest.Config(t)
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hc.CloseIdleConnections)
	cs, err := kubernetes.NewForConfigAndClient(cfg, hc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	b := &bench{
		s:         settings{settleTimeout: 2 * time.Second, waitTimeout: time.Minute},
		raw:       &rawKube{cs: cs},
		published: map[string]time.Time{}, ended: map[string]bool{},
		progress: t.Output(),
		session:  newID(""),
	}
	ns := namespacePrefix + "settle-" + b.session
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: ns, Labels: map[string]string{sessionLabel: b.session},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(t.Context(), ns, metav1.DeleteOptions{}) })
	// The stub prints 40 lines 100 ms apart: it runs about 4 s.
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "stub", Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "agent", Image: stubImage, ImagePullPolicy: corev1.PullNever,
				Env: []corev1.EnvVar{{Name: "STUB_LINES", Value: "40"}, {Name: "STUB_INTERVAL", Value: "100ms"}},
			}},
		},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	_, err = b.settle(ctx, "(x) next")
	if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), ns+"/stub") || !strings.Contains(err.Error(), "pods still running") {
		t.Fatalf("settle while the pod runs = %v, want the deadline naming %s/stub as still running", err, ns)
	}
	t.Logf("settle while the pod runs: %v", err)

	b.s.settleTimeout = 2 * time.Minute
	ps, err := b.settle(ctx, "(y) next")
	if err != nil {
		t.Fatalf("settle once the pod stops: %v", err)
	}
	if ps.Pods != 1 || ps.Namespaces < 1 || ps.Phase != "(y) next" || ps.Load == "" {
		t.Errorf("settle = %+v, want 1 pod and the namespace deleted, the phase and the load average", ps)
	}
	if _, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("namespace %s after settle: %v, want it gone", ns, err)
	}
}

func TestProcShares(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 8, 0, 0, 0, time.UTC)
	from := nodeCPU{at: t0, bench: time.Second, procs: map[string]time.Duration{"kube-apiserver": 0, "etcd": time.Second}}
	to := nodeCPU{at: t0.Add(2 * time.Second), bench: 2 * time.Second, procs: map[string]time.Duration{"kube-apiserver": 3 * time.Second, "etcd": 1500 * time.Millisecond}}
	want := "bench (NATS + workers) 50%, kube-apiserver 150%, etcd 25%"
	if got := procShares(from, to); got != want {
		t.Errorf("procShares = %q, want %q", got, want)
	}
	if got := procShares(from, nodeCPU{at: t0.Add(time.Second)}); got != "" {
		t.Errorf("procShares without /proc = %q, want empty", got)
	}
	// This process's own CPU reads.
	if r := readNodeCPU(); r.bench <= 0 {
		t.Errorf("readNodeCPU: the bench process used %s CPU so far, want > 0", r.bench)
	}
}

// A read that could not be made near the deadline (the rate limiter's refusal) does not hide
// what was left; the API server's refusal ends the poll at once.
func TestPollKeepsWhatWasLeft(t *testing.T) {
	b := &bench{}
	ctx, cancel := context.WithTimeout(t.Context(), 3*settlePoll/2)
	defer cancel()
	calls := 0
	err := b.poll(ctx, func() (string, error) {
		if calls++; calls == 1 {
			return "ns/stub", nil
		}
		return "", errors.New("client rate limiter Wait returned an error: rate: Wait(n=1) would exceed context deadline")
	})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.HasPrefix(err.Error(), "ns/stub: ") {
		t.Fatalf("poll = %v, want the deadline naming ns/stub", err)
	}

	forbidden := apierrors.NewForbidden(corev1.Resource("pods"), "", errors.New("no"))
	calls = 0
	err = b.poll(t.Context(), func() (string, error) { calls++; return "", forbidden })
	if !apierrors.IsForbidden(err) || calls != 1 {
		t.Fatalf("poll = %v after %d calls, want Forbidden after 1", err, calls)
	}
}
