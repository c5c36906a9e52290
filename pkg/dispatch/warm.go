package dispatch

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
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
//
// This file holds the pools' settings, records and cache; warmclaim.go is an acquire's side
// (eligibility, claim, bind, eviction for quota), warmpool.go the pools' upkeep (demand,
// maintenance, refill).

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
	// WarmPods reports the unbound warm pods the replica's cache holds, by company.
	WarmPods(byCompany map[string]int)
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

func (noWarmObserver) WarmPods(map[string]int) {}

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
