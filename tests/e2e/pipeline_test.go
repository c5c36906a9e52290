package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// runTimeout bounds a whole run on this 2-core machine (pod start ~1-2 s, image local).
const runTimeout = 90 * time.Second

func TestHappyPathStreamsEveryLineThenTheResult(t *testing.T) {
	t.Parallel()
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)

	const lines = 60
	r := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(map[string]string{
		"STUB_LINES": fmt.Sprint(lines), "STUB_BURST": "6", "STUB_INTERVAL": "30ms",
		"STUB_STDERR": "stub: hello on stderr", "STUB_SESSION_ID": "sess-e2e", "STUB_MODEL": "claude-e2e",
		"STUB_COST_USD": "0.25", "STUB_INPUT_TOKENS": "1234", "STUB_OUTPUT_TOKENS": "567", "STUB_CACHED_TOKENS": "89",
	}))

	created := pt.WaitKind[events.RunCreatedEvent](r, runTimeout)
	if created.Backend != "job" || !strings.HasPrefix(created.WorkloadName, "pc-") || len(created.WorkloadName) != 29 {
		t.Errorf("created = %+v, want a job backend and a pc-<ulid> workload", created)
	}
	if created.ProviderLeaseID != created.WorkloadName || created.SecretName != created.WorkloadName+"-env" {
		t.Errorf("created = %+v: lease id and Secret name must derive from the workload name", created)
	}
	if want := pt.NamespaceOf(t, company); created.Namespace != want {
		t.Errorf("namespace = %s, want %s", created.Namespace, want)
	}

	res := pt.WaitKind[events.RunResultEvent](r, runTimeout)
	if res.Outcome != events.OutcomeSucceeded || res.ExitCode == nil || *res.ExitCode != 0 {
		t.Fatalf("result = %+v, want succeeded with exit 0", res)
	}
	a := res.Agent
	if a == nil {
		t.Fatal("result has no parsed agent result")
	}
	if a.SessionID != "sess-e2e" || a.Model != "claude-e2e" || a.CostUSD == nil || *a.CostUSD != 0.25 || a.IsError {
		t.Errorf("agent = %+v, want the stub's session, model, cost", a)
	}
	if a.Usage == nil || a.Usage.InputTokens != 1234 || a.Usage.OutputTokens != 567 || a.Usage.CachedInputTokens != 89 {
		t.Errorf("agent usage = %+v, want 1234/567/89", a.Usage)
	}

	// Every line, in order, exactly once; the result comes after the last log chunk.
	logs := pt.All[events.RunLogEvent](r)
	var want []string
	for i := 1; i <= lines; i++ {
		want = append(want, fmt.Sprintf("stub line %d", i))
	}
	if diff := cmp.Diff(want, pt.StubLines(logs)); diff != "" {
		t.Errorf("stub lines (-want +got):\n%s", diff)
	}
	for i, ev := range logs {
		if ev.Seq != uint64(i+1) {
			t.Fatalf("log event %d has seq %d; seq must count 1, 2, 3, ... without gaps", i, ev.Seq)
		}
		if ev.Container != "agent" || ev.Pod == "" {
			t.Errorf("log event %d: pod %q container %q", ev.Seq, ev.Pod, ev.Container)
		}
		for _, l := range ev.Lines {
			if _, err := time.Parse(time.RFC3339Nano, l.TS); err != nil {
				t.Errorf("line %q has no Kubernetes timestamp: %v", l.Text, err)
			}
		}
	}
	if !containsLine(logs, "stub: hello on stderr") {
		t.Error("the stderr line is missing from the log")
	}
	r.AssertResultLast(t)

	statuses := pt.All[events.RunStatusEvent](r)
	var phases []events.Phase
	for _, s := range statuses {
		phases = append(phases, s.Phase)
	}
	if len(phases) == 0 || phases[len(phases)-1] != events.PhaseSucceeded {
		t.Errorf("status phases = %v, want to end in Succeeded", phases)
	}
}

