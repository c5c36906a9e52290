package failover

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// The tests of this file kill the workers under a reusable lease's resume (issue 19: "an
// exec-worker and the dispatcher killed during a resume still end in one coherent outcome").
// A reusable lease is backend pod on the sandbox image; its files in /workspace and $HOME are on
// its volume claim, so a resume of a suspended lease finds them on the new pod.
//
// The worst moments are held still with a finalizer on the lease's pod (holdFinalizer): a
// suspend deletes the pod and waits until it is gone, and a resume that finds its lease's pod
// being deleted waits for it too before it makes the new one. So a resume that comes while the
// sweep suspends its lease stays, for as long as the test holds the old pod, in the state
// "record resuming, new pod not created".

const (
	// sandboxImage is the local cluster's Paperclip sandbox (hack/cluster/sandbox-image.sh):
	// a shell, coreutils, uid 1000, HOME /home/paperclip.
	sandboxImage = "kubeclip.local/sandbox:dev"
	// leaseIdleWindow is the dispatchers' --lease-idle-window: a released reusable lease is
	// suspended by the first sweep after its release (every dispatcher sweeps at start and
	// every 30 s), so a test suspends one by starting a dispatcher.
	leaseIdleWindow = time.Millisecond
	// holdFinalizer keeps a pod that is being deleted in the API until the test removes it.
	holdFinalizer = "kubeclip.io/test-hold"
	// resumeTimeout bounds a resume that is redelivered after its dispatcher was killed: the
	// consumer's 30 s ack wait, then a pod start on a loaded 2-core machine.
	resumeTimeout = 2 * time.Minute
)

// reusable is a reusable pod lease of a run under test.
type reusable struct {
	run *pt.Run
	// lease is the run's providerLeaseId, the name of its pod in every generation.
	lease, namespace string
	cs               kubernetes.Interface
	records          lease.Records
	pub              *events.Publisher
}

