package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const (
	// settlePoll is how often settle looks whether the node is clear.
	settlePoll = 500 * time.Millisecond
	// settleShown is how many of what is left a settle error names.
	settleShown = 5
)

// phaseStart is how a phase began: how long it waited for the node to be clear of the phases
// before it, what that took away, and the load average once it was clear.
type phaseStart struct {
	Phase string `json:"phase"`
	// SettleSeconds is the wait: runs ended, then pods and namespaces deleted and gone.
	SettleSeconds float64 `json:"settleSeconds"`
	// Runs is how many earlier runs were still going when the phase was due; Unended how many
	// of them had no result within --wait-timeout (the settle went on to their pods).
	Runs    int `json:"runs"`
	Unended int `json:"unended,omitempty"`
	// Pods and Namespaces are how many of each the settle deleted.
	Pods       int `json:"pods"`
	Namespaces int `json:"namespaces"`
	// Load is /proc/loadavg's 1, 5 and 15 minute averages when the phase started.
	Load string `json:"load"`
}

// settle makes the node clear of what the phases before next left, before next starts: it
// waits until every run they acquired has ended (result, failed or released, for at most
// --wait-timeout: (c) measures the runs of (a), (b) and (d) from what the bench received, so
// they end on their own), and every pod in the bench's namespaces has stopped, then deletes
// those pods (grace 0: nothing runs in them any more), the Jobs of the warm tenants and every
// other namespace of the bench, and waits until all of them are gone. A phase that leaves runs
// that do not end by themselves (the bursts) ends them at its own end. Everything is bounded by
// --settle-timeout; the pods or namespaces still there then are the error, named.
func (b *bench) settle(ctx context.Context, next string) (phaseStart, error) {
	start := time.Now()
	ps := phaseStart{Phase: next}
	sctx, cancel := context.WithTimeout(ctx, b.s.settleTimeout)
	defer cancel()
	fail := func(what string, err error) (phaseStart, error) {
		if ctx.Err() != nil {
			return ps, context.Cause(ctx)
		}
		return ps, fmt.Errorf("the node is not clear for %s after %s: %s: %w", next, time.Since(start).Round(100*time.Millisecond), what, err)
	}

	open := b.openRuns()
	ps.Runs = len(open)
	rctx, rcancel := b.waitCtx(sctx)
	for i, id := range open {
		if _, err := b.events.waitFor(rctx, id, runEnded); err != nil {
			if ctx.Err() != nil {
				rcancel()
				return ps, context.Cause(ctx)
			}
			// A run whose Job went before its pod came may never get a result; what holds the
			// node is its pods, waited for next.
			ps.Unended = len(open) - i
			b.logf("%s: %d of %d earlier run(s) have not ended within %s (%s); waiting for their pods",
				next, ps.Unended, len(open), b.s.waitTimeout, b.describeRuns(open[i:]))
			break
		}
		b.ended[id] = true
	}
	rcancel()
	if err := b.poll(sctx, func() (string, error) {
		pods, err := b.benchPods(sctx)
		if err != nil {
			return "", err
		}
		return describePods(running(pods)), nil
	}); err != nil {
		return fail("pods still running", err)
	}

	keep := b.warmNamespaces()
	namespaces, err := benchNamespaces(sctx, b.raw.cs)
	if err != nil {
		return fail("listing the bench's namespaces", err)
	}
	pods, err := b.benchPods(sctx)
	if err != nil {
		return fail("listing the bench's pods", err)
	}
	ps.Pods = len(pods)
	if err := b.deletePods(sctx, pods); err != nil {
		return fail("deleting the stopped pods", err)
	}
	var gone []string
	for _, ns := range namespaces {
		if keep[ns] {
			if err := b.deleteJobs(sctx, ns); err != nil {
				return fail("deleting the Jobs of a warm tenant", err)
			}
			continue
		}
		err := b.raw.cs.CoreV1().Namespaces().Delete(sctx, ns, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fail("deleting the namespaces of earlier phases", fmt.Errorf("namespace %s: %w", ns, err))
		}
		gone = append(gone, ns)
	}
	ps.Namespaces = len(gone)
	if err := b.poll(sctx, func() (string, error) {
		pods, err := b.benchPods(sctx)
		if err != nil {
			return "", err
		}
		left, err := benchNamespaces(sctx, b.raw.cs)
		if err != nil {
			return "", err
		}
		left = slices.DeleteFunc(left, func(ns string) bool { return keep[ns] })
		var parts []string
		if len(pods) > 0 {
			parts = append(parts, describePods(pods))
		}
		if len(left) > 0 {
			parts = append(parts, fmt.Sprintf("%d namespace(s) terminating (%s)", len(left), strings.Join(first(left), ", ")))
		}
		return strings.Join(parts, "; "), nil
	}); err != nil {
		return fail("pods or namespaces not gone", err)
	}

	ps.SettleSeconds = math.Round(10*time.Since(start).Seconds()) / 10
	ps.Load = readCPU().load
	b.logf("%s starts on a clear node after %s (%d earlier run(s) waited for, %d pod(s) and %d namespace(s) deleted); load average %s",
		next, time.Since(start).Round(100*time.Millisecond), ps.Runs, ps.Pods, ps.Namespaces, ps.Load)
	return ps, nil
}

