package paperclip

import (
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// warmPoolMax is the warm dispatcher's --warm-pool-max: the most unbound warm pods one company
// may have.
const warmPoolMax = 2

// warmPodTimeout bounds the wait for the pool's first warm pod: a pod start on this shared
// 2-core machine.
const warmPodTimeout = 2 * time.Minute

// TestPaperclipWarmPool runs two agent runs through the real host on a pod-backend environment
// while kubeclip's dispatcher keeps warm pods per company (issue 17): the first acquire is cold
// and seeds the company's pool; once a warm pod of the tenant is Ready, the second run's
// acquire binds it (its created event says warm) and the run succeeds end to end, checked as
// every other run of the suite is. The report shows each run's acquire time and warm or cold.
func TestPaperclipWarmPool(t *testing.T) {
	cs := clustertest.Clientset(t)
	pc := startServer(t)
	pt.CleanupTenant(t, cs, pc.CompanyID)
	useWarmDispatcher(t)
	rep := &report{}
	t.Cleanup(func() { rep.print(t) })
	pc.configurePlugin(t, map[string]any{"natsUrl": env.NATS.URL()})
	warm := pc.createEnvironment(t, "kubeclip-warm", environmentConfig("pod", false))
	pc.useEnvironment(t, warm.ID)
	ns := pt.NamespaceOf(t, pc.CompanyID)

	seed := pc.invoke(t)
	st := checkRun(t, pc, cs, seed, runWant{name: "warm pool: first run", env: warm, source: "on_demand", backend: "pod", live: true})
	rep.add(st)
	first := acquireOf(t, pc, seed, st)
	if first.warm {
		t.Errorf("run %s, the company's first acquire, was warm: its pool cannot have started before it", seed)
	}
	rep.addAcquire(first)
	pc.waitIdle(t, runTimeout)

	pt.Eventually(t, warmPodTimeout, "a Ready warm pod in "+ns, func() bool { return readyWarmPods(t, cs, ns) > 0 })
	second := pc.invoke(t)
	st = checkRun(t, pc, cs, second, runWant{name: "warm pool: second run", env: warm, source: "on_demand", backend: "pod", live: true})
	rep.add(st)
	next := acquireOf(t, pc, second, st)
	if !next.warm {
		t.Errorf("run %s's created event does not say warm, with a Ready warm pod of its company in %s", second, ns)
	}
	rep.addAcquire(next)
	pc.waitIdle(t, runTimeout)
}

// useWarmDispatcher replaces the suite's dispatcher by one with warm pools (--warm-pool-max)
// until the test ends, then starts the suite's again: the other tests' companies, whose runs
// check the pods left in their namespaces, never get a warm pod.
func useWarmDispatcher(t *testing.T) {
	t.Helper()
	for _, w := range env.Workers(pt.Dispatcher) {
		if err := w.Stop(); err != nil {
			t.Fatalf("stopping the suite's dispatcher %s: %v", w.ID, err)
		}
	}
	w, err := env.StartWorker(pt.Dispatcher, "--warm-pool-max", strconv.Itoa(warmPoolMax))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := w.Stop(); err != nil {
			t.Errorf("stopping the warm dispatcher %s: %v", w.ID, err)
		}
		if _, err := env.StartWorker(pt.Dispatcher); err != nil {
			t.Errorf("starting the suite's dispatcher again: %v", err)
		}
	})
}

// acquireOf is run runID's acquire as the plugin and kubeclip's run stream saw it: the
// plugin's acquire hook until the created event (st.acquire), that plus the stream's created →
// status Running/Ready (store times; none when ready came first), and the created event's warm.
func acquireOf(t *testing.T, pc *server, runID string, st runStats) acquireStats {
	t.Helper()
	// The run was released (checkRun): its history, read back from the start, is complete once
	// the released event is in.
	r := follow(t, pc, runID)
	pt.WaitKind[events.RunReleasedEvent](r, runTimeout)
	var created events.RunCreatedEvent
	var createdAt, readyAt time.Time
	for _, e := range r.Events() {
		switch ev := e.Event.(type) {
		case events.RunCreatedEvent:
			created, createdAt = ev, e.Published
		case events.RunStatusEvent:
			if ev.Phase == events.PhaseRunning && ev.Reason == events.ReasonReady && readyAt.IsZero() {
				readyAt = e.Published
			}
		}
	}
	a := acquireStats{name: st.name, warm: created.Warm, toCreated: st.acquire}
	switch {
	case st.acquire == 0 || createdAt.IsZero():
		t.Errorf("run %s: acquire hook %s, created stored at %s; want both", runID, st.acquire, createdAt)
	case readyAt.IsZero():
		t.Errorf("run %s (warm %t): no status Running/Ready in its stream", runID, created.Warm)
	default:
		// A warm pod's ready may be stored before created (docs/contract.md, Ordering): the lease
		// is ready to run commands once both are out.
		a.toReady = st.acquire + max(0, readyAt.Sub(createdAt))
	}
	return a
}

// readyWarmPods counts the Ready warm pods in ns that no lease has bound.
func readyWarmPods(t *testing.T, cs kubernetes.Interface, ns string) int {
	t.Helper()
	pods, err := cs.CoreV1().Pods(ns).List(t.Context(), metav1.ListOptions{LabelSelector: policy.LabelWarmPool + ",!" + policy.LabelRunID})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, p := range pods.Items {
		for _, c := range p.Status.Conditions {
			if p.DeletionTimestamp == nil && c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
				n++
			}
		}
	}
	return n
}
