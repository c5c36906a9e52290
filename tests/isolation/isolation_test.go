package isolation

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// sleeping is a stub run that stays alive until it is released.
func sleeping(mutate ...func(map[string]any)) json.RawMessage {
	return pt.StubConfig(map[string]string{"STUB_LINES": "1", "STUB_SLEEP": "10m"}, mutate...)
}

func withConfig(kv ...any) func(map[string]any) {
	return func(c map[string]any) {
		for i := 0; i+1 < len(kv); i += 2 {
			c[kv[i].(string)] = kv[i+1]
		}
	}
}

// waitFailed waits for the run's failed event of request.
func waitFailed(t *testing.T, r *pt.Run, request events.LeaseKind) events.RunFailedEvent {
	t.Helper()
	var failed events.RunFailedEvent
	r.WaitFor(runTimeout, "failed "+string(request), func(evs []events.Received) bool {
		for _, f := range pt.Only[events.RunFailedEvent](evs) {
			if f.Request == request {
				failed = f
				return true
			}
		}
		return false
	})
	return failed
}

func checkFailed(t *testing.T, f events.RunFailedEvent, code events.Code, field string) {
	t.Helper()
	if f.Code != code || f.Field != field {
		t.Errorf("failed = %s at %q (%s), want %s at %q", f.Code, f.Field, f.Message, code, field)
	}
}

// TestNamespaceEscapesAreRefused is issue 8's headline: one ordinary acquire with
// {"namespacePrefix":"kube-","companySlug":"system"} took over kube-system. Every way for a
// company's config to name a namespace that is not its own tenant is refused with
// namespace_not_allowed, naming the field, before anything is applied.
func TestNamespaceEscapesAreRefused(t *testing.T) {
	cs := clustertest.Clientset(t)
	ctx := t.Context()
	owner := pt.NewID("co")
	pt.CleanupTenant(t, cs, owner)
	ownerRun := env.Acquire(t, owner, pt.NewID("agent"), sleeping())
	ownerCreated := pt.WaitKind[events.RunCreatedEvent](ownerRun, runTimeout)
	t.Cleanup(func() { ownerRun.Release(ownerCreated.ProviderLeaseID, true) })
	ownerSlug := strings.TrimPrefix(ownerCreated.Namespace, policy.DefaultNamespacePrefix)

	foreign := "paperclip-foreign-" + strings.ToLower(pt.NewID("x")[2:12])
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: foreign}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), foreign, metav1.DeleteOptions{}) })

	tests := []struct {
		name      string
		config    map[string]any
		target    string // the namespace the config names
		wantField string
	}{
		{"kube-system", map[string]any{"namespacePrefix": "kube-", "companySlug": "system"}, "kube-system", "config.namespacePrefix"},
		{"kubeclip's own namespace", map[string]any{"companySlug": "ops"}, opsNamespace, "config.companySlug"},
		{"another company's tenant", map[string]any{"companySlug": ownerSlug}, ownerCreated.Namespace, "config.companySlug"},
		{"an existing namespace that is no tenant", map[string]any{"companySlug": strings.TrimPrefix(foreign, "paperclip-")}, foreign, "config.companySlug"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			attacker := pt.NewID("co")
			before := namespaceState(t, cs, tc.target)
			r := env.Acquire(t, attacker, pt.NewID("agent"), sleeping(func(c map[string]any) {
				for k, v := range tc.config {
					c[k] = v
				}
			}))
			checkFailed(t, waitFailed(t, r, events.LeaseAcquire), events.CodeNamespaceNotAllowed, tc.wantField)
			if pt.Has[events.RunCreatedEvent](r.Events()) {
				t.Errorf("the attacker's run was created")
			}
			if after := namespaceState(t, cs, tc.target); after != before {
				t.Errorf("namespace %s changed:\nbefore %s\nafter  %s", tc.target, before, after)
			}
		})
	}

	// A company cannot mint namespaces to escape its quota: the fourth slug is refused.
	t.Run("unlimited namespaces", func(t *testing.T) {
		company := pt.NewID("co")
		for i := range 4 {
			slug := fmt.Sprintf("%s-%d", strings.ToLower(company[3:13]), i)
			ns := policy.DefaultNamespacePrefix + slug
			t.Cleanup(func() { _ = cs.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
			r := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(map[string]string{"STUB_LINES": "1"}, withConfig("companySlug", slug)))
			if i < 3 {
				pt.WaitKind[events.RunResultEvent](r, runTimeout)
				continue
			}
			checkFailed(t, waitFailed(t, r, events.LeaseAcquire), events.CodeNamespaceNotAllowed, "config.companySlug")
			if _, err := cs.CoreV1().Namespaces().Get(t.Context(), ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Errorf("namespace %s over the cap: %v, want NotFound", ns, err)
			}
		}
	})
}