// runEnded holds once the run needs nothing of the node any more.
func runEnded(r *runEvents) bool {
	return !r.result.IsZero() || r.failed != "" || !r.released.IsZero()
}

// openRuns are the runs the bench acquired that got a workload (a created event) and have not
// been seen ending.
func (b *bench) openRuns() []string {
	var open []string
	for id := range b.published {
		if b.ended[id] {
			continue
		}
		r := b.events.snapshot(id)
		switch {
		case runEnded(&r):
			b.ended[id] = true
		case !r.created.IsZero():
			open = append(open, id)
		}
	}
	slices.Sort(open)
	return open
}

// describeRuns names the first runs and what the bench received of them.
func (b *bench) describeRuns(ids []string) string {
	var out []string
	for _, id := range first(ids) {
		r := b.events.snapshot(id)
		state := "created"
		if !r.ready.IsZero() {
			state = "running"
		}
		if !r.ended.IsZero() {
			state = "ended, no result"
		}
		out = append(out, id+": "+state)
	}
	return strings.Join(out, ", ")
}

// poll calls left until it returns "" (nothing left) and returns nil, or ctx ends: the error
// then says what was left when last known. An answer of the API server's (Forbidden, say) ends
// the poll at once; a request that could not be made is asked again: near the deadline, the
// client's rate limiter refuses to wait past it, and that must not hide what was left.
func (b *bench) poll(ctx context.Context, left func() (string, error)) error {
	t := time.NewTicker(settlePoll)
	defer t.Stop()
	last := "unknown"
	for {
		what, err := left()
		var status apierrors.APIStatus
		switch {
		case err == nil && what == "":
			return nil
		case err == nil:
			last = what
		case errors.As(err, &status) && ctx.Err() == nil:
			return err
		case last == "unknown":
			last = "unknown (" + err.Error() + ")"
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", last, context.Cause(ctx))
		case <-t.C:
		}
	}
}

// benchPods lists the pods in the bench's namespaces (those of every session: a namespace
// with the prefix is the bench's).
func (b *bench) benchPods(ctx context.Context) ([]corev1.Pod, error) {
	list, err := b.raw.cs.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing pods: %w", err)
	}
	return slices.DeleteFunc(list.Items, func(p corev1.Pod) bool { return !strings.HasPrefix(p.Namespace, namespacePrefix) }), nil
}

// running are the pods that have not stopped and are not being deleted, but for (o)'s warm
// pods that no lease bound: idle, they are deleted like stopped ones.
func running(pods []corev1.Pod) []corev1.Pod {
	return slices.DeleteFunc(slices.Clone(pods), func(p corev1.Pod) bool {
		return p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed || isUnboundWarmPod(&p)
	})
}

// describePods says how many pods there are and names the first, with their phase; "" for
// none.
func describePods(pods []corev1.Pod) string {
	if len(pods) == 0 {
		return ""
	}
	var names []string
	for _, p := range pods {
		state := string(p.Status.Phase)
		if p.DeletionTimestamp != nil {
			state += ", terminating"
		}
		names = append(names, fmt.Sprintf("%s/%s %s", p.Namespace, p.Name, state))
	}
	return fmt.Sprintf("%d pod(s) (%s)", len(pods), strings.Join(first(names), ", "))
}

// first is the first settleShown of names.
func first(names []string) []string {
	return names[:min(len(names), settleShown)]
}

// deletePods deletes pods at once (grace 0): settle deletes stopped pods and idle warm pods
// only, and the bursts pods that run a one-line stub, so nothing is there to shut down.
func (b *bench) deletePods(ctx context.Context, pods []corev1.Pod) error {
	zero := int64(0)
	var errs []error
	for _, p := range pods {
		err := b.raw.cs.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("deleting pod %s/%s: %w", p.Namespace, p.Name, err))
		}
	}
	return errors.Join(errs...)
}

// deleteJobs deletes every Job in namespace (a warm tenant's, kept for later phases): the
// pipeline's ended runs and the raw side's suspended Jobs.
func (b *bench) deleteJobs(ctx context.Context, namespace string) error {
	prop := metav1.DeletePropagationBackground
	err := b.raw.cs.BatchV1().Jobs(namespace).DeleteCollection(ctx, metav1.DeleteOptions{PropagationPolicy: &prop}, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("deleting the Jobs in %s: %w", namespace, err)
	}
	return nil
}

// warmNamespaces are the warm tenants later phases use as warm: the pipeline's and the raw
// side's.
func (b *bench) warmNamespaces() map[string]bool {
	keep := map[string]bool{}
	for _, c := range []string{b.warmCompany, b.rawWarmCompany} {
		if c == "" {
			continue
		}
		if ns, err := b.tenantNamespace(c); err == nil {
			keep[ns] = true
		}
	}
	return keep
}
