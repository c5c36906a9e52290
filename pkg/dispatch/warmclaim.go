package dispatch

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"

	"github.com/kubeclip/kubeclip/pkg/cas"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// An acquire's side of the warm pools (warm.go): whether it may have a warm pod (warmEligible),
// the claim of a Ready one of its shape (claimWarm, warmPools.claim), the bind that makes the
// pod its workload (startWarm), and a cold create the tenant's quota refused, for which the
// company's warm pods make room (createEvictingWarm, warmPools.evictForQuota).

// warmEligible reports whether an acquire may get a warm pod: warm pools are on, its workload
// can be a warm pod (workload.Workload.Warmable: the backend's answer, not a name compared
// here), and it is not a reusable lease (whose pod mounts the lease's own volume).
func (d *Dispatcher) warmEligible(plan lease.Plan, rec lease.Record) bool {
	if d.warm == nil || rec.Reusable {
		return false
	}
	w, err := workload.For(plan.Config.Backend, d.workloads)
	return err == nil && w.Warmable()
}

// warmSpec is the run's spec as a warm pod of its shape is rendered from (policy.WarmSpec).
func (d *Dispatcher) warmSpec(plan lease.Plan) policy.RunSpec {
	spec := plan.RunSpec("")
	spec.SandboxdImage = d.opts.SandboxdImage
	return spec
}

// claimWarm claims a warm pod for the acquire: the one an earlier attempt of this dispatch
// claimed without recording it, or a Ready one of its pool; nil when there is none.
func (d *Dispatcher) claimWarm(ctx context.Context, m jetstream.Msg, plan lease.Plan) (*corev1.Pod, error) {
	if md, err := m.Metadata(); err == nil && md.NumDelivered > 1 {
		if pod, err := d.warm.boundTo(ctx, plan.Namespace, plan.Request.RunID); err != nil || pod != nil {
			return pod, err
		}
	}
	return d.warm.claim(ctx, d.warmSpec(plan))
}

// startWarm makes pod, the warm pod the lease record names (claimed by this dispatch, or read
// again on a redelivery), the run's workload: the bind call, with the run Secret's keys; the
// Secret itself is created once `created` is out (workload.StartBound).
func (d *Dispatcher) startWarm(ctx context.Context, rec lease.Record, secret *corev1.Secret, pod *corev1.Pod) (workload.Created, error) {
	if pod == nil {
		got, err := d.opts.Clientset.CoreV1().Pods(rec.Namespace).Get(ctx, rec.WorkloadName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return workload.Created{}, events.Terminalf(events.CodeInternal, "", "the warm pod %s the lease bound is gone before it served", rec.WorkloadName)
		}
		if err != nil {
			return workload.Created{}, fmt.Errorf("reading warm pod %s/%s: %w", rec.Namespace, rec.WorkloadName, err)
		}
		pod = got
	}
	if pod.Labels[policy.LabelRunID] != rec.RunID {
		return workload.Created{}, events.Terminalf(events.CodeInternal, "", "pod %s is not bound to run %s", rec.WorkloadName, rec.RunID)
	}
	if err := d.warm.bind(ctx, pod, secret); err != nil {
		return workload.Created{}, err
	}
	return workload.StartBound(d.opts.Clientset, secret, pod), nil
}

// afterWarmAcquire is an eligible acquire's bookkeeping once `created` is out: a bound pod's
// bind Secret deleted (its sandboxd read it long ago), the acquire recorded in its pool. Errors
// are logged; the run is created.
func (d *Dispatcher) afterWarmAcquire(ctx context.Context, log zerolog.Logger, plan lease.Plan, rec lease.Record) {
	if rec.Warm {
		if err := workload.DeleteWarmSecret(ctx, d.opts.Clientset, rec.Namespace, rec.WorkloadName); err != nil {
			log.Warn().Err(err).Msg("deleting a bound pod's bind Secret failed; the pod's deletion takes it")
		}
	}
	d.warm.noteAcquire(ctx, d.warmSpec(plan), rec.Warm)
}

// createEvictingWarm is a cold create the tenant's quota refused (err): the company's warm pods
// are evicted for it, and it is tried again until the quota takes the deletions into account
// (its controller recounts within a second or two), for at most warmQuotaRetry. Without warm
// pods to evict, err stands.
func (d *Dispatcher) createEvictingWarm(ctx context.Context, log zerolog.Logger, w workload.Workload, spec policy.RunSpec, secret *corev1.Secret, err error) (workload.Created, error) {
	evicted, eerr := d.warm.evictForQuota(ctx, log, spec.Namespace, spec.CompanyID)
	if eerr != nil {
		log.Warn().Err(eerr).Msg("evicting warm pods for a quota refusal failed in part")
	}
	if evicted == 0 {
		return workload.Created{}, err
	}
	deadline := d.opts.Now().Add(warmQuotaRetry)
	for {
		select {
		case <-ctx.Done():
			return workload.Created{}, errors.Join(err, context.Cause(ctx))
		case <-time.After(warmQuotaRetryEvery):
		}
		run, err := w.Create(ctx, spec, secret)
		if _, quota := k8s.QuotaRefusal(err); !quota || !d.opts.Now().Before(deadline) {
			return run, err
		}
	}
}