// namespaceState is what a takeover would change of ns: its labels, quotas and policies.
func namespaceState(t *testing.T, cs kubernetes.Interface, ns string) string {
	t.Helper()
	ctx := t.Context()
	obj, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "absent"
	}
	if err != nil {
		t.Fatal(err)
	}
	quotas, err := cs.CoreV1().ResourceQuotas(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	policies, err := cs.NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	jobs, err := cs.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("labels %v, %d quotas, %d network policies, %d jobs", obj.Labels, len(quotas.Items), len(policies.Items), len(jobs.Items))
}

// TestWorkerEnvironmentIsNeverCopied: adapters[].envKeys naming a variable of the dispatcher's
// own environment (its NATS password, any operator key) copied its value into the run's Secret,
// in a pod running the company's image. Only the adapters' keys are handed out.
func TestWorkerEnvironmentIsNeverCopied(t *testing.T) {
	cs := clustertest.Clientset(t)
	for _, key := range []string{"KUBECLIP_SHADOW_SECRET", "KUBECLIP_NATS_PASSWORD", "AWS_SECRET_ACCESS_KEY", "PATH"} {
		t.Run(key, func(t *testing.T) {
			company := pt.NewID("co")
			pt.CleanupTenant(t, cs, company)
			r := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(nil, func(c map[string]any) {
				c["adapters"].([]any)[0].(map[string]any)["envKeys"] = []string{"ANTHROPIC_API_KEY", key}
			}))
			checkFailed(t, waitFailed(t, r, events.LeaseAcquire), events.CodeInvalidConfig, "config.adapters[0].envKeys[1]")
			if f := waitFailed(t, r, events.LeaseAcquire); strings.Contains(f.Message, operatorSecret) {
				t.Errorf("the failure quotes the secret: %q", f.Message)
			}
		})
	}
	// The adapter's own key still reaches the run, and nothing else of the worker does.
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	r := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(map[string]string{"STUB_LINES": "1"}))
	created := pt.WaitKind[events.RunCreatedEvent](r, runTimeout)
	secret, err := cs.CoreV1().Secrets(created.Namespace).Get(t.Context(), created.SecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if string(secret.Data["ANTHROPIC_API_KEY"]) != "sk-ant-isolation" {
		t.Errorf("the adapter's key did not reach the run's Secret")
	}
	for k, v := range secret.Data {
		if string(v) == operatorSecret {
			t.Errorf("the run's Secret holds the operator's secret under %s", k)
		}
	}
	pt.WaitKind[events.RunResultEvent](r, runTimeout)
}

