package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/cas"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// A warm pool's upkeep (warm.go): each acquire of an eligible shape records its demand
// (noteAcquire) and kicks the pool; a replica's maintainers bring each pool kicked, and every
// pool each warmPassInterval, to its target under the pool's lock (maintain): pods made (grow),
// the surplus and the failed deleted, a drained idle pool forgotten.

// run maintains pools until ctx ends: those acquires kicked, and every pool each
// warmPassInterval.
func (p *warmPools) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer func() { p.stopCache(); p.factory.Shutdown(); wg.Wait() }()
	for range warmMaintainers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case key := <-p.kicks:
					p.mu.Lock()
					delete(p.queued, key)
					p.mu.Unlock()
					if err := p.maintain(ctx, key); err != nil && ctx.Err() == nil {
						p.log.Warn().Err(err).Str("pool", key).Msg("maintaining a warm pool failed; the next pass tries again")
					}
				}
			}
		})
	}
	tick := time.NewTicker(warmPassInterval)
	defer tick.Stop()
	for {
		p.pass(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// pass kicks every pool, and evicts the warm pods of pools that have no record (deleted while
// a pod was being made, or lost): nothing else would ever bind or delete them.
func (p *warmPools) pass(ctx context.Context) {
	keys, err := p.kv.ListKeys(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		if ctx.Err() == nil {
			p.log.Warn().Err(err).Msg("listing warm pools failed")
		}
		return
	}
	pools := map[string]bool{}
	if err == nil {
		for key := range keys.Keys() {
			if _, _, ok := splitPoolKey(key); ok {
				pools[key] = true
				p.kick(key)
			}
		}
	}
	now := p.now()
	byCompany := map[string]int{}
	for _, obj := range p.pods.GetStore().List() {
		pod := obj.(*corev1.Pod)
		byCompany[pod.Labels[policy.LabelCompanyID]]++
		key := poolKey(pod.Labels[policy.LabelCompanyID], pod.Labels[policy.LabelWarmPool])
		if pools[key] || pod.DeletionTimestamp != nil || now.Sub(pod.CreationTimestamp.Time) < warmPendingTTL || !p.take(pod, now) {
			continue
		}
		if err := workload.EvictWarmPod(ctx, p.cs, pod); err != nil {
			p.log.Warn().Err(err).Str("pool", key).Msg("evicting a warm pod of no pool failed")
		}
	}
	p.observer.WarmPods(byCompany)
}

// kick queues a pool's maintenance, once however often it is kicked before it runs.
func (p *warmPools) kick(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.queued[key] {
		return
	}
	select {
	case p.kicks <- key:
		p.queued[key] = true
	default: // full: the next pass kicks it again
	}
}

// noteAcquire records an eligible acquire in its pool (made on the company's first) and kicks
// the pool's maintenance: a hit's pod is replaced, a miss's pool grows. Errors are logged:
// the acquire itself is done.
func (p *warmPools) noteAcquire(ctx context.Context, spec policy.RunSpec, hit bool) {
	p.observer.WarmAcquire(hit)
	key := poolKey(spec.CompanyID, policy.WarmShape(spec))
	now := p.now()
	full, err := p.companyFull(ctx, spec.CompanyID, key)
	if err != nil {
		p.log.Warn().Err(err).Str("pool", key).Msg("counting the company's warm pools failed")
		return
	}
	_, err = cas.Update(ctx, p.kv, key, func(current []byte, _ uint64) ([]byte, bool, error) {
		rec := poolRecord{Namespace: spec.Namespace}
		if current == nil && full {
			return nil, false, nil // a new shape of a company with all its pools: not warmed
		}
		if current != nil {
			if err := json.Unmarshal(current, &rec); err != nil {
				return nil, false, fmt.Errorf("decoding warm pool %s: %w", key, err)
			}
		}
		rec.Namespace, rec.Spec = spec.Namespace, policy.WarmSpec(spec)
		rec.Rate, rec.RateAt = rec.rate(now)+1/warmRateWindow.Seconds(), now
		rec.LastAcquire = now
		if hit {
			rec.Hits++
		} else {
			rec.Misses++
		}
		b, err := json.Marshal(rec)
		return b, true, err
	})
	if err != nil {
		p.log.Warn().Err(err).Str("pool", key).Msg("recording an acquire in its warm pool failed")
		return
	}
	p.kick(key)
}

// companyFull reports whether companyID has maxWarmPoolsPerCompany pools, key not among them.
func (p *warmPools) companyFull(ctx context.Context, companyID, key string) (bool, error) {
	keys, err := p.kv.ListKeysFiltered(ctx, poolKey(companyID, "*"))
	if errors.Is(err, jetstream.ErrNoKeysFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("listing the warm pools of company %s: %w", companyID, err)
	}
	defer func() { _ = keys.Stop() }()
	n := 0
	for k := range keys.Keys() {
		if k == key {
			return false, nil
		}
		n++
	}
	return n >= maxWarmPoolsPerCompany, nil
}

// maintain brings one pool to its target, if no other replica is at it: failed pods deleted,
// new ones made or the surplus deleted, and the record of a drained idle pool deleted.
func (p *warmPools) maintain(ctx context.Context, key string) error {
	companyID, shape, _ := splitPoolKey(key)
	entry, err := p.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading warm pool %s: %w", key, err)
	}
	var rec poolRecord
	if err := json.Unmarshal(entry.Value(), &rec); err != nil {
		return fmt.Errorf("decoding warm pool %s: %w", key, err)
	}
	me := []byte(p.replica)
	holder, _, err := cas.Take(ctx, p.kv, warmLockPrefix+key, me, jetstream.KeyTTL(warmLockTTL))
	if err != nil || string(holder) != p.replica {
		return err // another replica maintains it now
	}
	defer func() {
		if err := cas.Free(context.WithoutCancel(ctx), p.kv, warmLockPrefix+key, me); err != nil {
			p.log.Warn().Err(err).Str("pool", key).Msg("freeing a warm pool's lock failed; its TTL will")
		}
	}()

	now := p.now()
	target := rec.target(now, p.opts, companyID)
	alive, ended, made := p.poolPods(rec.Namespace, shape, rec.Made, now)
	p.log.Debug().Str("pool", key).Int("target", target).Int("alive", len(alive)).Int("ended", len(ended)).Msg("maintaining warm pool")
	var errs []error
	for _, pod := range ended {
		errs = append(errs, workload.EvictWarmPod(ctx, p.cs, pod))
	}
	switch {
	case len(alive) < target:
		errs = append(errs, p.grow(ctx, key, rec, target-len(alive), made))
	case len(alive) > target:
		// The surplus goes: pods not Ready yet first, then the youngest.
		slices.SortFunc(alive, func(a, b *corev1.Pod) int {
			ra, rb := readyWarm(a, companyID, shape), readyWarm(b, companyID, shape)
			if ra != rb {
				if ra {
					return 1
				}
				return -1
			}
			return b.CreationTimestamp.Compare(a.CreationTimestamp.Time)
		})
		surplus := len(alive) - target
		for _, pod := range alive {
			if surplus == 0 {
				break
			}
			// A pod made but not seen yet has no uid to delete by; the next pass sees it.
			if pod.UID != "" && p.take(pod, now) {
				errs = append(errs, workload.EvictWarmPod(ctx, p.cs, pod))
				surplus--
			}
		}
	case target == 0 && len(made) == 0 && now.Sub(rec.LastAcquire) >= p.opts.Idle && now.Sub(rec.QuotaAt) >= warmQuotaCooldown:
		// Drained and idle: the pool is forgotten until the company's next acquire.
		if err := p.kv.Delete(ctx, key, jetstream.LastRevision(entry.Revision())); err != nil && !cas.IsConflict(err) {
			errs = append(errs, fmt.Errorf("deleting idle warm pool %s: %w", key, err))
		} else if err == nil {
			p.log.Info().Str(events.LogKeyTenant, companyID).Str("pool", key).Uint64("hits", rec.Hits).Uint64("misses", rec.Misses).Msg("idle warm pool drained")
		}
		return errors.Join(errs...)
	}
	if !maps.Equal(made, rec.Made) {
		errs = append(errs, p.saveMade(ctx, key, made))
	}
	return errors.Join(errs...)
}

// saveMade writes the pool's pods made and not yet seen (poolRecord.Made), leaving the rest of
// its record as it is now.
func (p *warmPools) saveMade(ctx context.Context, key string, made map[string]time.Time) error {
	_, err := cas.Update(ctx, p.kv, key, func(current []byte, _ uint64) ([]byte, bool, error) {
		if current == nil {
			return nil, false, nil
		}
		var rec poolRecord
		if err := json.Unmarshal(current, &rec); err != nil {
			return nil, false, fmt.Errorf("decoding warm pool %s: %w", key, err)
		}
		rec.Made = made
		b, err := json.Marshal(rec)
		return b, true, err
	})
	if err != nil {
		return fmt.Errorf("recording the pods of warm pool %s: %w", key, err)
	}
	return nil
}

// poolPods returns the pool's unbound pods that live, those a maintainer made (made) and the
// cache does not show yet included as placeholders, and those that ended (Failed or Succeeded: a
// warm pod never ends by itself unless it broke); and what is left of made: those neither seen,
// nor claimed here, nor older than warmPendingTTL.
func (p *warmPools) poolPods(namespace, shape string, made map[string]time.Time, now time.Time) (alive, ended []*corev1.Pod, left map[string]time.Time) {
	objs, _ := p.pods.GetIndexer().ByIndex(poolIndex, namespace+"/"+shape)
	seen := map[string]bool{}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, obj := range objs {
		pod := obj.(*corev1.Pod)
		seen[pod.Name] = true
		if _, taken := p.taken[namespace+"/"+pod.Name]; taken || pod.DeletionTimestamp != nil {
			continue
		}
		if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
			ended = append(ended, pod)
			continue
		}
		alive = append(alive, pod)
	}
	left = map[string]time.Time{}
	for name, at := range made {
		_, taken := p.taken[namespace+"/"+name] // claimed before a pass here saw it
		if seen[name] || taken || now.Sub(at) > warmPendingTTL {
			continue
		}
		left[name] = at
		alive = append(alive, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, CreationTimestamp: metav1.NewTime(at)}})
	}
	return alive, ended, left
}

// grow makes n pods of the pool, each added to made. The tenant's quota refusing one ends the
// pass quietly: warm pods take only what the company's own acquires leave.
func (p *warmPools) grow(ctx context.Context, key string, rec poolRecord, n int, made map[string]time.Time) error {
	for range n {
		name := policy.WorkloadName(p.newID())
		pod, secret := policy.RenderWarmPod(rec.Spec, name, execspec.DeriveBindSeed(p.key, rec.Namespace, name))
		err := workload.CreateWarmPod(ctx, p.cs, pod, secret)
		if _, quota := k8s.QuotaRefusal(err); quota {
			p.log.Debug().Str("pool", key).Msg("the tenant's quota leaves no room for another warm pod")
			return nil
		}
		if err != nil {
			return err
		}
		made[name] = p.now()
	}
	return nil
}
