package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// warmConfig is backend pod on the sandbox image, not reusable; mark goes into the run's
// environment (defaultEnv, the run Secret, the bind), cpu sets the pod's shape.
func warmConfig(mark, cpu string) json.RawMessage {
	return pipelinetest.StubConfig(map[string]string{"WARM_MARK": mark}, func(c map[string]any) {
		c["backend"] = "pod"
		c["podActivityDeadlineSec"] = 600
		c["adapters"].([]any)[0].(map[string]any)["runtimeImage"] = sandboxImage
		c["defaultResources"].(map[string]any)["requests"] = map[string]string{"cpu": cpu, "memory": "128Mi"}
	})
}

// startWarmEnv is a reuseEnv whose dispatcher keeps warm pools of at most max pods, each
// company's pinned at min (so a pool's size does not depend on the acquire rate).
func startWarmEnv(t *testing.T, max int, quota corev1.ResourceList, companies ...string) *reuseEnv {
	t.Helper()
	pinned := map[string]int{}
	for _, c := range companies {
		pinned[c] = max
	}
	return startEnv(t, func(o *Options) {
		o.Warm, o.Bind = WarmOptions{Max: max, Min: pinned}, bindTCP
		o.Operator.TenantQuota = quota
	})
}

// bindTCP is the Binder cmd/dispatcher wires, but for the terminal error it makes of a pod bound
// elsewhere.
func bindTCP(ctx context.Context, addr string, bindSeed, leaseSeed []byte, env map[string]string) error {
	return sandboxd.Bind(ctx, sandboxd.DialTCP(addr), bindSeed, leaseSeed, env)
}

// acquireWarm publishes a (non-reusable) pod acquire of company with config cfg and returns
// it.
func (e *reuseEnv) acquireWarm(t *testing.T, company string, cfg json.RawMessage) events.AcquireRequest {
	t.Helper()
	req := events.AcquireRequest{
		RunID: pipelinetest.NewID("run"), CompanyID: company, EnvironmentID: "env-1", AgentID: pipelinetest.NewID("agent"), Config: cfg,
	}
	e.publish(t, req)
	return req
}

func refOf(req events.AcquireRequest) events.RunRef { return events.Ref(req.CompanyID, req.RunID) }

// warmPods lists the unbound warm pods of namespace, and how many of them are Ready.
func (e *reuseEnv) warmPods(t *testing.T, namespace string) (pods []corev1.Pod, ready int) {
	t.Helper()
	list, err := e.cs.CoreV1().Pods(namespace).List(t.Context(), metav1.ListOptions{LabelSelector: policy.LabelWarmPool})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range list.Items {
		if p.DeletionTimestamp != nil {
			continue
		}
		pods = append(pods, p)
		if readyWarm(&p, p.Labels[policy.LabelCompanyID], p.Labels[policy.LabelWarmPool]) {
			ready++
		}
	}
	return pods, ready
}