// TestReleaseIsScopedByCompany is issue 8.1: company B could release or destroy company A's
// run, and a release for a run with no record yet pre-empted it. (Issue 29: B's destroy is
// answered with a receipt that B has no such lease, not refused.)
func TestReleaseIsScopedByCompany(t *testing.T) {
	cs := clustertest.Clientset(t)
	a, b := pt.NewID("co"), pt.NewID("co")
	pt.CleanupTenant(t, cs, a)
	runA := env.Acquire(t, a, pt.NewID("agent"), sleeping())
	createdA := pt.WaitKind[events.RunCreatedEvent](runA, runTimeout)
	t.Cleanup(func() { runA.Release(createdA.ProviderLeaseID, true) })

	// B destroys A's run id, naming A's lease, on B's own subject: B has no such lease, and is
	// told so with a receipt that nothing was there (unknown), which ends nothing of A's.
	asB := env.NewRun(t, b, runA.AgentID)
	asB.RunID = runA.RunID
	asB.Collect()
	asB.Release(createdA.ProviderLeaseID, true)
	if rel := pt.WaitKind[events.RunReleasedEvent](asB, runTimeout); !rel.Unknown || rel.State != events.ReleaseDestroyed || rel.ProviderLeaseID != createdA.ProviderLeaseID {
		t.Errorf("company B's destroy of company A's lease: %+v, want released destroyed, unknown, naming the lease B named", rel)
	}

	// A's run goes on: no released, its pod still there.
	time.Sleep(2 * time.Second) // what a wrongful release would have needed to act
	if pt.Has[events.RunReleasedEvent](runA.Events()) {
		t.Fatalf("company B's destroy released company A's run")
	}
	pods, err := cs.CoreV1().Pods(createdA.Namespace).List(t.Context(), metav1.ListOptions{LabelSelector: policy.LabelRunID + "=" + runA.RunID})
	if err != nil || len(pods.Items) == 0 {
		t.Errorf("company A's pod after company B's destroy: %d pods (%v), want it running", len(pods.Items), err)
	}

	// A release for a run that has no lease is refused and does not pre-empt it.
	c := pt.NewID("co")
	pt.CleanupTenant(t, cs, c)
	early := env.NewRun(t, c, pt.NewID("agent"))
	early.Collect()
	early.Release("", false)
	checkFailed(t, waitFailed(t, early, events.LeaseRelease), events.CodeLeaseNotFound, "runId")
	early.PublishAcquire(pt.StubConfig(map[string]string{"STUB_LINES": "1"}), true)
	if res := pt.WaitKind[events.RunResultEvent](early, runTimeout); res.Outcome != events.OutcomeSucceeded {
		t.Errorf("the run released before it existed: result %+v, want it to run", res)
	}
}

// TestFailureSubjectComesFromTheSubject is issue 8.2: a malformed request on company B's subject
// whose ce-source header names company A's run wrote `failed` into A's run.
func TestFailureSubjectComesFromTheSubject(t *testing.T) {
	a, b := pt.NewID("co"), pt.NewID("co")
	victim := env.NewRun(t, a, pt.NewID("agent"))
	victim.Collect()
	attacker := env.NewRun(t, b, pt.NewID("agent"))
	attacker.RunID = victim.RunID
	attacker.Collect()

	subj, _ := env.Subjects.Lease(b, events.LeaseAcquire)
	msg := nats.NewMsg(subj)
	msg.Header.Set(events.HeaderSource, events.Source(a, victim.RunID))
	msg.Header.Set(events.HeaderMsgID, "forged-"+victim.RunID)
	msg.Data = []byte(`{"runId":"` + victim.RunID + `","companyId":"` + b + `","environmentId":"e","agentId":"x","config":{"backend":"vm"}}`)
	if _, err := env.JS.PublishMsg(t.Context(), msg); err != nil {
		t.Fatal(err)
	}
	checkFailed(t, waitFailed(t, attacker, events.LeaseAcquire), events.CodeInvalidConfig, "config.backend")
	time.Sleep(time.Second)
	if evs := victim.Events(); len(evs) != 0 {
		t.Errorf("company A's run got %s from company B's request", pt.Describe(evs))
	}
}