func TestAgentExitCodeIsReported(t *testing.T) {
	t.Parallel()
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	r := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(map[string]string{"STUB_LINES": "2", "STUB_EXIT_CODE": "3", "STUB_IS_ERROR": "true"}))
	res := pt.WaitKind[events.RunResultEvent](r, runTimeout)
	if res.Outcome != events.OutcomeFailed || res.ExitCode == nil || *res.ExitCode != 3 {
		t.Fatalf("result = %+v, want failed with exit code 3", res)
	}
	if res.Agent == nil || !res.Agent.IsError {
		t.Errorf("agent = %+v, want isError from the stub's result line", res.Agent)
	}
	r.AssertResultLast(t)
}

// TestAgentErrorFollowsTheExitCode is issue 8.10: Claude Code ends a run that ran out of turns
// with a result line of subtype error_max_turns, is_error false, and exits 1. The exit code
// makes the run an error, and the max-turns code tells why.
func TestAgentErrorFollowsTheExitCode(t *testing.T) {
	t.Parallel()
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	r := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(map[string]string{"STUB_LINES": "1", "STUB_EXIT_CODE": "1", "STUB_SUBTYPE": "error_max_turns"}))
	res := pt.WaitKind[events.RunResultEvent](r, runTimeout)
	if res.Outcome != events.OutcomeFailed || res.ExitCode == nil || *res.ExitCode != 1 {
		t.Fatalf("result = %+v, want failed with exit code 1", res)
	}
	if res.Agent == nil || !res.Agent.IsError || res.Agent.ErrorCode != "max_turns_exhausted" {
		t.Errorf("agent = %+v, want isError with errorCode max_turns_exhausted", res.Agent)
	}
}

func TestActivityDeadlineTimesOut(t *testing.T) {
	t.Parallel()
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	r := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(map[string]string{"STUB_LINES": "1", "STUB_SLEEP": "5m"},
		func(c map[string]any) { c["podActivityDeadlineSec"] = 4 }))
	res := pt.WaitKind[events.RunResultEvent](r, runTimeout)
	if res.Outcome != events.OutcomeTimedOut || res.Reason != events.ReasonDeadlineExceeded {
		t.Fatalf("result = %+v, want timed_out with reason DeadlineExceeded", res)
	}
	if got := pt.StubLines(pt.All[events.RunLogEvent](r)); !cmp.Equal(got, []string{"stub line 1"}) {
		t.Errorf("lines before the deadline = %v", got)
	}
}

func TestOOMKilled(t *testing.T) {
	t.Parallel()
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	r := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(map[string]string{"STUB_LINES": "1", "STUB_OOM": "true"},
		func(c map[string]any) {
			c["defaultResources"] = map[string]any{"limits": map[string]string{"memory": "128Mi"}, "requests": map[string]string{"memory": "128Mi"}}
		}))
	res := pt.WaitKind[events.RunResultEvent](r, runTimeout)
	if res.Outcome != events.OutcomeFailed || res.Reason != events.ReasonOOMKilled || res.ExitCode == nil || *res.ExitCode != 137 {
		t.Fatalf("result = %+v, want failed, OOMKilled, exit 137", res)
	}
}

