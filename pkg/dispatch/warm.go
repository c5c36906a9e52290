package dispatch

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kubeclip/kubeclip/pkg/cas"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// Warm pools (issue 17). A company's pool of a shape (policy.WarmShape: what its acquires'
// pods are rendered from) is a few pods of backend pod started ahead of demand in its
// namespace, sandboxd unbound. An acquire of that shape claims a Ready one (workload.
// ClaimWarmPod: one update at the pod's resourceVersion, so two acquires never get one pod),
// the lease record fixes it as the workload (lease.Workload.Warm), the run's Secret is created
// owned by it, and the bind call installs the lease's sandboxd seed and environment: `created`
// goes out with warm true and the pod is ready to run commands at once. An acquire that finds
// none is created cold, as without pools. A bound pod is the lease's workload, deleted at its
// release like any other; it never serves a second lease.
//
// The pool's demand is shared by every dispatcher replica in KUBECLIP_WARM: one record per
// pool (poolRecord: the namespace, the spec its pods are rendered from, the decayed acquire
// rate, the last acquire), written with compare-and-set at each acquire of the pool's shape.
// One replica at a time maintains a pool (a TTL lock in the same bucket): it counts the pool's
// pods in its cache of warm pods, makes or deletes pods to reach the target, and drains an idle
// pool. Warm pods count against the tenant's ResourceQuota; an acquire the quota refuses first
// evicts the company's warm pods and tries again (evictForQuota), and its pools stay empty for
// warmQuotaCooldown.

// WarmBucket holds the warm pools' records and their maintenance locks; only the dispatcher
// uses it, so only the dispatcher creates it (WarmBucketConfig).
const WarmBucket = "KUBECLIP_WARM"

// Settings of warm pools.
const (
	// DefaultWarmIdle is how long a pool keeps pods after its company's last acquire of its
	// shape; then it drains to the company's pinned minimum.
	DefaultWarmIdle = 10 * time.Minute
	// warmRateWindow is the time constant of a pool's decayed acquire rate: a burst raises it
	// within seconds, a minute's silence lowers it to a third.
	warmRateWindow = time.Minute
	// warmRefill is about how long a new warm pod takes to be Ready (the local cluster's pod
	// start is 2 s, a node pulling an image takes longer): a pool holds what its acquires take
	// in that time, plus one.
	warmRefill = 3 * time.Second
	// warmPassInterval is how often every pool is maintained even without acquires (drains,
	// pods that failed, a replica's pass that died).
	warmPassInterval = 5 * time.Second
	// warmLockTTL bounds a pool's maintenance lock when its holder died mid-pass.
	warmLockTTL = 30 * time.Second
	// warmQuotaCooldown is how long a company's pools stay empty after its quota refused one of
	// its acquires: warm pods must never make a company's own acquire fail.
	warmQuotaCooldown = time.Minute
	// warmBindTimeout bounds the bind call to a claimed pod's sandboxd.
	warmBindTimeout = 10 * time.Second
	// warmClaimAttempts bounds the pods one acquire tries to claim before it goes cold: each
	// losing claim is one API round trip.
	warmClaimAttempts = 3
	// warmPendingTTL is how long a pod a maintainer made (or this replica claimed) is counted
	// before a cache shows it: the watch normally brings it within milliseconds.
	warmPendingTTL = 30 * time.Second
	// warmQuotaRetry bounds how long an acquire the quota refused tries again once it evicted
	// its company's warm pods, every warmQuotaRetryEvery: the quota controller recounts a
	// deleted pod within a second or two.
	warmQuotaRetry      = 10 * time.Second
	warmQuotaRetryEvery = 250 * time.Millisecond
	// warmMaintainers is how many pools one replica maintains at once.
	warmMaintainers = 4
	// maxWarmRecordBytes bounds a pool record (its spec is one provider config).
	maxWarmRecordBytes = 64 << 10
	// warmLockPrefix names the maintenance locks, beside the pool records: "/" is in no pool
	// key (poolKey).
	warmLockPrefix = "lock/"
	// maxWarmPoolsPerCompany bounds the pools one company has at once, whatever shapes its
	// acquires ask for: a company varying its config cannot grow the bucket or the passes
	// without bound. An acquire of a further shape is simply not warmed.
	maxWarmPoolsPerCompany = 4
	// poolIndex indexes the cache of warm pods by pool (namespace/shape).
	poolIndex = "pool"
)

