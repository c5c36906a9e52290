package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/oklog/ulid/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// (k): how long a Paperclip acquire takes until the lease runs commands, for a company kubeclip
// has never seen (its tenant is made on the way), against the pod alone: the same pod, rendered
// by pkg/policy as the dispatcher renders it, created with client-go in a tenant namespace the
// bench made beforehand, until the pod is Ready. The pairs alternate which side goes first, one
// pod at a time; each sample's lease is destroyed, and each raw pod deleted, before the next.
const (
	phaseExecReady = "(k) acquire → ready"
	// readyWarmup pairs are discarded first (connections, caches).
	readyWarmup = 1
)

func (b *bench) execReadyPhase(ctx context.Context, rep *report, key []byte) error {
	// The raw side's namespace: a tenant of the bench's, the objects the tenant-worker applies.
	rawReq := b.request(newID("rawready-"), nil)
	rawReq.Config = podConfig()
	plan, err := lease.New(rawReq, time.Now(), benchOperator())
	if err != nil {
		return fmt.Errorf("planning the raw pods: %w", err)
	}
	objs, err := renderTenant(plan, b.session)
	if err != nil {
		return err
	}
	if err := b.raw.apply(ctx, objs); err != nil {
		return fmt.Errorf("applying the raw pods' tenant: %w", err)
	}
	stop, err := b.startExecWorkers(ctx, execsvc.RouteDaemon, key, 1)
	if err != nil {
		return err
	}
	defer func() { _ = stop() }()
	c, err := b.execClient(ctx)
	if err != nil {
		return err
	}

	var ready, firstExec, raw samples
	for i := range readyWarmup + b.s.readySamples {
		sides := []func() error{
			func() error {
				company := newID("cold-")
				lt, err := b.timePodLease(ctx, c, company)
				if err == nil {
					err = b.labelTenants(ctx, company)
				}
				if i >= readyWarmup {
					ready.add(lt.ready, err)
					firstExec.add(lt.firstExec, err)
				}
				return err
			},
			func() error {
				d, err := b.rawPodReady(ctx, plan, key, nil)
				if i >= readyWarmup {
					raw.add(d, err)
				}
				return err
			},
		}
		if i%2 == 1 {
			sides[0], sides[1] = sides[1], sides[0]
		}
		for _, side := range sides {
			if err := side(); err != nil {
				if ctx.Err() != nil {
					return context.Cause(ctx)
				}
				b.logf("(k) sample %d failed: %v", i, err)
			}
		}
	}
	const rawWhat = "client-go create of the same Pod (pkg/policy.RenderPod, its Secret created first, untimed) in a tenant namespace of the bench's → Ready condition seen by a watch"
	const target = "≤ 1.2× raw"
	met := func(p50, _, rawP50 float64) bool { return p50 <= 1.2*rawP50 }
	rep.add(
		latencyRow(phaseExecReady+" (status Running/Ready), cold tenant", ready, raw, rawWhat, target, met),
		latencyRow("(k') acquire → first exec of `true` exited (daemon route), cold tenant", firstExec, raw, rawWhat, target, met),
	)
	rep.note("(k) the pipeline's side includes making the new company's tenant (namespace, quota, policies, RBAC: see (b)); the raw side's namespace exists before its pod is created")
	return nil
}

// leaseTimes are one pod lease's times from just before its acquire's publish; a stage not
// reached is 0.
type leaseTimes struct {
	// created is to its created event, firstExec to the exit 0 of a `true` sent as soon as the
	// created event arrived (the exec-worker holds it until the pod is ready), ready to its
	// status Running/Ready event, or to created when that came later (a warm pod is Ready
	// before its lease is announced, docs/contract.md Ordering): ready to run commands needs both.
	created, firstExec, ready time.Duration
	// warm is the created event's: the lease bound a warm pod of the company's pool.
	warm bool
}

// timePodLease acquires a pod lease (podConfig) of a fresh agent of companyID, times it
// (leaseTimes, each stage in turn: a stage that fails is the error, the ones before it are
// set), and destroys the lease before it returns.
func (b *bench) timePodLease(ctx context.Context, c *execclient.Client, companyID string) (lt leaseTimes, err error) {
	req := b.request(companyID, nil)
	req.Config = podConfig()
	wctx, cancel := b.waitCtx(ctx)
	defer cancel()
	start := time.Now()
	if _, err := b.pub.Publish(wctx, req); err != nil {
		return lt, fmt.Errorf("publishing acquire: %w", err)
	}
	ev, err := b.events.createdEvent(wctx, req.RunID)
	if err != nil {
		return lt, err
	}
	lt.created, lt.warm = ev.created.Sub(start), ev.warm
	l := podLease{Lease: execclient.Lease{CompanyID: req.CompanyID, RunID: req.RunID, ProviderLeaseID: ev.lease}, namespace: ev.namespace}
	defer func() { err = errors.Join(err, b.releasePodLeases(ctx, []podLease{l})) }()
	res, err := c.Run(wctx, execclient.Exec{Lease: l.Lease, Command: "true", Timeout: time.Minute})
	exited := time.Since(start)
	if err := exitErr("true", res, err); err != nil {
		return lt, err
	}
	lt.firstExec = exited
	readyAt, err := b.events.ready(wctx, req.RunID)
	if err != nil {
		return lt, err
	}
	lt.ready = max(readyAt.Sub(start), lt.created)
	return lt, nil
}