// TestRunIDsAreScopedByCompany is issue 8.3: run ids were global keys. Company B acquiring with
// company A's run id got a Job labelled with A's run id, B's created disclosed A's namespace and
// lease, and the run-watcher decided A's run from B's pod.
func TestRunIDsAreScopedByCompany(t *testing.T) {
	cs := clustertest.Clientset(t)
	a, b := pt.NewID("co"), pt.NewID("co")
	pt.CleanupTenant(t, cs, a)
	pt.CleanupTenant(t, cs, b)
	runA := env.Acquire(t, a, pt.NewID("agent"), pt.StubConfig(map[string]string{"STUB_LINES": "2", "STUB_SLEEP": "3s"}))
	createdA := pt.WaitKind[events.RunCreatedEvent](runA, runTimeout)

	runB := env.NewRun(t, b, pt.NewID("agent"))
	runB.RunID = runA.RunID
	runB.PublishAcquire(pt.StubConfig(map[string]string{"STUB_LINES": "1", "STUB_EXIT_CODE": "3"}), true)
	runB.Collect()
	createdB := pt.WaitKind[events.RunCreatedEvent](runB, runTimeout)
	if createdB.Namespace == createdA.Namespace || createdB.ProviderLeaseID == createdA.ProviderLeaseID {
		t.Errorf("company B's created %+v shares company A's namespace or lease %+v", createdB, createdA)
	}
	resA := pt.WaitKind[events.RunResultEvent](runA, runTimeout)
	resB := pt.WaitKind[events.RunResultEvent](runB, runTimeout)
	if resA.Outcome != events.OutcomeSucceeded || resB.Outcome != events.OutcomeFailed || resB.ExitCode == nil || *resB.ExitCode != 3 {
		t.Errorf("results: A %s, B %s (exit %v); want each from its own pod: A succeeded, B failed with 3", resA.Outcome, resB.Outcome, resB.ExitCode)
	}
	if n := len(pt.All[events.RunResultEvent](runA)); n != 1 {
		t.Errorf("company A's run has %d results", n)
	}
}

// TestOneCompanyCannotStallAnother is issue 8.4: 256 dispatches waiting for a busy agent filled
// the consumer's MaxAckPending and another company's acquire waited more than 20 s. Waiting
// dispatches are parked outside the consumer: with a thousand of them waiting, another
// company's acquire takes about as long as before.
func TestOneCompanyCannotStallAnother(t *testing.T) {
	cs := clustertest.Clientset(t)
	busy, other := pt.NewID("co"), pt.NewID("co")
	pt.CleanupTenant(t, cs, busy)
	pt.CleanupTenant(t, cs, other)
	agent := pt.NewID("agent")
	holder := env.Acquire(t, busy, agent, sleeping())
	held := pt.WaitKind[events.RunCreatedEvent](holder, runTimeout)

	baseline := acquireLatency(t, other)

	const waiting = 1000
	var runs []*pt.Run
	for range waiting {
		r := env.NewRun(t, busy, agent)
		r.PublishAcquire(sleeping(), true)
		runs = append(runs, r)
	}
	t.Cleanup(func() {
		for _, r := range runs {
			r.Release("", true)
		}
		holder.Release(held.ProviderLeaseID, true)
	})
	parked, err := env.JS.Stream(t.Context(), "KUBECLIP_PARKED")
	if err != nil {
		t.Fatal(err)
	}
	pt.Eventually(t, 2*time.Minute, "a thousand dispatches parked", func() bool {
		info, err := parked.Info(t.Context())
		return err == nil && info.State.Msgs >= waiting
	})

	loaded := acquireLatency(t, other)
	t.Logf("another company's acquire → created: %s alone, %s with %d acquires waiting for a busy agent", baseline, loaded, waiting)
	if limit := max(3*baseline, baseline+2*time.Second); loaded > limit {
		t.Errorf("another company's acquire took %s with %d waiting, %s alone; want at most %s", loaded, waiting, baseline, limit)
	}
}

// acquireLatency is one acquire → created of company, for a new agent.
func acquireLatency(t *testing.T, company string) time.Duration {
	t.Helper()
	start := time.Now()
	r := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(map[string]string{"STUB_LINES": "1"}))
	pt.WaitKind[events.RunCreatedEvent](r, runTimeout)
	return time.Since(start)
}