// WarmOptions are the operator's bounds on warm pools.
type WarmOptions struct {
	// Max is the most unbound warm pods one company may have (per shape); 0 turns warm pools
	// off.
	Max int
	// Min pins a minimum per company id, at most Max, kept from the company's first acquire of
	// a shape on however idle it is (the pool needs that acquire to know what to warm).
	Min map[string]int
	// Idle is how long after a pool's last acquire it drains to its minimum (default
	// DefaultWarmIdle).
	Idle time.Duration
}

// Enabled reports whether warm pools are on.
func (o WarmOptions) Enabled() bool { return o.Max > 0 }

func (o WarmOptions) withDefaults() (WarmOptions, error) {
	if o.Max < 0 || o.Idle < 0 {
		return o, errors.New("dispatch: Options.Warm: Max and Idle must not be negative")
	}
	for company, n := range o.Min {
		if n < 0 || n > o.Max {
			return o, fmt.Errorf("dispatch: Options.Warm: the minimum of company %s is %d, want 0 to Max (%d)", company, n, o.Max)
		}
	}
	if o.Idle == 0 {
		o.Idle = DefaultWarmIdle
	}
	return o, nil
}

// Binder is sandboxd's bind call (sandboxd.Bind) to the daemon of a warm pod at addr (host:port,
// TLS pinned to bindSeed's key): it installs leaseSeed and env, and is idempotent. cmd/dispatcher
// wires it; pkg/dispatch speaks pkg/execspec's vocabulary, not the daemon's package. A pod that
// can never be this lease's (bound to another) is an *events.TerminalError.
type Binder func(ctx context.Context, addr string, bindSeed, leaseSeed []byte, env map[string]string) error

// WarmObserver is told about warm pools (metrics); it must not block.
type WarmObserver interface {
	// WarmAcquire counts an eligible acquire: a hit got a warm pod, a miss was created cold.
	WarmAcquire(hit bool)
	// WarmPods reports the unbound warm pods the replica's cache holds.
	WarmPods(n int)
}

// WarmBucketConfig is the KUBECLIP_WARM bucket: pool records (no TTL: a drained pool deletes
// its own) and maintenance locks (a per-key TTL, warmLockTTL), its share of a store of
// storeBytes (0: the default).
func WarmBucketConfig(replicas int, storeBytes int64) jetstream.KeyValueConfig {
	if replicas <= 0 {
		replicas = 1
	}
	return jetstream.KeyValueConfig{
		Bucket:         WarmBucket,
		Description:    "kubeclip warm pools: each pool's demand, and who maintains it",
		History:        1,
		MaxValueSize:   maxWarmRecordBytes,
		MaxBytes:       events.StoreLimit(storeBytes, events.StoreWarm),
		LimitMarkerTTL: warmLockTTL, // enables per-key TTLs
		Storage:        jetstream.FileStorage,
		Replicas:       replicas,
	}
}

// poolRecord is a pool's demand, shared by the replicas.
type poolRecord struct {
	Namespace string `json:"namespace"`
	// Spec is what the pool's pods are rendered from (policy.WarmSpec of its last acquire).
	Spec policy.RunSpec `json:"spec"`
	// Rate is the decayed acquire rate (per second) at RateAt.
	Rate   float64   `json:"rate"`
	RateAt time.Time `json:"rateAt"`
	// LastAcquire is when the pool's shape was last acquired; Hits and Misses count them.
	LastAcquire time.Time `json:"lastAcquire"`
	Hits        uint64    `json:"hits"`
	Misses      uint64    `json:"misses"`
	// QuotaAt is when the company's quota last refused one of its acquires.
	QuotaAt time.Time `json:"quotaAt,omitzero"`
	// Made is the pods the pool's maintainer made (by name, when) until a maintainer's cache
	// shows them, or warmPendingTTL: the next maintainer, another replica whose cache has not
	// seen them yet, counts them too and does not make the pool larger than its target.
	Made map[string]time.Time `json:"made,omitempty"`
}

// rate is the decayed acquire rate at now.
func (r poolRecord) rate(now time.Time) float64 {
	return r.Rate * math.Exp(-now.Sub(r.RateAt).Seconds()/warmRateWindow.Seconds())
}