func TestMissingImageFailsFast(t *testing.T) {
	t.Parallel()
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	start := time.Now()
	r := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(nil, func(c map[string]any) {
		c["adapters"].([]any)[0].(map[string]any)["runtimeImage"] = "kubeclip.local/no-such-image:dev"
	}))
	res := pt.WaitKind[events.RunResultEvent](r, runTimeout)
	took := time.Since(start)
	switch {
	case res.Outcome != events.OutcomeFailed:
		t.Fatalf("result = %+v, want failed", res)
	case res.Reason != "ErrImagePull" && res.Reason != events.ReasonImagePullBackOff && res.Reason != events.ReasonErrImageNeverPull:
		t.Fatalf("reason = %q, want an image pull reason", res.Reason)
	case took > 60*time.Second:
		t.Errorf("took %s; an image that cannot be pulled must fail long before the 120 s deadline", took)
	}
	// The dispatcher deletes a Job that failed before it ran, so it stops holding quota.
	created := pt.WaitKind[events.RunCreatedEvent](r, time.Second)
	pt.Eventually(t, 30*time.Second, "the failed Job to be deleted", func() bool {
		_, err := cs.BatchV1().Jobs(created.Namespace).Get(context.Background(), created.WorkloadName, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

func TestInvalidConfigFailsAndCreatesNothing(t *testing.T) {
	t.Parallel()
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	r := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(nil, func(c map[string]any) {
		c["egressAllowCidrs"] = []string{"10.0.0.0/8", "300.1.2.3/8"}
	}))
	failed := pt.WaitKind[events.RunFailedEvent](r, 30*time.Second)
	if failed.Code != events.CodeInvalidConfig || failed.Field != "config.egressAllowCidrs[1]" {
		t.Fatalf("failed = %+v, want invalid_config naming config.egressAllowCidrs[1]", failed)
	}
	if !strings.Contains(failed.Message, "egressAllowCidrs[1]") {
		t.Errorf("message %q does not name the field", failed.Message)
	}
	_, err := cs.CoreV1().Namespaces().Get(context.Background(), pt.NamespaceOf(t, company), metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("tenant namespace: err = %v, want NotFound (nothing may be created)", err)
	}
	if n := len(pt.All[events.RunCreatedEvent](r)); n != 0 {
		t.Errorf("%d created events for an invalid config", n)
	}
}

func TestReleaseMidRunStopsThePodFirst(t *testing.T) {
	t.Parallel()
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	r := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(map[string]string{"STUB_LINES": "1000", "STUB_INTERVAL": "100ms"}))
	created := pt.WaitKind[events.RunCreatedEvent](r, runTimeout)
	r.WaitFor(runTimeout, "a log line", func(evs []events.Received) bool {
		for _, e := range evs {
			if _, ok := e.Event.(events.RunLogEvent); ok {
				return true
			}
		}
		return false
	})
	r.Release(created.ProviderLeaseID, false)
	released := pt.WaitKind[events.RunReleasedEvent](r, runTimeout)
	if released.State != events.ReleaseStopped || released.ProviderLeaseID != created.ProviderLeaseID {
		t.Errorf("released = %+v", released)
	}
	// released comes only once the run's pod is gone.
	pods, err := cs.CoreV1().Pods(created.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: policy.LabelRunID + "=" + r.RunID})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != 0 {
		t.Errorf("%d pods of the run still exist after released", len(pods.Items))
	}
	res := pt.WaitKind[events.RunResultEvent](r, runTimeout)
	if res.Outcome != events.OutcomeCancelled {
		t.Errorf("result = %+v, want cancelled", res)
	}
}

func TestBusyAgentWaitsThenFails(t *testing.T) {
	t.Parallel()
	cs := clustertest.Clientset(t)
	company, agent := pt.NewID("co"), pt.NewID("agent")
	pt.CleanupTenant(t, cs, company)

	first := env.Acquire(t, company, agent, pt.StubConfig(map[string]string{"STUB_LINES": "1", "STUB_SLEEP": "4s"}))
	pt.WaitKind[events.RunCreatedEvent](first, runTimeout)
	second := env.Acquire(t, company, agent, pt.StubConfig(map[string]string{"STUB_LINES": "1"}))

	// The second run is created only after the first one ended.
	firstResult := pt.WaitKind[events.RunResultEvent](first, runTimeout)
	if firstResult.Outcome != events.OutcomeSucceeded {
		t.Fatalf("first result = %+v", firstResult)
	}
	evs := second.WaitFor(runTimeout, "created", func(evs []events.Received) bool {
		for _, e := range evs {
			if _, ok := e.Event.(events.RunCreatedEvent); ok {
				return true
			}
		}
		return false
	})
	firstEnd := first.ReceivedAt(t, func(e events.Event) bool { _, ok := e.(events.RunResultEvent); return ok })
	for _, e := range evs {
		if _, ok := e.Event.(events.RunCreatedEvent); ok && e.Published.Before(firstEnd) {
			t.Errorf("second run created at %s, before the first run's result at %s", e.Published, firstEnd)
		}
	}
	pt.WaitKind[events.RunResultEvent](second, runTimeout)

	// A third acquire while a long run holds the agent fails with agent_busy after the bound.
	long := env.Acquire(t, company, agent, pt.StubConfig(map[string]string{"STUB_LINES": "1", "STUB_SLEEP": "5m"}))
	longCreated := pt.WaitKind[events.RunCreatedEvent](long, runTimeout)
	t.Cleanup(func() { long.Release(longCreated.ProviderLeaseID, true) })
	blocked := env.Acquire(t, company, agent, pt.StubConfig(nil))
	failed := pt.WaitKind[events.RunFailedEvent](blocked, agentBusyTimeout+30*time.Second)
	if failed.Code != events.CodeAgentBusy || failed.Field != "agentId" {
		t.Errorf("failed = %+v, want agent_busy naming agentId", failed)
	}
	if n := len(pt.All[events.RunCreatedEvent](blocked)); n != 0 {
		t.Errorf("the blocked run was created %d times", n)
	}
}