// readyWarm reports whether pod can be claimed: an unbound warm pod of companyID and shape,
// Running and Ready with an address, not being deleted.
func readyWarm(pod *corev1.Pod, companyID, shape string) bool {
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning || pod.Status.PodIP == "" ||
		pod.Labels[policy.LabelWarmPool] != shape || pod.Labels[policy.LabelCompanyID] != companyID || pod.Labels[policy.LabelRunID] != "" {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// claim binds a Ready warm pod of spec's shape in spec's namespace to spec's run and returns it
// as stored; nil when the pool has none (the acquire goes cold). spec is the run's, without a
// workload name.
func (p *warmPools) claim(ctx context.Context, spec policy.RunSpec) (*corev1.Pod, error) {
	shape := policy.WarmShape(spec)
	objs, err := p.pods.GetIndexer().ByIndex(poolIndex, spec.Namespace+"/"+shape)
	if err != nil {
		return nil, fmt.Errorf("reading the cache of warm pods: %w", err)
	}
	now := p.now()
	candidates := make([]*corev1.Pod, 0, len(objs))
	p.mu.Lock()
	for _, obj := range objs {
		pod := obj.(*corev1.Pod)
		if _, taken := p.taken[pod.Namespace+"/"+pod.Name]; !taken && readyWarm(pod, spec.CompanyID, shape) {
			candidates = append(candidates, pod)
		}
	}
	p.mu.Unlock()
	// The oldest first: a pod waits in the pool as short a time as the pool allows.
	slices.SortFunc(candidates, oldestFirst)
	for _, pod := range candidates[:min(len(candidates), warmClaimAttempts)] {
		if !p.take(pod, now) {
			continue
		}
		bound := pod.DeepCopy()
		run := spec
		run.WorkloadName = pod.Name
		policy.BindWarmPod(bound, run, now)
		got, err := workload.ClaimWarmPod(ctx, p.cs, bound)
		if errors.Is(err, workload.ErrWarmTaken) {
			continue
		}
		if err != nil {
			return nil, err
		}
		return got, nil
	}
	return nil, nil
}

// take marks pod as claimed (or evicted) here, so this replica's other acquires pass it over
// until its cache drops it; false when it already was.
func (p *warmPools) take(pod *corev1.Pod, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, at := range p.taken {
		if now.Sub(at) > warmPendingTTL {
			delete(p.taken, k)
		}
	}
	k := pod.Namespace + "/" + pod.Name
	if _, ok := p.taken[k]; ok {
		return false
	}
	p.taken[k] = now
	return true
}

// boundTo finds the warm pod an earlier attempt of runID's dispatch claimed in namespace
// before it could record it (the dispatcher stopped in between); nil when there is none.
func (p *warmPools) boundTo(ctx context.Context, namespace, runID string) (*corev1.Pod, error) {
	sel := labels.Set{policy.LabelRunID: runID, policy.LabelManagedBy: policy.ManagedBy}.String()
	list, err := p.cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("listing the pods of run %s: %w", runID, err)
	}
	for i := range list.Items {
		if pod := &list.Items[i]; pod.Annotations[policy.AnnotationWarmShape] != "" && pod.DeletionTimestamp == nil {
			return pod, nil
		}
	}
	return nil, nil
}

// bind installs the lease's sandboxd seed and environment (the run Secret's keys, as a cold
// pod's agent container gets them; never the seed) in pod's sandboxd, through the bind call
// only this installation's master key can make. It is idempotent: a pod bound to this lease
// already is success.
func (p *warmPools) bind(ctx context.Context, pod *corev1.Pod, secret *corev1.Secret) error {
	env := maps.Clone(secret.StringData)
	delete(env, execspec.SeedEnv)
	addr := net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(policy.SandboxdPort))
	bctx, cancel := context.WithTimeout(ctx, warmBindTimeout)
	defer cancel()
	err := p.binder(bctx, addr, execspec.DeriveBindSeed(p.key, pod.Namespace, pod.Name), execspec.DeriveSeed(p.key, pod.Namespace, pod.Name), env)
	if err != nil {
		return fmt.Errorf("binding warm pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// evictForQuota deletes every unbound warm pod in namespace, a company's acquire having been
// refused by its quota, and keeps the company's pools empty for warmQuotaCooldown. It reports
// how many it deleted: none, and the refusal stands.
func (p *warmPools) evictForQuota(ctx context.Context, log zerolog.Logger, namespace, companyID string) (int, error) {
	objs, err := p.pods.GetIndexer().ByIndex(cache.NamespaceIndex, namespace)
	if err != nil {
		return 0, fmt.Errorf("reading the cache of warm pods: %w", err)
	}
	now := p.now()
	shapes := map[string]bool{}
	evicted := 0
	var errs []error
	for _, obj := range objs {
		pod := obj.(*corev1.Pod)
		shapes[pod.Labels[policy.LabelWarmPool]] = true
		if pod.DeletionTimestamp != nil || pod.Labels[policy.LabelRunID] != "" || !p.take(pod, now) {
			continue
		}
		if err := workload.EvictWarmPod(ctx, p.cs, pod); err != nil {
			errs = append(errs, err)
			continue
		}
		evicted++
	}
	for shape := range shapes {
		key := poolKey(companyID, shape)
		_, err := cas.Update(ctx, p.kv, key, func(current []byte, _ uint64) ([]byte, bool, error) {
			var rec poolRecord
			if current == nil {
				return nil, false, nil
			}
			if err := json.Unmarshal(current, &rec); err != nil {
				return nil, false, fmt.Errorf("decoding warm pool %s: %w", key, err)
			}
			rec.QuotaAt = now
			b, err := json.Marshal(rec)
			return b, true, err
		})
		errs = append(errs, err)
	}
	if evicted > 0 {
		log.Info().Int("evicted", evicted).Msg("the tenant's quota refused the run: its warm pods were evicted for it")
	}
	return evicted, errors.Join(errs...)
}

// oldestFirst orders pods by creation.
func oldestFirst(a, b *corev1.Pod) int {
	return cmp.Compare(a.CreationTimestamp.UnixNano(), b.CreationTimestamp.UnixNano())
}