// target is how many unbound pods the pool should hold at now: what its acquires take while a
// new pod starts, plus one, within the company's minimum and the operator's maximum; the
// minimum once idle; none while the company's quota is under pressure.
func (r poolRecord) target(now time.Time, o WarmOptions, companyID string) int {
	if now.Sub(r.QuotaAt) < warmQuotaCooldown {
		return 0
	}
	least := min(o.Min[companyID], o.Max)
	if now.Sub(r.LastAcquire) >= o.Idle {
		return least
	}
	want := int(math.Ceil(r.rate(now)*warmRefill.Seconds())) + 1
	return max(least, min(want, o.Max))
}

// poolKey is a pool's record key, company.shape: a company id is a subject token (no '.'), a
// shape is hex, so a company's pools are the keys company.* (ListKeysFiltered).
func poolKey(companyID, shape string) string { return companyID + "." + shape }

// splitPoolKey returns the company and shape of a pool key; ok is false for any other key (a
// lock: lock/<pool key>).
func splitPoolKey(key string) (companyID, shape string, ok bool) {
	companyID, shape, ok = strings.Cut(key, ".")
	return companyID, shape, ok && !strings.ContainsAny(key, "/") && !strings.Contains(shape, ".")
}

// warmPools is one replica's side of the warm pools.
type warmPools struct {
	opts    WarmOptions
	key     []byte // the installation's master key: bind seeds and lease seeds
	binder  Binder
	cs      kubernetes.Interface
	kv      jetstream.KeyValue
	factory informers.SharedInformerFactory
	pods    cache.SharedIndexInformer // unbound warm pods, every namespace
	// stopCache stops the cache start started.
	stopCache context.CancelFunc
	log       zerolog.Logger
	now       func() time.Time
	newID     func() ulid.ULID
	observer  WarmObserver
	replica   string // this replica's name as a lock holder
	kicks     chan string

	mu sync.Mutex
	// taken: pods this replica claimed or evicted, until its cache drops them.
	taken map[string]time.Time
	// queued: pools waiting in kicks.
	queued map[string]bool
}

func newWarmPools(opts Options, kv jetstream.KeyValue) *warmPools {
	factory := informers.NewSharedInformerFactoryWithOptions(opts.Clientset, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = policy.LabelWarmPool }))
	pods := factory.Core().V1().Pods().Informer()
	observer := opts.WarmObserver
	if observer == nil {
		observer = noWarmObserver{}
	}
	p := &warmPools{
		opts: opts.Warm, key: opts.SandboxKey, binder: opts.Bind, cs: opts.Clientset, kv: kv, factory: factory, pods: pods,
		log: opts.Logger.With().Str("part", "warm").Logger(), now: opts.Now, newID: opts.NewID, observer: observer,
		replica: opts.NewID().String(), kicks: make(chan string, 1024),
		taken: map[string]time.Time{}, queued: map[string]bool{},
	}
	_ = pods.AddIndexers(cache.Indexers{poolIndex: func(obj any) ([]string, error) {
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return nil, nil
		}
		return []string{pod.Namespace + "/" + pod.Labels[policy.LabelWarmPool]}, nil
	}})
	return p
}

type noWarmObserver struct{}

func (noWarmObserver) WarmAcquire(bool) {}
func (noWarmObserver) WarmPods(int)     {}

// start fills the cache of warm pods and returns once it is synced; the cache runs until ctx
// ends or run returns.
func (p *warmPools) start(ctx context.Context) error {
	ctx, p.stopCache = context.WithCancel(ctx)
	p.factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), p.pods.HasSynced) {
		return fmt.Errorf("syncing the cache of warm pods: %w", context.Cause(ctx))
	}
	return nil
}

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
	pods := p.pods.GetStore().List()
	for _, obj := range pods {
		pod := obj.(*corev1.Pod)
		key := poolKey(pod.Labels[policy.LabelCompanyID], pod.Labels[policy.LabelWarmPool])
		if pools[key] || pod.DeletionTimestamp != nil || now.Sub(pod.CreationTimestamp.Time) < warmPendingTTL || !p.take(pod, now) {
			continue
		}
		if err := workload.EvictWarmPod(ctx, p.cs, pod); err != nil {
			p.log.Warn().Err(err).Str("pool", key).Msg("evicting a warm pod of no pool failed")
		}
	}
	p.observer.WarmPods(len(pods))
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