// TestReplayingAFailedAcquireIsANoOp is issue 8.6: an acquire that failed before a lease record
// existed (agent_busy, internal) ran when it was replayed: `failed`, then `created` and a Job.
// Every acquire leaves a record, failed or ended, so a replay of any acquire does nothing. (A
// failure in the dispatcher, such as agent_busy, records the lease failed the same way:
// lease.RecordFailure.)
func TestReplayingAFailedAcquireIsANoOp(t *testing.T) {
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)

	// Refused outright (invalid config), and released while it waited for its busy agent.
	bad := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(nil, withConfig("egressMode", "open")))
	waitFailed(t, bad, events.LeaseAcquire)

	agent := pt.NewID("agent")
	holder := env.Acquire(t, company, agent, sleeping())
	held := pt.WaitKind[events.RunCreatedEvent](holder, runTimeout)
	waiting := env.Acquire(t, company, agent, pt.StubConfig(map[string]string{"STUB_LINES": "1"}))
	waiting.Release("", true)
	pt.WaitKind[events.RunReleasedEvent](waiting, runTimeout)
	holder.Release(held.ProviderLeaseID, true)
	pt.WaitKind[events.RunReleasedEvent](holder, runTimeout)

	for _, r := range []*pt.Run{bad, waiting} {
		before := len(r.Events())
		replay(t, r, pt.StubConfig(map[string]string{"STUB_LINES": "1"}))
		time.Sleep(3 * time.Second) // what a replayed run needs to be dispatched
		evs := r.Events()
		if pt.Has[events.RunCreatedEvent](evs) || len(evs) != before {
			t.Errorf("the replayed acquire of run %s did something: %s", r.RunID, pt.Describe(evs[before:]))
		}
	}
}

// replay publishes the run's acquire again under a new message id, as a recreated consumer
// delivering the stream again would hand it over.
func replay(t *testing.T, r *pt.Run, cfg json.RawMessage) {
	t.Helper()
	subj, _ := env.Subjects.Lease(r.CompanyID, events.LeaseAcquire)
	data, _ := json.Marshal(r.Request(cfg))
	msg := nats.NewMsg(subj)
	msg.Data = data
	msg.Header.Set(events.HeaderMsgID, r.RunID+".replay")
	if _, err := env.JS.PublishMsg(t.Context(), msg); err != nil {
		t.Fatal(err)
	}
}

// TestReleaseRacingItsDispatch is issue 8.8: a release racing an in-flight dispatch ended in
// `failed backend_unavailable` after `released`, or left the agent guard held. Releases sent
// the moment the lease exists, and a little later, catch the dispatch at every step; each run
// ends in one coherent outcome: released (after created, if created went out), no failure, no
// pod, and the agent free for its next run. (A release that comes before the acquire made its
// lease is refused, lease_not_found: TestReleaseIsScopedByCompany.)
func TestReleaseRacingItsDispatch(t *testing.T) {
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	agent := pt.NewID("agent")
	leases, err := env.JS.KeyValue(t.Context(), lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	const races = 10
	runs := make([]*pt.Run, races)
	for i := range races {
		r := env.NewRun(t, company, agent)
		runs[i] = r
		r.Collect()
		watch, err := leases.Watch(t.Context(), events.Ref(company, r.RunID).Key())
		if err != nil {
			t.Fatal(err)
		}
		r.PublishAcquire(sleeping(), true)
		for entry := range watch.Updates() {
			if entry != nil {
				break // the lease exists: its dispatch is on its way
			}
		}
		_ = watch.Stop()
		time.Sleep(time.Duration(i) * 20 * time.Millisecond)
		r.Release("", false)
	}
	ns := pt.NamespaceOf(t, company)
	for _, r := range runs {
		evs := r.WaitFor(runTimeout, "released", func(evs []events.Received) bool { return pt.Has[events.RunReleasedEvent](evs) })
		createdAt, releasedAt := -1, -1
		for i, e := range evs {
			switch ev := e.Event.(type) {
			case events.RunCreatedEvent:
				createdAt = i
			case events.RunReleasedEvent:
				releasedAt = i
			case events.RunFailedEvent:
				t.Errorf("run %s: failed %s (%s) in a release race", r.RunID, ev.Code, ev.Message)
			}
		}
		if createdAt > releasedAt {
			t.Errorf("run %s: created after released: %s", r.RunID, pt.Describe(evs))
		}
		pods, err := cs.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: policy.LabelRunID + "=" + r.RunID})
		if err != nil || len(pods.Items) != 0 {
			t.Errorf("run %s: %d pods after released (%v)", r.RunID, len(pods.Items), err)
		}
		t.Logf("run %s: %s", r.RunID, pt.Describe(evs))
	}
	// The agent is free: its next run starts at once.
	next := env.Acquire(t, company, agent, pt.StubConfig(map[string]string{"STUB_LINES": "1"}))
	if res := pt.WaitKind[events.RunResultEvent](next, 30*time.Second); res.Outcome != events.OutcomeSucceeded {
		t.Errorf("the agent's next run: %+v", res)
	}
}