// waitWarm waits until namespace holds n Ready warm pods (and no more than n warm pods).
func (e *reuseEnv) waitWarm(t *testing.T, namespace string, n int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	deadline := time.Now().Add(90 * time.Second)
	for {
		var ready int
		pods, ready = e.warmPods(t, namespace)
		if ready == n && len(pods) == n {
			return pods
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace %s: %d warm pods, %d Ready, want %d Ready", namespace, len(pods), ready, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sandboxdRun runs sh -c script through pod's sandboxd with seed's key and token and returns its
// stdout and exit code.
func sandboxdRun(ctx context.Context, pod *corev1.Pod, seed []byte, script string) (string, int, error) {
	c, err := sandboxd.NewClient(sandboxd.ClientOptions{
		Dial: sandboxd.DialTCP(net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(policy.SandboxdPort))),
		TLS:  sandboxd.ClientTLSConfig(seed), Token: sandboxd.ClientToken(seed),
	})
	if err != nil {
		return "", 0, err
	}
	defer c.Close()
	id := pipelinetest.NewID("exec")
	if _, err := c.Start(ctx, sandboxd.Spec{ID: id, Command: "sh", Args: []string{"-c", script}}); err != nil {
		return "", 0, err
	}
	s, err := c.Output(ctx, id, 1)
	if err != nil {
		return "", 0, err
	}
	defer s.Close()
	var out []byte
	for {
		f, err := s.Next()
		if err != nil {
			return string(out), 0, err
		}
		switch f := f.(type) {
		case *sandboxd.Chunk:
			if f.Stream == sandboxd.Stdout {
				out = append(out, f.Data...)
			}
		case *execspec.Exit:
			code := -1
			if f.ExitCode != nil {
				code = *f.ExitCode
			}
			return string(out), code, nil
		}
	}
}

// TestWarmAcquireBindsAReadyPod: with warm pools on, a company's first acquire is created cold
// and starts its pool; the next acquire of the same shape gets a warm pod (created says warm,
// Running), bound to it alone: the run's labels, the lease's sandboxd key (the bind key refused
// from then on), the run's environment in its commands. Its release deletes the pod, which
// never goes back to the pool, and the pool refills behind it.
func TestWarmAcquireBindsAReadyPod(t *testing.T) {
	company := pipelinetest.NewID("co")
	e := startWarmEnv(t, 1, nil, company)
	pipelinetest.CleanupTenant(t, e.cs, company)

	first := e.acquireWarm(t, company, warmConfig("m1", "100m"))
	created, _ := e.next(t, refOf(first), events.KindCreated, 0)
	if created["warm"] != nil {
		t.Fatalf("the company's first acquire: %v, want a cold create", created)
	}
	ns := created["namespace"].(string)
	warm := e.waitWarm(t, ns, 1)[0]

	ref := e.acquireWarm(t, company, warmConfig("m2", "100m"))
	created, _ = e.next(t, refOf(ref), events.KindCreated, 0)
	if created["warm"] != true || created["workloadName"] != warm.Name || created["phase"] != string(events.PhaseRunning) {
		t.Fatalf("created %v, want warm pod %s, Running", created, warm.Name)
	}
	rec := e.record(t, refOf(ref))
	if !rec.Warm || rec.WorkloadName != warm.Name {
		t.Fatalf("lease record %+v, want warm on pod %s", rec, warm.Name)
	}
	pod, err := e.cs.CoreV1().Pods(ns).Get(t.Context(), warm.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.UID != warm.UID || pod.Labels[policy.LabelRunID] != ref.RunID || pod.Labels[policy.LabelManagedBy] != policy.ManagedBy ||
		pod.Labels[policy.LabelWarmPool] != "" || pod.Spec.ActiveDeadlineSeconds == nil {
		t.Fatalf("bound pod: uid %s (warm %s), labels %v, deadline %v", pod.UID, warm.UID, pod.Labels, pod.Spec.ActiveDeadlineSeconds)
	}

	leaseSeed := execspec.DeriveSeed(e.d.opts.SandboxKey, ns, pod.Name)
	out, code, err := sandboxdRun(t.Context(), pod, leaseSeed, `echo "$WARM_MARK ${BOOTSTRAP_TOKEN:+token} ${KUBECLIP_SANDBOXD_SEED:-noseed}"`)
	if err != nil || code != 0 || out != "m2 token noseed\n" {
		t.Fatalf("a command through the lease's key: %q, exit %d, %v; want the run's env, no seed", out, code, err)
	}
	bindSeed := execspec.DeriveBindSeed(e.d.opts.SandboxKey, ns, pod.Name)
	if _, _, err := sandboxdRun(t.Context(), pod, bindSeed, "true"); !errors.Is(err, sandboxd.ErrServerKeyMismatch) {
		t.Fatalf("a command through the bind key after the bind: %v, want ErrServerKeyMismatch", err)
	}
	if _, err := e.cs.CoreV1().Secrets(ns).Get(t.Context(), policy.WarmSecretName(pod.Name), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the bound pod's bind Secret: %v, want it deleted", err)
	}
	eventually(t, "the run Secret, owned by the bound pod", func() bool {
		secret, err := e.cs.CoreV1().Secrets(ns).Get(t.Context(), rec.SecretName, metav1.GetOptions{})
		return err == nil && len(secret.OwnerReferences) == 1 && secret.OwnerReferences[0].UID == pod.UID
	})

	// The pool's record counts the company's cold first acquire and its hit (ReadWarmPools:
	// kubeclip_warm_pool_acquires).
	eventually(t, "the pool's record counting one miss and one hit", func() bool {
		pools, err := ReadWarmPools(t.Context(), e.d.warm.kv)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Contains(pools, WarmPoolStats{CompanyID: company, Hits: 1, Misses: 1})
	})

	refill := e.waitWarm(t, ns, 1)[0]
	if refill.Name == pod.Name {
		t.Fatal("the bound pod is back in the pool")
	}
	e.publish(t, events.ReleaseRequest{RunID: ref.RunID, CompanyID: company, ProviderLeaseID: pod.Name})
	e.next(t, refOf(ref), events.KindReleased, 0)
	if _, err := e.cs.CoreV1().Pods(ns).Get(t.Context(), pod.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the released warm lease's pod: %v, want it deleted", err)
	}
	if pods, _ := e.warmPods(t, ns); len(pods) != 1 || pods[0].Name != refill.Name {
		t.Fatalf("warm pods after the release: %v, want only %s", podNames(pods), refill.Name)
	}
}

func podNames(pods []corev1.Pod) []string {
	names := make([]string, len(pods))
	for i, p := range pods {
		names[i] = p.Name
	}
	return names
}

// TestTwoClaimsNeverBindOnePod: two dispatchers (two caches) claim the one Ready warm pod at
// once for two runs: exactly one gets it, the other finds none; and a claim written at a stale
// resourceVersion loses (workload.ErrWarmTaken), so a pod, once bound, never serves another run.
func TestTwoClaimsNeverBindOnePod(t *testing.T) {
	company := pipelinetest.NewID("co")
	e := startWarmEnv(t, 1, nil, company)
	pipelinetest.CleanupTenant(t, e.cs, company)
	first := e.acquireWarm(t, company, warmConfig("m", "100m"))
	created, _ := e.next(t, refOf(first), events.KindCreated, 0)
	ns := created["namespace"].(string)
	warm := e.waitWarm(t, ns, 1)[0]
	// The pool's own replica would replace a pod claimed here; stop it from maintaining.
	e.stopWarmPools(t, company)

	spec := e.warmSpecOf(t, first)
	a, _ := e.otherReplica(t)
	b, _ := e.otherReplica(t)
	replicas := []*warmPools{a, b}
	got := make([]*corev1.Pod, len(replicas))
	errs := make([]error, len(replicas))
	var wg sync.WaitGroup
	for i, p := range replicas {
		run := spec
		run.RunID = pipelinetest.NewID("run")
		wg.Go(func() { got[i], errs[i] = p.claim(t.Context(), run) })
	}
	wg.Wait()
	var winners []string
	for i := range replicas {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		if got[i] != nil {
			winners = append(winners, got[i].Labels[policy.LabelRunID])
		}
	}
	if len(winners) != 1 {
		t.Fatalf("%d claims won the one warm pod (runs %v), want exactly 1", len(winners), winners)
	}

	stale := warm.DeepCopy()
	run := spec
	run.RunID, run.WorkloadName = pipelinetest.NewID("run"), warm.Name
	policy.BindWarmPod(stale, run, time.Now())
	if _, err := workload.ClaimWarmPod(t.Context(), e.cs, stale); !errors.Is(err, workload.ErrWarmTaken) {
		t.Fatalf("a claim of the bound pod at its warm resourceVersion: %v, want ErrWarmTaken", err)
	}
	pod, err := e.cs.CoreV1().Pods(ns).Get(t.Context(), warm.Name, metav1.GetOptions{})
	if err != nil || pod.Labels[policy.LabelRunID] != winners[0] {
		t.Fatalf("the pod is bound to %q (%v), want %s", pod.Labels[policy.LabelRunID], err, winners[0])
	}
}

// TestWarmPodOfAnotherCompanyIsNeverBound: company B's acquire of the very shape company A's
// pool holds is created cold in B's namespace; and a claim that names A's namespace for B's run
// (as a bug or a forged record would) finds nothing, since a warm pod is its company's.
func TestWarmPodOfAnotherCompanyIsNeverBound(t *testing.T) {
	a, b := pipelinetest.NewID("co"), pipelinetest.NewID("co")
	e := startWarmEnv(t, 1, nil, a)
	pipelinetest.CleanupTenant(t, e.cs, a)
	pipelinetest.CleanupTenant(t, e.cs, b)
	first := e.acquireWarm(t, a, warmConfig("m", "100m"))
	created, _ := e.next(t, refOf(first), events.KindCreated, 0)
	nsA := created["namespace"].(string)
	warm := e.waitWarm(t, nsA, 1)[0]

	ref := e.acquireWarm(t, b, warmConfig("m", "100m"))
	created, _ = e.next(t, refOf(ref), events.KindCreated, 0)
	if created["warm"] != nil || created["namespace"] == nsA {
		t.Fatalf("company B's acquire: %v, want a cold create in its own namespace", created)
	}

	spec := e.warmSpecOf(t, ref)
	spec.Namespace = nsA
	if pod, err := e.d.warm.claim(t.Context(), spec); err != nil || pod != nil {
		t.Fatalf("a claim for company B in A's namespace: %v, %v; want none", pod, err)
	}
	pod, err := e.cs.CoreV1().Pods(nsA).Get(t.Context(), warm.Name, metav1.GetOptions{})
	if err != nil || pod.Labels[policy.LabelWarmPool] == "" || pod.Labels[policy.LabelRunID] != "" {
		t.Fatalf("company A's warm pod after B's acquire: labels %v, %v; want it unbound", pod.Labels, err)
	}
}

// TestQuotaEvictsWarmPodsFirst: a tenant whose quota fits two pods holds one live lease and one
// warm pod; an acquire of another shape (no warm pod can serve it) would exceed the quota: the
// warm pod is evicted for it and the acquire is created, never failed with quota_exceeded.
func TestQuotaEvictsWarmPodsFirst(t *testing.T) {
	company := pipelinetest.NewID("co")
	e := startWarmEnv(t, 1, corev1.ResourceList{corev1.ResourcePods: resource.MustParse("2")}, company)
	pipelinetest.CleanupTenant(t, e.cs, company)
	first := e.acquireWarm(t, company, warmConfig("m", "100m"))
	created, _ := e.next(t, refOf(first), events.KindCreated, 0)
	ns := created["namespace"].(string)
	warm := e.waitWarm(t, ns, 1)[0]
	countedByQuota(t, e.cs, ns, 2)

	ref := e.acquireWarm(t, company, warmConfig("m", "110m"))
	if got, _ := e.next(t, refOf(ref), events.KindCreated, 0); got["warm"] != nil {
		t.Fatalf("an acquire of another shape: %v, want a cold create", got)
	}
	if _, err := e.cs.CoreV1().Pods(ns).Get(t.Context(), warm.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the warm pod after the quota refused a real acquire: %v, want it evicted", err)
	}
	if pods, _ := e.warmPods(t, ns); len(pods) != 0 {
		t.Fatalf("warm pods after the eviction: %v, want none while the quota is full", podNames(pods))
	}
	if rec := e.record(t, refOf(ref)); rec.State != lease.StateCreated {
		t.Fatalf("the acquire's lease is %s, want created", rec.State)
	}
}

// countedByQuota waits until the tenant's quota counts pods pods, the count the refusal a test is
// about needs. The quota controller computes a quota's usage from its pod informer and may write
// a count that lags the pods just created over the admission plugin's; it counts again only when
// a pod ends, the quota's hard limits change, or at its resync (5 minutes). So while the count is
// short this asks for a recount by changing a hard limit no tenant pod uses.
func countedByQuota(t *testing.T, cs kubernetes.Interface, ns string, pods int64) {
	t.Helper()
	recounts := 0
	eventually(t, fmt.Sprintf("the tenant's quota counting %d pods", pods), func() bool {
		q, err := cs.CoreV1().ResourceQuotas(ns).Get(t.Context(), policy.TenantResourceQuota, metav1.GetOptions{})
		if err != nil {
			return false
		}
		if used := q.Status.Used[corev1.ResourcePods]; used.Value() == pods {
			return true
		}
		recounts++
		q.Spec.Hard[corev1.ResourceName("count/configmaps")] = *resource.NewQuantity(int64(1000+recounts), resource.DecimalSI)
		_, _ = cs.CoreV1().ResourceQuotas(ns).Update(t.Context(), q, metav1.UpdateOptions{}) // a conflict: the next look tries again
		time.Sleep(200 * time.Millisecond)
		return false
	})
}

// TestIdleCompanyPoolDrains: a pool whose company acquired nothing for the idle window is
// drained to nothing (no pinned minimum) and its record forgotten.
func TestIdleCompanyPoolDrains(t *testing.T) {
	e := startEnv(t, func(o *Options) { o.Warm, o.Bind = WarmOptions{Max: 1, Idle: time.Minute}, bindTCP })
	company := pipelinetest.NewID("co")
	pipelinetest.CleanupTenant(t, e.cs, company)
	first := e.acquireWarm(t, company, warmConfig("m", "100m"))
	created, _ := e.next(t, refOf(first), events.KindCreated, 0)
	ns := created["namespace"].(string)
	e.waitWarm(t, ns, 1)

	key := poolKey(company, policy.WarmShape(e.warmSpecOf(t, first)))
	e.clock.add(time.Minute)
	eventually(t, "the idle pool drained", func() bool {
		if err := e.d.warm.maintain(t.Context(), key); err != nil {
			t.Fatal(err)
		}
		pods, _ := e.warmPods(t, ns)
		_, err := e.d.warm.kv.Get(t.Context(), key)
		return len(pods) == 0 && errors.Is(err, jetstream.ErrKeyNotFound)
	})
}

// TestLaggingReplicaCountsThePodsMadeElsewhere: a replica whose cache has not seen the pods
// another replica just made (a watch is behind) still counts them, from the pool record's made
// list, so it does not make the pool larger than its target; and the maintainer records what
// it made there.
func TestLaggingReplicaCountsThePodsMadeElsewhere(t *testing.T) {
	e := startEnv(t, func(o *Options) { o.Warm, o.Bind = WarmOptions{Max: 2}, bindTCP })
	company := pipelinetest.NewID("co")
	pipelinetest.CleanupTenant(t, e.cs, company)
	lagging, stop := e.otherReplica(t)
	stop() // its cache stays as it is now: no warm pod of this company
	first := e.acquireWarm(t, company, warmConfig("m", "100m"))
	created, _ := e.next(t, refOf(first), events.KindCreated, 0)
	ns := created["namespace"].(string)
	key := poolKey(company, policy.WarmShape(e.warmSpecOf(t, first)))
	var rec poolRecord
	eventually(t, "the pool's pods recorded as made", func() bool {
		entry, err := e.d.warm.kv.Get(t.Context(), key)
		if err != nil {
			return false
		}
		rec = poolRecord{}
		return json.Unmarshal(entry.Value(), &rec) == nil && len(rec.Made) == 2
	})
	shape := policy.WarmShape(rec.Spec)
	if alive, _, _ := lagging.poolPods(ns, shape, nil, e.clock.Now()); len(alive) != 0 {
		t.Fatalf("the lagging cache shows %d pods; the test needs it behind", len(alive))
	}
	alive, _, left := lagging.poolPods(ns, shape, rec.Made, e.clock.Now())
	if len(alive) != 2 || len(left) != 2 {
		t.Fatalf("a lagging replica counts %d live pods (%d still made), want the 2 made elsewhere", len(alive), len(left))
	}
}

// TestCompanyPoolsAreBounded: a company whose acquires ask for ever new shapes gets at most
// maxWarmPoolsPerCompany pools (records in the shared bucket); a further shape is not warmed,
// while another company still gets its own.
func TestCompanyPoolsAreBounded(t *testing.T) {
	e := startEnv(t, func(o *Options) { o.Warm, o.Bind = WarmOptions{Max: 1}, bindTCP })
	// A namespace that does not exist: the pools' pods cannot be made, their records can.
	spec := policy.RunSpec{CompanyID: pipelinetest.NewID("co"), Namespace: pipelinetest.NewID("kubeclip-none"), SandboxdImage: e.d.opts.SandboxdImage}
	var cfg policy.Config
	if err := json.Unmarshal(warmConfig("m", "100m"), &cfg); err != nil {
		t.Fatal(err)
	}
	spec.Config = cfg
	for i := range maxWarmPoolsPerCompany + 2 {
		s := spec
		s.Image = sandboxImage + "-" + strconv.Itoa(i)
		e.d.warm.noteAcquire(t.Context(), s, false)
	}
	other := spec
	other.CompanyID = pipelinetest.NewID("co")
	e.d.warm.noteAcquire(t.Context(), other, false)
	count := func(company string) int {
		keys, err := e.d.warm.kv.ListKeysFiltered(t.Context(), poolKey(company, "*"))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for range keys.Keys() {
			n++
		}
		return n
	}
	if got := count(spec.CompanyID); got != maxWarmPoolsPerCompany {
		t.Errorf("a company with %d shapes has %d pools, want %d", maxWarmPoolsPerCompany+2, got, maxWarmPoolsPerCompany)
	}
	if got := count(other.CompanyID); got != 1 {
		t.Errorf("another company has %d pools, want 1", got)
	}
}

// TestPassEvictsWarmPodsOfNoPool: a warm pod whose pool has no record (deleted while the pod was
// made, or lost) is evicted by the next pass once it is older than warmPendingTTL, not left to
// hold the tenant's quota.
func TestPassEvictsWarmPodsOfNoPool(t *testing.T) {
	company := pipelinetest.NewID("co")
	e := startWarmEnv(t, 1, nil, company)
	pipelinetest.CleanupTenant(t, e.cs, company)
	first := e.acquireWarm(t, company, warmConfig("m", "100m"))
	created, _ := e.next(t, refOf(first), events.KindCreated, 0)
	ns := created["namespace"].(string)
	spec := e.warmSpecOf(t, first)
	spec.Image += "-nopool" // a shape no acquire asked for
	name := policy.WorkloadName(e.d.opts.NewID())
	pod, secret := policy.RenderWarmPod(spec, name, execspec.DeriveBindSeed(e.d.opts.SandboxKey, ns, name))
	if err := workload.CreateWarmPod(t.Context(), e.cs, pod, secret); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the stray pod in the cache", func() bool {
		_, ok, _ := e.d.warm.pods.GetStore().GetByKey(ns + "/" + name)
		return ok
	})
	e.d.warm.pass(t.Context())
	if _, err := e.cs.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{}); err != nil {
		t.Fatalf("a young pod of no pool: %v, want it left (its record may be on its way)", err)
	}
	e.clock.add(warmPendingTTL + time.Second)
	e.d.warm.pass(t.Context())
	eventually(t, "the stray pod gone", func() bool {
		_, err := e.cs.CoreV1().Pods(ns).Get(t.Context(), name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

// warmSpecOf is the warm spec of req, as the dispatcher computes it.
func (e *reuseEnv) warmSpecOf(t *testing.T, req events.AcquireRequest) policy.RunSpec {
	t.Helper()
	plan, err := lease.New(req, e.clock.Now(), e.d.opts.Operator)
	if err != nil {
		t.Fatal(err)
	}
	return e.d.warmSpec(plan)
}

// otherReplica is the warm pools of another dispatcher replica: its own cache, the same bucket.
// stop stops its cache, which then keeps what it holds.
func (e *reuseEnv) otherReplica(t *testing.T) (p *warmPools, stop func()) {
	t.Helper()
	p = newWarmPools(e.d.opts, e.d.warm.kv)
	stop = func() { p.stopCache(); p.factory.Shutdown() }
	t.Cleanup(stop)
	if err := p.start(t.Context()); err != nil {
		t.Fatal(err)
	}
	return p, stop
}

// stopWarmPools holds company's pools' maintenance locks for the test, as if another replica
// maintained them, so the dispatcher's own passes leave them alone: each lock is taken once the
// pass holding it (if any) is over.
func (e *reuseEnv) stopWarmPools(t *testing.T, company string) {
	t.Helper()
	keys, err := e.d.warm.kv.ListKeys(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for key := range keys.Keys() {
		if c, _, ok := splitPoolKey(key); ok && c == company {
			eventually(t, "the lock of pool "+key, func() bool {
				_, err := e.d.warm.kv.Create(t.Context(), warmLockPrefix+key, []byte("test"), jetstream.KeyTTL(time.Hour))
				return err == nil
			})
		}
	}
}