func TestTenantConfigChangeIsReconciled(t *testing.T) {
	t.Parallel()
	cs := clustertest.Clientset(t)
	dyn, err := dynamic.NewForConfig(clustertest.Config(t))
	if err != nil {
		t.Fatal(err)
	}
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	ns := pt.NamespaceOf(t, company)
	ctx := context.Background()

	r1 := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(map[string]string{"STUB_LINES": "1"}))
	pt.WaitKind[events.RunResultEvent](r1, runTimeout)
	if _, err := cs.NetworkingV1().NetworkPolicies(ns).Get(ctx, policy.EgressAllowPolicyName, metav1.GetOptions{}); err != nil {
		t.Fatalf("standard egress policy: %v", err)
	}

	// Drift: someone deletes the quota. Config change: cilium mode and extra FQDNs.
	if err := cs.CoreV1().ResourceQuotas(ns).Delete(ctx, policy.TenantResourceQuota, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	r2 := env.Acquire(t, company, pt.NewID("agent"), pt.StubConfig(map[string]string{"STUB_LINES": "1"}, func(c map[string]any) {
		c["egressMode"] = "cilium"
		c["egressAllowFqdns"] = []string{"example.com"}
	}))
	pt.WaitKind[events.RunResultEvent](r2, runTimeout)
	cnpGVR := schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnetworkpolicies"}
	cnp, err := dyn.Resource(cnpGVR).Namespace(ns).Get(ctx, policy.EgressFQDNPolicyName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("cilium egress policy after switching mode: %v", err)
	}
	if !strings.Contains(fmt.Sprint(cnp.Object["spec"]), "example.com") {
		t.Errorf("cilium policy lacks the new FQDN: %v", cnp.Object["spec"])
	}
	if _, err := cs.NetworkingV1().NetworkPolicies(ns).Get(ctx, policy.EgressAllowPolicyName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("standard egress policy after switching to cilium: err = %v, want NotFound", err)
	}
	if _, err := cs.CoreV1().ResourceQuotas(ns).Get(ctx, policy.TenantResourceQuota, metav1.GetOptions{}); err != nil {
		t.Errorf("deleted quota was not restored by the re-apply: %v", err)
	}
}

func TestDuplicateAcquireMakesOneJob(t *testing.T) {
	t.Parallel()
	cs := clustertest.Clientset(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, cs, company)
	cfg := pt.StubConfig(map[string]string{"STUB_LINES": "3"})
	r := env.NewRun(t, company, pt.NewID("agent"))
	// Published twice without a message id, so JetStream cannot drop the second copy.
	r.PublishAcquire(cfg, false)
	r.PublishAcquire(cfg, false)
	r.Collect()
	created := pt.WaitKind[events.RunCreatedEvent](r, runTimeout)
	pt.WaitKind[events.RunResultEvent](r, runTimeout)
	jobs, err := cs.BatchV1().Jobs(created.Namespace).List(context.Background(), metav1.ListOptions{LabelSelector: policy.LabelRunID + "=" + r.RunID})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs.Items) != 1 {
		t.Errorf("%d Jobs for one run, want 1", len(jobs.Items))
	}
	if n := len(pt.All[events.RunCreatedEvent](r)); n != 1 {
		t.Errorf("%d created events, want 1", n)
	}
	if n := len(pt.All[events.RunResultEvent](r)); n != 1 {
		t.Errorf("%d result events, want 1", n)
	}
	if got := pt.StubLines(pt.All[events.RunLogEvent](r)); !cmp.Equal(got, []string{"stub line 1", "stub line 2", "stub line 3"}) {
		t.Errorf("lines = %v, want each once", got)
	}
}

func containsLine(logs []events.RunLogEvent, text string) bool {
	for _, ev := range logs {
		for _, l := range ev.Lines {
			if l.Text == text {
				return true
			}
		}
	}
	return false
}