// TestQuotaRefusalFailsTheRun is issue 8.11: a pod the tenant's ResourceQuota refuses was never
// reported; the run sat silent until its deadline holding its agent guard.
func TestQuotaRefusalFailsTheRun(t *testing.T) {
	cs := clustertest.Clientset(t)
	ctx := t.Context()
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	first := env.Acquire(t, company, pt.NewID("agent"), sleeping())
	created := pt.WaitKind[events.RunCreatedEvent](first, runTimeout)
	t.Cleanup(func() { first.Release(created.ProviderLeaseID, true) })
	// `created` says the first run's Job exists; its pod comes a moment later. Wait until it runs,
	// so that every cache of the quota controller has it.
	pt.Eventually(t, time.Minute, "the first run's pod to run", func() bool {
		pods, err := cs.CoreV1().Pods(created.Namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return len(pods.Items) == 1 && pods.Items[0].Status.Phase == corev1.PodRunning
	})
	// The operator (or a tenant resync) tightens the quota to the pod already running.
	patch := []byte(`{"spec":{"hard":{"pods":"1"}}}`)
	if _, err := cs.CoreV1().ResourceQuotas(created.Namespace).Patch(ctx, policy.TenantResourceQuota, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	// Admission enforces the quota's status, which the quota controller brings to the new spec a
	// moment later (seconds on a busy node), recounting the namespace's pods from its own cache:
	// only once that count has the first run's pod is the tighter quota in force. Before, the
	// recount could miss a pod created a moment earlier, and the second run's pod took the place.
	pt.Eventually(t, time.Minute, "the quota controller to enforce pods: 1 with the first run's pod counted", func() bool {
		q, err := cs.CoreV1().ResourceQuotas(created.Namespace).Get(ctx, policy.TenantResourceQuota, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		hard, used := q.Status.Hard[corev1.ResourcePods], q.Status.Used[corev1.ResourcePods]
		return hard.Value() == 1 && used.Value() == 1
	})
	second := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(map[string]string{"STUB_LINES": "1"}))
	start := time.Now()
	res := pt.WaitKind[events.RunResultEvent](second, runTimeout)
	if res.Outcome != events.OutcomeFailed || res.Reason != events.ReasonQuotaExceeded || !strings.Contains(res.Message, policy.TenantResourceQuota) {
		t.Errorf("result = %+v, want failed, QuotaExceeded, naming %s", res, policy.TenantResourceQuota)
	}
	t.Logf("quota refusal reported %s after the acquire", time.Since(start).Round(time.Millisecond))

	// An exec-capable lease's pod is created by the dispatcher itself: the API server refuses it
	// at once, and the acquire fails with quota_exceeded naming the quota, not the cluster.
	pod := env.Acquire(t, company, pt.NewID("agent"), sleeping(withConfig("backend", "pod", "podActivityDeadlineSec", 600)))
	failed := waitFailed(t, pod, events.LeaseAcquire)
	checkFailed(t, failed, events.CodeQuotaExceeded, "config.defaultResources")
	if !strings.Contains(failed.Message, policy.TenantResourceQuota) || strings.Contains(failed.Message, "forbidden") {
		t.Errorf("message %q: want the quota's name and no API server text", failed.Message)
	}
}

// TestRequestFailuresNameTheField triggers, through the real workers, each failure code that
// blames the request: one `failed` naming the field, and no namespace, Job or lease left behind.
// docs/contract.md points here for these codes.
func TestRequestFailuresNameTheField(t *testing.T) {
	cs := clustertest.Clientset(t)
	for _, tc := range []struct {
		code    events.Code
		field   string
		request func(r *pt.Run) []byte
	}{{
		code:  events.CodeInvalidRequest,
		field: "agentId",
		request: func(r *pt.Run) []byte {
			return fmt.Appendf(nil, `{"runId":%q,"companyId":%q,"environmentId":"e","agentId":"../x","config":{}}`, r.RunID, r.CompanyID)
		},
	}, {
		code:  events.CodeInvalidConfig,
		field: "config.egressAllowCidrs[0]",
		request: func(r *pt.Run) []byte {
			return acquireJSON(r.Request(sleeping(withConfig("egressAllowCidrs", []string{"10.0.0.0/33"}))))
		},
	}, {
		code:  events.CodeUnknownAdapter,
		field: "adapterType",
		request: func(r *pt.Run) []byte {
			req := r.Request(sleeping())
			req.AdapterType = "nope_local"
			return acquireJSON(req)
		},
	}, {
		code:  events.CodeImageNotAllowed,
		field: "config.imageAllowList",
		request: func(r *pt.Run) []byte {
			return acquireJSON(r.Request(sleeping(withConfig("imageAllowList", []string{"registry.example.com/*"}))))
		},
	}, {
		code:  events.CodeNamespaceNotAllowed,
		field: "config.namespacePrefix",
		request: func(r *pt.Run) []byte {
			return acquireJSON(r.Request(sleeping(withConfig("namespacePrefix", "kube-"))))
		},
	}} {
		t.Run(string(tc.code), func(t *testing.T) {
			company := pt.NewID("co")
			pt.CleanupTenant(t, cs, company)
			r := env.NewRun(t, company, pt.NewID("agent"))
			r.Collect()
			subj, _ := env.Subjects.Lease(company, events.LeaseAcquire)
			msg := nats.NewMsg(subj)
			msg.Header.Set(events.HeaderMsgID, r.RunID+".acquire")
			msg.Data = tc.request(r)
			if _, err := env.JS.PublishMsg(t.Context(), msg); err != nil {
				t.Fatal(err)
			}
			failed := waitFailed(t, r, events.LeaseAcquire)
			checkFailed(t, failed, tc.code, tc.field)
			if !strings.Contains(failed.Message, tc.field) {
				t.Errorf("message %q does not name %s", failed.Message, tc.field)
			}
			checkNothingApplied(t, cs, company, r.RunID)
		})
	}
}

func acquireJSON(req events.AcquireRequest) []byte {
	b, err := json.Marshal(req)
	if err != nil {
		panic(err)
	}
	return b
}

// checkNothingApplied: a refused first acquire left the company no namespace and no workload.
func checkNothingApplied(t *testing.T, cs kubernetes.Interface, companyID, runID string) {
	t.Helper()
	ns := policy.DefaultNamespacePrefix + policy.CompanySlug(companyID)
	if _, err := cs.CoreV1().Namespaces().Get(t.Context(), ns, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("namespace %s after a refused acquire: %v, want NotFound", ns, err)
	}
	jobs, err := cs.BatchV1().Jobs(metav1.NamespaceAll).List(t.Context(), metav1.ListOptions{LabelSelector: policy.LabelRunID + "=" + runID})
	if err != nil || len(jobs.Items) != 0 {
		t.Errorf("%d Jobs of run %s (%v)", len(jobs.Items), runID, err)
	}
}