// rawPodReady renders a pod of plan as the dispatcher does (its Secret with the sandboxd seed
// of key; on the volume claim claim, when not nil, as a reusable lease's pod), creates
// the Secret, then times the Pod's create until a watch sees it Ready. It deletes both (and
// waits until the pod is gone) before it returns.
func (b *bench) rawPodReady(ctx context.Context, plan lease.Plan, key []byte, claim *corev1.PersistentVolumeClaim) (d time.Duration, err error) {
	spec := plan.RunSpec(policy.WorkloadName(ulid.Make()))
	spec.SandboxdImage = b.s.sandboxdImage // the dispatcher's (--sandboxd-image): the same pod
	spec.VolumeClaim = claim
	env := policy.BuildAdapterEnv(plan.Adapter, func(string) (string, bool) { return "", false })
	env[execspec.SeedEnv] = hex.EncodeToString(execspec.DeriveSeed(key, spec.Namespace, spec.WorkloadName))
	token, err := policy.NewBootstrapToken(rand.Reader)
	if err != nil {
		return 0, err
	}
	secret, err := policy.RenderSecret(spec, policy.OwnerReference("v1", "Pod", spec.WorkloadName, "set-on-create"), token, env)
	if err != nil {
		return 0, fmt.Errorf("rendering the raw pod's Secret: %w", err)
	}
	secret.OwnerReferences = nil
	spec.SecretEnvKeys = policy.SecretEnvKeys(secret)
	pod := policy.RenderPod(spec)
	// Not the run-watcher's, nor the exec-workers': the raw pod must not add to their work.
	for _, labels := range []map[string]string{secret.Labels, pod.Labels} {
		labels[policy.LabelManagedBy] = rawManagedBy
	}

	wctx, cancel := b.waitCtx(ctx)
	defer cancel()
	secrets, pods := b.raw.cs.CoreV1().Secrets(spec.Namespace), b.raw.cs.CoreV1().Pods(spec.Namespace)
	opts := metav1.CreateOptions{FieldManager: benchFieldManager}
	if err := createRetryingConflicts(func() error {
		_, err := secrets.Create(wctx, secret, opts)
		return err
	}); err != nil {
		return 0, fmt.Errorf("creating Secret %s/%s: %w", secret.Namespace, secret.Name, err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.s.cleanupTimeout)
		defer cancel()
		if derr := k8s.DeletePodRun(cctx, b.raw.cs, spec.Namespace, spec.WorkloadName, k8s.RunDeleteOptions{PodGracePeriod: time.Second}); derr != nil {
			err = errors.Join(err, derr)
		}
		if derr := secrets.Delete(cctx, secret.Name, metav1.DeleteOptions{}); derr != nil {
			err = errors.Join(err, fmt.Errorf("deleting Secret %s/%s: %w", secret.Namespace, secret.Name, derr))
		}
	}()
	start := time.Now()
	if err := createRetryingConflicts(func() error {
		_, err := pods.Create(wctx, pod, opts)
		return err
	}); err != nil {
		return 0, fmt.Errorf("creating pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	// List, then watch (again, should the API server end a watch): the pod takes seconds to
	// start, the list milliseconds.
	lw := cache.NewListWatchFromClient(b.raw.cs.CoreV1().RESTClient(), "pods", pod.Namespace, fields.OneTermEqualSelector("metadata.name", pod.Name))
	var readyAt time.Time
	_, err = watchtools.UntilWithSync(wctx, lw, &corev1.Pod{}, nil, func(e watch.Event) (bool, error) {
		if p, isPod := e.Object.(*corev1.Pod); isPod && e.Type != watch.Deleted && podIsReady(p) {
			readyAt = time.Now()
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return 0, fmt.Errorf("waiting for pod %s/%s to be Ready: %w", pod.Namespace, pod.Name, err)
	}
	return readyAt.Sub(start), nil
}

// podIsReady reports the pod's Ready condition.
func podIsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