// acquireReusable acquires a reusable pod lease for a fresh agent of company and waits for its
// created event.
func acquireReusable(t *testing.T, company string) *reusable {
	t.Helper()
	cfg := pt.StubConfig(nil, func(c map[string]any) {
		c["backend"] = "pod"
		c["podActivityDeadlineSec"] = 900
		c["adapters"].([]any)[0].(map[string]any)["runtimeImage"] = sandboxImage
	})
	r := env.NewRun(t, company, pt.NewID("agent"))
	r.Collect()
	pub, err := events.NewPublisher(events.PublisherOptions{JS: env.JS, Subjects: env.Subjects})
	if err != nil {
		t.Fatal(err)
	}
	req := r.Request(cfg)
	req.ReuseLease = true
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := pub.Publish(ctx, req); err != nil {
		t.Fatalf("publishing acquire: %v", err)
	}
	kv, err := env.JS.KeyValue(ctx, lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	created := pt.WaitKind[events.RunCreatedEvent](r, runTimeout)
	return &reusable{
		run: r, lease: created.ProviderLeaseID, namespace: pt.NamespaceOf(t, company),
		cs: clustertest.Clientset(t), records: lease.Records{KV: kv}, pub: pub,
	}
}

func (l *reusable) execLease() execclient.Lease {
	return execclient.Lease{CompanyID: l.run.CompanyID, RunID: l.run.RunID, ProviderLeaseID: l.lease}
}

func (l *reusable) publish(t *testing.T, ev events.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if _, err := l.pub.Publish(ctx, ev); err != nil {
		t.Fatalf("publishing %T: %v", ev, err)
	}
}

// release releases the lease as the host does after a run (cancelActiveWork: its pod deleted
// at once, the lease suspended) and waits for its receipt.
func (l *reusable) release(t *testing.T, cancelActiveWork bool) {
	t.Helper()
	id := pt.NewID("release")
	l.publish(t, events.ReleaseRequest{RunID: l.run.RunID, CompanyID: l.run.CompanyID, ProviderLeaseID: l.lease, CancelActiveWork: cancelActiveWork, ReleaseID: id})
	l.run.WaitFor(runTimeout, "released "+id, func(evs []events.Received) bool {
		return len(released(evs, id)) == 1
	})
}

// destroy publishes the host's destroy of the lease (it names no releaseId).
func (l *reusable) destroy(t *testing.T) {
	t.Helper()
	l.publish(t, events.ReleaseRequest{RunID: l.run.RunID, CompanyID: l.run.CompanyID, ProviderLeaseID: l.lease, Destroy: true})
}

// resume publishes a resume of the lease and returns its resumeId.
func (l *reusable) resume(t *testing.T) string {
	t.Helper()
	id := pt.NewID("resume")
	l.publish(t, events.ResumeRequest{RunID: l.run.RunID, CompanyID: l.run.CompanyID, ProviderLeaseID: l.lease, ResumeID: id})
	return id
}

// answers returns the answers to the resume id so far: its resumed and failed events.
func answers(evs []events.Received, id string) (resumed []events.RunResumedEvent, failed []events.RunFailedEvent) {
	for _, e := range pt.Only[events.RunResumedEvent](evs) {
		if e.ResumeID == id {
			resumed = append(resumed, e)
		}
	}
	for _, e := range pt.Only[events.RunFailedEvent](evs) {
		if e.RequestID == id {
			failed = append(failed, e)
		}
	}
	return resumed, failed
}

// released returns the released events answering the release id ("": a destroy's).
func released(evs []events.Received, id string) []events.RunReleasedEvent {
	var out []events.RunReleasedEvent
	for _, e := range pt.Only[events.RunReleasedEvent](evs) {
		if e.ReleaseID == id {
			out = append(out, e)
		}
	}
	return out
}

// awaitAnswer waits for the resume id's first answer.
func (l *reusable) awaitAnswer(t *testing.T, id string, timeout time.Duration) []events.Received {
	t.Helper()
	return l.run.WaitFor(timeout, "an answer to resume "+id, func(evs []events.Received) bool {
		resumed, failed := answers(evs, id)
		return len(resumed)+len(failed) > 0
	})
}

func (l *reusable) record(t *testing.T) lease.Record {
	t.Helper()
	rec, _, err := l.records.Get(t.Context(), events.Ref(l.run.CompanyID, l.run.RunID))
	if err != nil {
		t.Fatalf("reading the lease record: %v", err)
	}
	return rec
}

// awaitState waits until the lease record is in state.
func (l *reusable) awaitState(t *testing.T, state lease.State, timeout time.Duration) lease.Record {
	t.Helper()
	var rec lease.Record
	pt.Eventually(t, timeout, fmt.Sprintf("lease %s %s", l.lease, state), func() bool {
		rec = l.record(t)
		return rec.State == state
	})
	return rec
}

// pods returns the run's pods, those being deleted included.
func (l *reusable) pods(t *testing.T) []corev1.Pod {
	t.Helper()
	list, err := l.cs.CoreV1().Pods(l.namespace).List(t.Context(), metav1.ListOptions{LabelSelector: policy.LabelRunID + "=" + l.run.RunID})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// hold puts holdFinalizer on the lease's pod, and takes it off again when the test ends.
func (l *reusable) hold(t *testing.T) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"finalizers":[%q]}}`, holdFinalizer)
	if _, err := l.cs.CoreV1().Pods(l.namespace).Patch(t.Context(), l.lease, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("holding pod %s: %v", l.lease, err)
	}
	t.Cleanup(func() { l.unhold(t) })
}

// unhold takes holdFinalizer off the lease's pod (if it is still there).
func (l *reusable) unhold(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pods := l.cs.CoreV1().Pods(l.namespace)
	p, err := pods.Get(ctx, l.lease, metav1.GetOptions{})
	if err != nil || len(p.Finalizers) == 0 {
		return
	}
	if _, err := pods.Patch(ctx, l.lease, types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		t.Errorf("releasing pod %s: %v", l.lease, err)
	}
}

// exec runs script with sh -c on the lease through the suite's exec-workers.
func (l *reusable) exec(t *testing.T, c *execclient.Client, script string) (execclient.Result, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	return c.Run(ctx, execclient.Exec{Lease: l.execLease(), Command: "sh", Args: []string{"-c", script}, Timeout: time.Minute})
}

// mustExec runs script and expects exit 0 and stdout want.
func (l *reusable) mustExec(t *testing.T, c *execclient.Client, script, want string) {
	t.Helper()
	res, err := l.exec(t, c, script)
	if err != nil || res.ExitCode == nil || *res.ExitCode != 0 || string(res.Stdout) != want {
		t.Fatalf("lease %s: %q: stdout %q stderr %q exit %v, %v; want %q and exit 0", l.lease, script, res.Stdout, res.Stderr, res.ExitCode, err, want)
	}
}

// writeFiles writes a file into the lease's workspace and one into its $HOME.
func (l *reusable) writeFiles(t *testing.T, c *execclient.Client) {
	t.Helper()
	l.mustExec(t, c, fmt.Sprintf("echo %s > /workspace/kept && echo %s > $HOME/kept && echo ok", l.lease, l.run.AgentID), "ok\n")
}

// checkFiles expects the files writeFiles wrote.
func (l *reusable) checkFiles(t *testing.T, c *execclient.Client) {
	t.Helper()
	l.mustExec(t, c, "cat /workspace/kept $HOME/kept", l.lease+"\n"+l.run.AgentID+"\n")
}

// checkResumed checks one coherent outcome of the resume id on a lease that was suspended at
// generation 0: exactly one answer, resumed from suspended at generation 1; the record created
// at generation 1; exactly one pod, not being deleted.
func (l *reusable) checkResumed(t *testing.T, id string) {
	t.Helper()
	resumed, failed := answers(l.run.Events(), id)
	if len(resumed) != 1 || len(failed) != 0 {
		t.Errorf("lease %s: resume %s answered %d resumed, %d failed (%+v); want exactly one resumed", l.lease, id, len(resumed), len(failed), failed)
	}
	if len(resumed) > 0 {
		if got := resumed[0]; got.From != events.ResumedFromSuspended || got.Generation != 1 || got.Resumes != 1 {
			t.Errorf("lease %s: resume %s answered %+v, want from suspended, generation 1, resumes 1", l.lease, id, got)
		}
	}
	if rec := l.record(t); rec.State != lease.StateCreated || rec.Generation != 1 {
		t.Errorf("lease %s: record %s generation %d, want created generation 1", l.lease, rec.State, rec.Generation)
	}
	pods := l.pods(t)
	if len(pods) != 1 || pods[0].DeletionTimestamp != nil {
		t.Errorf("lease %s: %d pods (%s), want exactly one, live", l.lease, len(pods), describePods(pods))
	}
}

// checkNoFailure checks that nothing in the run's events reports a failure: no failed event,
// no result other than released, no status Failed.
func checkNoFailure(t *testing.T, r *pt.Run) {
	t.Helper()
	evs := r.Events()
	bad := false
	for _, e := range evs {
		switch ev := e.Event.(type) {
		case events.RunFailedEvent:
			bad = true
		case events.RunResultEvent:
			bad = bad || ev.Outcome != events.OutcomeReleased
		case events.RunStatusEvent:
			bad = bad || ev.Phase == events.PhaseFailed
		}
	}
	if bad {
		t.Errorf("run %s: a failure in its events:\n%s", r.RunID, pt.Describe(evs))
	}
}

func describePods(pods []corev1.Pod) string {
	var parts []string
	for _, p := range pods {
		s := string(p.UID)
		if p.DeletionTimestamp != nil {
			s += " being deleted"
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, ", ")
}

// killAll SIGKILLs every live worker of kind at once.
func killAll(t *testing.T, kind string) {
	t.Helper()
	var wg sync.WaitGroup
	for _, w := range env.Workers(kind) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := w.Kill(); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
}

// startExecWorkers starts n exec-workers and stops those still alive when the test ends.
func startExecWorkers(t *testing.T, n int) []*pt.Worker {
	t.Helper()
	var ws []*pt.Worker
	for range n {
		w, err := env.StartWorker(pt.ExecWorker)
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	t.Cleanup(func() {
		for _, w := range ws {
			if err := w.Stop(); err != nil && !w.Exited() {
				t.Errorf("%s: %v", w.ID, err)
			}
		}
	})
	return ws
}

func newExecClient(t *testing.T) *execclient.Client {
	t.Helper()
	c, err := execclient.New(execclient.Options{NATS: env.NC, Subjects: env.Subjects})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// watchPods watches the run's pods from now on.
func (l *reusable) watchPods(t *testing.T) watch.Interface {
	t.Helper()
	w, err := l.cs.CoreV1().Pods(l.namespace).Watch(t.Context(), metav1.ListOptions{LabelSelector: policy.LabelRunID + "=" + l.run.RunID})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return w
}

// awaitAdded waits for a pod to be added on w.
func awaitAdded(t *testing.T, w watch.Interface, timeout time.Duration) *corev1.Pod {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the pod watch closed")
			}
			if p, isPod := ev.Object.(*corev1.Pod); isPod && ev.Type == watch.Added {
				return p
			}
		case <-deadline:
			t.Fatalf("no pod created within %s", timeout)
		}
	}
}

// suspendBySweep has the lease, released, suspended by a sweep: a dispatcher started now
// sweeps at once, and the idle window is over.
func suspendBySweep(t *testing.T) {
	t.Helper()
	w, err := env.StartWorker(pt.Dispatcher)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("started %s to sweep", w.ID)
}

// TestResumeDispatcherKilled SIGKILLs every dispatcher (the one handling each resume among
// them) while two resumes of suspended leases are at their worst moments:
//
//   - lease A after its record moved to resuming and before its new pod exists: the sweep was
//     suspending A (its pod held by holdFinalizer) when the resume came, and the resume waits
//     for the old pod to go;
//   - lease B after its new pod was created and before `resumed` was published: the kill
//     follows the pod's creation, seen by a watch, before the pod can be ready.
//
// Replacement dispatchers get both resumes again after the consumer's ack wait (30 s). The
// plugin's resume has given up by then (its 25 s budget) and the host retried it: B's retry, a
// new resume, is answered by a replacement at once. Each resume must end in exactly one
// `resumed` (from suspended, generation 1, resumes 1; the retry its own with the same), exactly
// one pod, the record created at generation 1, and the lease running commands that read the
// files written before the suspend. A command sent during the resumes is refused not_ready, and
// an exec-worker killed then is replaced. Then an exec-worker is killed while a command runs on
// A: the command's result is delivered once by the other replica or is an honest error, A's
// next command works, and a destroy ends both runs with one `released` (destroyed) and no
// failure in their events.
func TestResumeDispatcherKilled(t *testing.T) {
	defer restoreReplicas(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, clustertest.Clientset(t), company)
	execs := startExecWorkers(t, 2)
	c := newExecClient(t)

	a, b := acquireReusable(t, company), acquireReusable(t, company)
	for _, l := range []*reusable{a, b} {
		l.writeFiles(t, c)
	}

	// B: released with cancelActiveWork, suspended at once (pod gone, claim kept).
	b.release(t, true)
	b.awaitState(t, lease.StateSuspended, time.Minute)
	if pods := b.pods(t); len(pods) != 0 {
		t.Fatalf("lease B suspended with pods %s", describePods(pods))
	}

	// A: released, its pod held, suspended by a sweep that stays in its pod's deletion.
	a.hold(t)
	a.release(t, false)
	suspendBySweep(t)
	a.awaitState(t, lease.StateSuspending, time.Minute)
	pt.Eventually(t, time.Minute, "A's pod being deleted", func() bool {
		pods := a.pods(t)
		return len(pods) == 1 && pods[0].DeletionTimestamp != nil
	})

	// (a) A's resume: the record moves to resuming, generation 1; the resume waits for the
	// old pod, so no new pod is created.
	resumeA := a.resume(t)
	recA := a.awaitState(t, lease.StateResuming, time.Minute)
	if recA.Generation != 1 {
		t.Fatalf("lease A resuming at generation %d, want 1", recA.Generation)
	}

	// (b) B's resume: kill every dispatcher as soon as its new pod exists.
	podsB := b.watchPods(t)
	resumeB := b.resume(t)
	created := awaitAdded(t, podsB, time.Minute)
	killAll(t, pt.Dispatcher)
	killed := time.Now()
	t.Logf("killed every dispatcher: A resuming with its old pod held, B's pod %s created", created.UID)

	for _, m := range []struct {
		l  *reusable
		id string
	}{{a, resumeA}, {b, resumeB}} {
		if resumed, failed := answers(m.l.run.Events(), m.id); len(resumed)+len(failed) != 0 {
			t.Fatalf("lease %s answered its resume before the kill (%d resumed, %d failed): the moment was missed", m.l.lease, len(resumed), len(failed))
		}
		if rec := m.l.record(t); rec.State != lease.StateResuming {
			t.Fatalf("lease %s %s at the kill, want resuming", m.l.lease, rec.State)
		}
	}
	if pods := b.pods(t); len(pods) != 1 || podReady(&pods[0]) {
		t.Fatalf("lease B at the kill: pods %s (ready %v); want its new pod, not ready yet", describePods(pods), len(pods) == 1 && podReady(&pods[0]))
	}

	// Meanwhile a command on either lease is refused as the lease's (not_ready: resuming), and
	// an exec-worker dies during the resume; a replacement takes its place.
	for _, l := range []*reusable{a, b} {
		if _, err := l.exec(t, c, "true"); !errors.Is(err, execproto.ErrNotReady) {
			t.Errorf("lease %s: a command during its resume: %v, want not_ready", l.lease, err)
		}
	}
	if err := execs[0].Kill(); err != nil {
		t.Fatal(err)
	}
	startExecWorkers(t, 1)

	a.unhold(t)
	restoreReplicas(t)
	restarted := time.Now()
	// The plugin's resume gives up after its RPC budget (25 s), shorter than the ack wait, and
	// the host retries it: a new resume (its own resumeId) goes to a new dispatcher at once and
	// finishes the same resume, with no second pod.
	retryB := b.resume(t)
	b.awaitAnswer(t, retryB, resumeTimeout)
	t.Logf("lease %s: the host's retry of the resume answered %s after the restart", b.lease, time.Since(restarted).Round(time.Millisecond))
	for _, m := range []struct {
		l  *reusable
		id string
	}{{a, resumeA}, {b, resumeB}} {
		m.l.awaitAnswer(t, m.id, resumeTimeout)
		t.Logf("lease %s: resume answered %s after the kill", m.l.lease, time.Since(killed).Round(time.Millisecond))
	}
	for _, m := range []struct {
		l  *reusable
		id string
	}{{a, resumeA}, {b, resumeB}, {b, retryB}} {
		m.l.checkResumed(t, m.id)
	}
	for _, l := range []*reusable{a, b} {
		l.checkFiles(t, c)
	}
	if t.Failed() {
		t.FailNow()
	}

	// An exec-worker killed while a command runs on the just-resumed lease A.
	a.execKilled(t, c)

	for _, l := range []*reusable{a, b} {
		l.destroyed(t)
	}
}

// execKilled runs a command on the lease, SIGKILLs the exec-worker serving it mid-command and
// checks the outcome: the command's result delivered once by the other replica (its whole
// output, exit 0), or an honest error; the lease's next command works.
func (l *reusable) execKilled(t *testing.T, c *execclient.Client) {
	t.Helper()
	out := &syncBuffer{}
	var mu sync.Mutex
	var serving []string
	done := make(chan error, 1)
	var res execclient.Result
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		defer cancel()
		var err error
		res, err = c.Run(ctx, execclient.Exec{
			Lease: l.execLease(), Command: "sh", Args: []string{"-c", "echo begin; sleep 3; cat /workspace/kept; echo end"},
			Timeout: time.Minute, Stdout: out,
			OnStarted: func(r string) { mu.Lock(); serving = append(serving, r); mu.Unlock() },
		})
		done <- err
	}()
	pt.Eventually(t, time.Minute, "the command's first line", func() bool { return strings.HasPrefix(out.String(), "begin\n") })
	mu.Lock()
	first := serving[0]
	mu.Unlock()
	w := env.Worker(first)
	if w == nil {
		t.Fatalf("no live exec-worker %s", first)
	}
	if err := w.Kill(); err != nil {
		t.Fatal(err)
	}
	err := <-done
	mu.Lock()
	exit := "none"
	if res.ExitCode != nil {
		exit = fmt.Sprint(*res.ExitCode)
	}
	t.Logf("exec-worker %s killed mid-command; served by %v; exit %s, error %v", first, serving, exit, err)
	mu.Unlock()
	want := "begin\n" + l.lease + "\nend\n"
	switch {
	case err == nil:
		if res.ExitCode == nil || *res.ExitCode != 0 || out.String() != want {
			t.Errorf("the command across the kill: exit %v stdout %q, want exit 0 and %q once", res.ExitCode, out.String(), want)
		}
	case errors.Is(err, context.DeadlineExceeded):
		t.Errorf("the command across the kill never ended: %v", err)
	default:
		t.Logf("the command across the kill ended with an error (honest): %v", err)
	}
	l.checkFiles(t, c)
}

// destroyed destroys the lease and checks its end: exactly one released (destroyed), no pod
// and no claim left, no failure in the run's events, and no resumed after the release.
func (l *reusable) destroyed(t *testing.T) {
	t.Helper()
	l.destroy(t)
	l.run.WaitFor(runTimeout, "released (destroyed)", func(evs []events.Received) bool {
		return len(released(evs, "")) > 0
	})
	pt.Eventually(t, time.Minute, "the lease's pod and claim gone", func() bool {
		_, err := l.cs.CoreV1().PersistentVolumeClaims(l.namespace).Get(t.Context(), policy.LeaseClaimName(l.lease), metav1.GetOptions{})
		return len(l.pods(t)) == 0 && err != nil
	})
	evs := l.run.Events()
	if rs := released(evs, ""); len(rs) != 1 || rs[0].State != events.ReleaseDestroyed {
		t.Errorf("lease %s: destroy answered %+v, want one released (destroyed)", l.lease, rs)
	}
	checkNoFailure(t, l.run)
}

// syncBuffer is an io.Writer safe to read while it is written.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// TestResumeRacesDestroyAndSweep runs a resume against the two other things that can happen to
// a reusable lease meanwhile, each at a moment held still, and checks one coherent outcome:
//
//   - a destroy while the resume's new pod comes up (created, not ready): the resume is
//     answered once, at once (not after --release-timeout), either resumed before the
//     destroy's released or failed lease_not_found; no resumed after released; no pod and no
//     claim left;
//   - a destroy while the resume waits as resuming for the old pod a sweep is deleting: the
//     same;
//   - the sweep suspending the lease when the resume comes (its old pod held): the resume
//     wins: resumed from suspended at generation 1, one pod, no `suspended` for the
//     generation the resume replaced, and the run ends released, not failed.
func TestResumeRacesDestroyAndSweep(t *testing.T) {
	defer restoreReplicas(t)
	company := pt.NewID("co")
	pt.CleanupTenant(t, clustertest.Clientset(t), company)
	startExecWorkers(t, 1)
	c := newExecClient(t)
	upDestroyed, heldDestroyed, swept := acquireReusable(t, company), acquireReusable(t, company), acquireReusable(t, company)
	swept.writeFiles(t, c)

	// The two held leases: released, their pods held, suspended by one sweep that stays in the
	// pods' deletion.
	for _, l := range []*reusable{heldDestroyed, swept} {
		l.hold(t)
		l.release(t, false)
	}
	upDestroyed.release(t, true)
	upDestroyed.awaitState(t, lease.StateSuspended, time.Minute)
	suspendBySweep(t)
	for _, l := range []*reusable{heldDestroyed, swept} {
		l.awaitState(t, lease.StateSuspending, time.Minute)
	}

	// A destroy while the resume's new pod comes up.
	podsUp := upDestroyed.watchPods(t)
	resumeUp := upDestroyed.resume(t)
	awaitAdded(t, podsUp, time.Minute)
	upDestroyed.destroy(t)
	destroyedAt := time.Now()

	// A destroy and a resume both waiting for the held pod; the sweep's suspend beside a
	// resume, waiting for it too.
	resumeHeld, resumeSwept := heldDestroyed.resume(t), swept.resume(t)
	heldDestroyed.awaitState(t, lease.StateResuming, time.Minute)
	swept.awaitState(t, lease.StateResuming, time.Minute)
	heldDestroyed.destroy(t)
	pt.Eventually(t, time.Minute, "the held lease's destroy to begin", func() bool {
		return heldDestroyed.record(t).State == lease.StateReleasing
	})
	for _, l := range []*reusable{heldDestroyed, swept} {
		l.unhold(t)
	}
	unheldAt := time.Now()

	for _, m := range []struct {
		l    *reusable
		id   string
		from time.Time
	}{{upDestroyed, resumeUp, destroyedAt}, {heldDestroyed, resumeHeld, unheldAt}} {
		m.l.awaitAnswer(t, m.id, resumeTimeout)
		took := time.Since(m.from)
		t.Logf("lease %s: resume answered %s after the destroy could proceed", m.l.lease, took.Round(time.Millisecond))
		if took > 30*time.Second {
			t.Errorf("lease %s: the resume was answered %s after its lease's destroy could proceed: a destroy must end the resume at once", m.l.lease, took.Round(time.Second))
		}
		m.l.checkDestroyedDuringResume(t, m.id)
	}

	swept.awaitAnswer(t, resumeSwept, resumeTimeout)
	swept.checkResumed(t, resumeSwept)
	swept.checkFiles(t, c)
	if s := pt.Only[events.RunSuspendedEvent](swept.run.Events()); len(s) != 0 {
		t.Errorf("lease %s: suspended %+v published for the generation its resume replaced", swept.lease, s)
	}
	swept.destroyed(t)
}

// checkDestroyedDuringResume checks the outcome of a resume (id) that raced the lease's
// destroy: exactly one answer to the resume, either resumed before the destroy's released or
// failed lease_not_found; exactly one released (destroyed); no pod and no claim left.
func (l *reusable) checkDestroyedDuringResume(t *testing.T, id string) {
	t.Helper()
	evs := l.run.WaitFor(runTimeout, "released (destroyed)", func(evs []events.Received) bool {
		return len(released(evs, "")) > 0
	})
	pt.Eventually(t, time.Minute, "the lease's pod and claim gone", func() bool {
		_, err := l.cs.CoreV1().PersistentVolumeClaims(l.namespace).Get(t.Context(), policy.LeaseClaimName(l.lease), metav1.GetOptions{})
		return len(l.pods(t)) == 0 && err != nil
	})
	resumed, failed := answers(evs, id)
	switch {
	case len(resumed)+len(failed) != 1:
		t.Errorf("lease %s: resume %s answered %d resumed and %d failed, want exactly one answer", l.lease, id, len(resumed), len(failed))
	case len(failed) == 1 && failed[0].Code != events.CodeLeaseNotFound:
		t.Errorf("lease %s: resume failed %+v, want lease_not_found", l.lease, failed[0])
	}
	var releasedSeq, resumedSeq uint64
	for _, e := range evs {
		switch ev := e.Event.(type) {
		case events.RunReleasedEvent:
			if ev.ReleaseID == "" && releasedSeq == 0 {
				releasedSeq = e.StreamSeq
			}
		case events.RunResumedEvent:
			if ev.ResumeID == id {
				resumedSeq = e.StreamSeq
			}
		}
	}
	if resumedSeq > releasedSeq {
		t.Errorf("lease %s: resumed (#%d) after the destroy's released (#%d)", l.lease, resumedSeq, releasedSeq)
	}
	if rs := released(evs, ""); len(rs) != 1 || rs[0].State != events.ReleaseDestroyed {
		t.Errorf("lease %s: destroy answered %+v, want one released (destroyed)", l.lease, rs)
	}
	if rec := l.record(t); rec.State != lease.StateDestroyed {
		t.Errorf("lease %s: record %s, want destroyed", l.lease, rec.State)
	}
	t.Logf("lease %s: resume answered %d resumed, %d failed", l.lease, len(resumed), len(failed))
}
