package dispatch

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/k8s"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/tenant"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// sandboxImage is the local cluster's Paperclip sandbox (hack/cluster/sandbox-image.sh): a
// userland with a shell, uid 1000.
const sandboxImage = "kubeclip.local/sandbox:dev"

// clock is a test's clock, moved on by hand past an idle window or a maximum age.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// reuseEnv is a tenant-worker and a dispatcher in this process, on an in-process JetStream and
// the local cluster. The dispatcher's sweep loop waits an hour between passes: tests call
// sweepLeases themselves after moving the clock.
type reuseEnv struct {
	d       *Dispatcher
	js      jetstream.JetStream
	cs      kubernetes.Interface
	pub     *events.Publisher
	records lease.Records
	clock   *clock
	s       events.Subjects
}

const (
	testIdleWindow = time.Minute
	testMaxAge     = time.Hour
)

func startReuseEnv(t *testing.T) *reuseEnv {
	t.Helper()
	return startEnv(t, nil)
}

// startEnv is startReuseEnv with the dispatcher's options changed by tweak (nil: none); the
// tenant-worker takes the same Operator.
func startEnv(t *testing.T, tweak func(*Options)) *reuseEnv {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	cs, dyn, md := clusterClients(t)
	_, _, js := natstest.Start(t)
	if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := lease.EnsureBuckets(ctx, js, lease.BucketOptions{}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	applier, err := k8s.NewApplier(k8s.ApplierOptions{Dynamic: dyn, Mapper: k8s.NewRESTMapper(cs.Discovery())})
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	var s events.Subjects
	log := zerolog.New(zerolog.NewTestWriter(t))
	op := policy.Operator{PreloadedImages: policy.DefaultPreloadedImages}
	clk := &clock{t: time.Now()}
	opts := Options{
		Clientset: cs, Dynamic: dyn, Metadata: md, Applier: applier, JetStream: js, Subjects: s, Logger: log,
		Now: clk.Now, SandboxKey: key, Operator: op, ReleaseTimeout: time.Minute,
		LeaseIdleWindow: testIdleWindow, LeaseMaxAge: testMaxAge, LeaseSweepInterval: time.Hour,
	}
	if tweak != nil {
		tweak(&opts)
	}
	tw, err := tenant.New(tenant.Options{Clientset: cs, Applier: applier, JetStream: js, Subjects: s, Logger: log, Operator: opts.Operator})
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := events.NewPublisher(events.PublisherOptions{JS: js, Subjects: s})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, run := range []func(context.Context) error{tw.Run, d.Run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("worker stopped: %v", err)
			}
		}()
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	for _, ready := range []<-chan struct{}{tw.Ready(), d.Ready()} {
		select {
		case <-ready:
		case <-time.After(30 * time.Second):
			t.Fatal("workers not ready")
		}
	}
	return &reuseEnv{d: d, js: js, cs: cs, pub: pub, records: lease.Records{KV: kv}, clock: clk, s: s}
}

// reusableConfig is backend pod on the sandbox image.
func reusableConfig(backend string) json.RawMessage {
	return pipelinetest.StubConfig(nil, func(c map[string]any) {
		c["backend"] = backend
		c["podActivityDeadlineSec"] = 600
		c["adapters"].([]any)[0].(map[string]any)["runtimeImage"] = sandboxImage
	})
}

// acquire publishes a reusable acquire for a fresh company (its namespace deleted when the test
// ends) and returns the run.
func (e *reuseEnv) acquire(t *testing.T, backend string) events.RunRef {
	t.Helper()
	company, run := pipelinetest.NewID("co"), pipelinetest.NewID("run")
	pipelinetest.CleanupTenant(t, e.cs, company)
	if _, err := e.pub.Publish(t.Context(), events.AcquireRequest{
		RunID: run, CompanyID: company, EnvironmentID: "env-1", AgentID: pipelinetest.NewID("agent"),
		Config: reusableConfig(backend), ReuseLease: true,
	}); err != nil {
		t.Fatal(err)
	}
	return events.Ref(company, run)
}

// next waits for the run's next event of kind after seq (0: from the start) and returns its
// payload and sequence.
func (e *reuseEnv) next(t *testing.T, ref events.RunRef, kind events.RunKind, after uint64) (map[string]any, uint64) {
	t.Helper()
	subj, err := e.s.Run(ref.CompanyID, ref.RunID, kind)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := e.js.Stream(t.Context(), e.s.RunStream())
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	var seq uint64
	eventually(t, string(kind)+" of run "+ref.RunID, func() bool {
		m, err := stream.GetLastMsgForSubject(t.Context(), subj)
		if err != nil || m.Sequence <= after {
			return false
		}
		seq = m.Sequence
		return json.Unmarshal(m.Data, &got) == nil
	})
	return got, seq
}

// drained waits until the dispatcher has handled every lease request published so far.
func (e *reuseEnv) drained(t *testing.T) {
	t.Helper()
	cons, err := e.js.Consumer(t.Context(), e.s.LeaseStream(), events.DispatcherEndConsumer)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the lease requests handled", func() bool {
		info, err := cons.Info(t.Context())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
}

func (e *reuseEnv) record(t *testing.T, ref events.RunRef) lease.Record {
	t.Helper()
	rec, _, err := e.records.Get(t.Context(), ref)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func (e *reuseEnv) waitState(t *testing.T, ref events.RunRef, want lease.State) lease.Record {
	t.Helper()
	var rec lease.Record
	eventually(t, "lease "+string(want), func() bool { rec = e.record(t, ref); return rec.State == want })
	return rec
}

func (e *reuseEnv) publish(t *testing.T, ev events.Event, opts ...jetstream.PublishOpt) {
	t.Helper()
	if _, err := e.pub.Publish(t.Context(), ev, opts...); err != nil {
		t.Fatal(err)
	}
}

// exec runs a shell command in the lease's pod (Kubernetes exec into the agent container) and
// returns its stdout.
func (e *reuseEnv) exec(t *testing.T, rec lease.Record, script string) string {
	t.Helper()
	opts := &corev1.PodExecOptions{Container: policy.AgentContainerName, Command: []string{"sh", "-c", script}, Stdout: true, Stderr: true}
	url := e.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(rec.Namespace).Name(rec.WorkloadName).SubResource("exec").
		VersionedParams(opts, scheme.ParameterCodec).URL()
	ex, err := remotecommand.NewWebSocketExecutor(clustertest.Config(t), "GET", url.String())
	if err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := ex.StreamWithContext(t.Context(), remotecommand.StreamOptions{Stdout: &out, Stderr: &errOut}); err != nil {
		t.Fatalf("exec %q: %v (stderr %q)", script, err, errOut.String())
	}
	return out.String()
}

func (e *reuseEnv) pod(t *testing.T, rec lease.Record) (*corev1.Pod, bool) {
	t.Helper()
	p, err := e.cs.CoreV1().Pods(rec.Namespace).Get(t.Context(), rec.WorkloadName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return p, true
}

func (e *reuseEnv) claimExists(t *testing.T, rec lease.Record) bool {
	t.Helper()
	c, err := e.cs.CoreV1().PersistentVolumeClaims(rec.Namespace).Get(t.Context(), rec.VolumeClaim, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		t.Fatal(err)
	}
	return c.DeletionTimestamp == nil
}

// TestReusableLeaseLife follows one reusable lease on backend pod through the local cluster:
// acquired with its claim, which the pod mounts at /workspace and $HOME; released (retained,
// same pod) and resumed at once; released, suspended after the idle window (pod gone, claim
// kept, `suspended`); resumed with a new pod on the same claim that finds both files; a
// redelivered resume makes no second pod; and destroyed, pod, claim and Secret gone.
func TestReusableLeaseLife(t *testing.T) {
	e := startReuseEnv(t)
	ref := e.acquire(t, "pod")
	created, _ := e.next(t, ref, events.KindCreated, 0)
	rec := e.record(t, ref)
	if !rec.Reusable || rec.VolumeClaim != policy.LeaseClaimName(rec.WorkloadName) || created["providerLeaseId"] != rec.WorkloadName {
		t.Fatalf("record %+v, created %v: want a reusable lease naming its claim", rec, created)
	}
	if !e.claimExists(t, rec) {
		t.Fatalf("claim %s was not created", rec.VolumeClaim)
	}
	if err := waitReadyFor(t, e.cs, rec); err != nil {
		t.Fatal(err)
	}
	first, _ := e.pod(t, rec)
	e.exec(t, rec, `echo ws > /workspace/mark && echo home > "$HOME/mark"`)

	release := events.ReleaseRequest{RunID: ref.RunID, CompanyID: ref.CompanyID, ProviderLeaseID: rec.WorkloadName, ReleaseID: "1"}
	e.publish(t, release)
	released, relSeq := e.next(t, ref, events.KindReleased, 0)
	if released["state"] != string(events.ReleaseStopped) {
		t.Fatalf("released %v, want stopped", released)
	}
	rec = e.waitState(t, ref, lease.StateRetained)
	if p, ok := e.pod(t, rec); !ok || p.UID != first.UID {
		t.Fatal("a retained lease lost its pod")
	}

	// Resume of a retained lease: at once, the same pod.
	resume := events.ResumeRequest{RunID: ref.RunID, CompanyID: ref.CompanyID, ProviderLeaseID: rec.WorkloadName, ResumeID: "r1"}
	e.publish(t, resume)
	resumed, resSeq := e.next(t, ref, events.KindResumed, 0)
	if resumed["from"] != string(events.ResumedFromRetained) || resumed["resumes"] != 1.0 {
		t.Errorf("resumed %v, want from retained, resumes 1", resumed)
	}
	rec = e.waitState(t, ref, lease.StateCreated)
	if p, ok := e.pod(t, rec); !ok || p.UID != first.UID {
		t.Fatal("resuming a retained lease replaced its pod")
	}

	// Released again, then idle past the window: suspended.
	// A reusable lease is released once per run: each release names itself (releaseId), or
	// JetStream would drop the second as a repeat of the first.
	release.ReleaseID = "2"
	e.publish(t, release)
	e.waitState(t, ref, lease.StateRetained)
	if err := e.d.sweepLeases(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := e.record(t, ref).State; got != lease.StateRetained {
		t.Fatalf("swept within the idle window: %s, want retained", got)
	}
	e.clock.add(testIdleWindow)
	if err := e.d.sweepLeases(t.Context()); err != nil {
		t.Fatal(err)
	}
	rec = e.waitState(t, ref, lease.StateSuspended)
	if _, ok := e.pod(t, rec); ok {
		t.Fatal("a suspended lease still has its pod")
	}
	if !e.claimExists(t, rec) {
		t.Fatal("suspending deleted the claim")
	}
	suspended, _ := e.next(t, ref, events.KindSuspended, 0)
	if suspended["volumeClaim"] != rec.VolumeClaim || suspended["generation"] != 0.0 {
		t.Errorf("suspended %v, want generation 0 and claim %s", suspended, rec.VolumeClaim)
	}

	// Resume of a suspended lease: a new pod on the same claim, ready, with both files.
	resume.ResumeID = "r2"
	e.publish(t, resume)
	resumed, resSeq = e.next(t, ref, events.KindResumed, resSeq)
	if resumed["from"] != string(events.ResumedFromSuspended) || resumed["generation"] != 1.0 || resumed["resumes"] != 2.0 {
		t.Errorf("resumed %v, want from suspended, generation 1, resumes 2", resumed)
	}
	rec = e.waitState(t, ref, lease.StateCreated)
	second, ok := e.pod(t, rec)
	if !ok || second.UID == first.UID {
		t.Fatal("resuming a suspended lease made no new pod")
	}
	if got := e.exec(t, rec, `cat /workspace/mark "$HOME/mark"`); got != "ws\nhome\n" {
		t.Errorf("the new pod reads %q, want the first pod's files %q", got, "ws\nhome\n")
	}

	// The same resume delivered again (a new message id, as a redelivery after a lost ack
	// would be): nothing new, and no second answer.
	e.publish(t, resume, jetstream.WithMsgID("redelivered-r2"))
	e.drained(t)
	// The host retrying the resume (a new call, so a new resumeId): no new pod either, and an
	// answer of its own with the same count.
	resume.ResumeID = "r2-retry"
	e.publish(t, resume)
	resumed, _ = e.next(t, ref, events.KindResumed, resSeq)
	if resumed["resumeId"] != "r2-retry" || resumed["resumes"] != 2.0 || resumed["generation"] != 1.0 {
		t.Errorf("the retried resume's answer: %v, want resumeId r2-retry, resumes 2, generation 1", resumed)
	}
	if p, ok := e.pod(t, rec); !ok || p.UID != second.UID {
		t.Fatal("a redelivered resume replaced the pod")
	}
	if got := e.record(t, ref); got.Generation != 1 || got.Resumes != 2 {
		t.Errorf("after a redelivered resume: generation %d, resumes %d; want 1, 2", got.Generation, got.Resumes)
	}

	// Destroy: pod, claim and Secret gone.
	destroy := release
	destroy.Destroy = true
	e.publish(t, destroy)
	eventually(t, "released destroyed", func() bool {
		ev, seq := e.next(t, ref, events.KindReleased, relSeq)
		relSeq = seq
		return ev["state"] == string(events.ReleaseDestroyed)
	})
	rec = e.waitState(t, ref, lease.StateDestroyed)
	if _, ok := e.pod(t, rec); ok {
		t.Error("destroy left the pod")
	}
	if e.claimExists(t, rec) {
		t.Error("destroy left the claim")
	}
	if _, err := e.cs.CoreV1().Secrets(rec.Namespace).Get(t.Context(), rec.SecretName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("destroy left the Secret (%v)", err)
	}
}

// waitReadyFor waits until the lease's pod is ready.
func waitReadyFor(t *testing.T, cs kubernetes.Interface, rec lease.Record) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	_, err := workload.For(policy.BackendPod, workload.Deps{Clientset: cs})
	if err != nil {
		return err
	}
	for {
		p, err := cs.CoreV1().Pods(rec.Namespace).Get(ctx, rec.WorkloadName, metav1.GetOptions{})
		if err == nil {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return errors.New("the lease's pod did not become ready")
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// TestSuspendedLeaseCollectedPastMaxAge: a lease suspended (here by a release that cancels
// active work, which suspends at once) and left past the operator's maximum age is collected:
// claim and Secret deleted, `released` destroyed, the record collected; a resume then is
// lease_not_found, the answer that makes the host acquire afresh.
func TestSuspendedLeaseCollectedPastMaxAge(t *testing.T) {
	e := startReuseEnv(t)
	ref := e.acquire(t, "pod")
	e.next(t, ref, events.KindCreated, 0)
	rec := e.record(t, ref)
	e.publish(t, events.ReleaseRequest{RunID: ref.RunID, CompanyID: ref.CompanyID, ProviderLeaseID: rec.WorkloadName, CancelActiveWork: true})
	rec = e.waitState(t, ref, lease.StateSuspended)
	if _, ok := e.pod(t, rec); ok {
		t.Fatal("a release cancelling active work left the pod")
	}
	_, relSeq := e.next(t, ref, events.KindReleased, 0)

	e.clock.add(testMaxAge - time.Second)
	if err := e.d.sweepLeases(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := e.record(t, ref).State; got != lease.StateSuspended {
		t.Fatalf("collected before its maximum age: %s", got)
	}
	e.clock.add(time.Second)
	if err := e.d.sweepLeases(t.Context()); err != nil {
		t.Fatal(err)
	}
	rec = e.waitState(t, ref, lease.StateCollected)
	if ev, _ := e.next(t, ref, events.KindReleased, relSeq); ev["state"] != string(events.ReleaseDestroyed) {
		t.Errorf("released %v after collection, want destroyed", ev)
	}
	if e.claimExists(t, rec) {
		t.Error("collection left the claim")
	}
	e.publish(t, events.ResumeRequest{RunID: ref.RunID, CompanyID: ref.CompanyID, ProviderLeaseID: rec.WorkloadName, ResumeID: "late"})
	failed, _ := e.next(t, ref, events.KindFailed, 0)
	if failed["code"] != string(events.CodeLeaseNotFound) || failed["request"] != string(events.LeaseResume) || failed["requestId"] != "late" {
		t.Errorf("resume of a collected lease: %v, want lease_not_found", failed)
	}
}

// TestResumeRefusals: a resume of another company's lease finds nothing and changes nothing,
// and a reusable acquire on backend job fails at once with backend_unavailable naming
// config.backend, leaving no claim.
func TestResumeRefusals(t *testing.T) {
	e := startReuseEnv(t)
	ref := e.acquire(t, "pod")
	e.next(t, ref, events.KindCreated, 0)
	rec := e.record(t, ref)
	e.publish(t, events.ReleaseRequest{RunID: ref.RunID, CompanyID: ref.CompanyID, ProviderLeaseID: rec.WorkloadName})
	e.waitState(t, ref, lease.StateRetained)

	attacker := events.Ref(pipelinetest.NewID("co"), ref.RunID)
	e.publish(t, events.ResumeRequest{RunID: ref.RunID, CompanyID: attacker.CompanyID, ProviderLeaseID: rec.WorkloadName, ResumeID: "x"})
	failed, _ := e.next(t, attacker, events.KindFailed, 0)
	if failed["code"] != string(events.CodeLeaseNotFound) {
		t.Errorf("resume of another company's lease: %v, want lease_not_found", failed)
	}
	if got := e.record(t, ref); got.State != lease.StateRetained || got.Resumes != 0 {
		t.Errorf("the victim's lease moved: %s, resumes %d", got.State, got.Resumes)
	}

	job := e.acquire(t, "job")
	failed, _ = e.next(t, job, events.KindFailed, 0)
	if failed["code"] != string(events.CodeBackendUnavailable) || failed["field"] != "config.backend" {
		t.Errorf("reusable acquire on backend job: %v, want backend_unavailable naming config.backend", failed)
	}
	if got := e.record(t, job); got.State != lease.StateFailed || got.WorkloadName != "" || got.VolumeClaim != "" {
		t.Errorf("the refused lease: %+v, want failed with nothing created", got)
	}
}

// TestMaxAgeBelowRecordTTL: a dispatcher whose reusable lease maximum age is not below the lease
// records' TTL does not start: a suspended lease's record would expire before its collection,
// leaving its volume with nothing to collect it.
func TestMaxAgeBelowRecordTTL(t *testing.T) {
	_, _, js := natstest.Start(t)
	ctx := t.Context()
	if err := events.EnsureStreams(ctx, js, events.Options{LeaseMaxAge: time.Hour, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := lease.EnsureBuckets(ctx, js, lease.BucketOptions{RecordTTL: 2 * time.Hour, LeaseMaxAge: time.Hour}); err != nil {
		t.Fatal(err)
	}
	cs, dyn, md := clusterClients(t)
	applier, err := k8s.NewApplier(k8s.ApplierOptions{Dynamic: dyn, Mapper: k8s.NewRESTMapper(cs.Discovery())})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		maxAge  time.Duration
		wantErr bool
	}{{2 * time.Hour, true}, {time.Hour, false}} {
		d, err := New(Options{Clientset: cs, Dynamic: dyn, Metadata: md, Applier: applier, JetStream: js, Logger: zerolog.New(zerolog.NewTestWriter(t)), LeaseMaxAge: tc.maxAge})
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- d.Run(rctx) }()
		select {
		case err = <-done:
		case <-d.Ready():
			cancel()
			err = <-done
		}
		cancel()
		if gotErr := err != nil && strings.Contains(err.Error(), "maximum age"); gotErr != tc.wantErr {
			t.Errorf("max age %s: Run() = %v, want refused %v", tc.maxAge, err, tc.wantErr)
		}
	}
}

// expiresAt reads an event's expiresAt; the zero time when it has none.
func expiresAt(t *testing.T, ev map[string]any) time.Time {
	t.Helper()
	s, ok := ev["expiresAt"].(string)
	if !ok {
		return time.Time{}
	}
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("expiresAt %q: %v", s, err)
	}
	return at
}

// TestResumedLeaseExpiry: a reusable lease's expiry is renewed by each resume and enforced by
// the sweep, not by its pod. The pod has no activeDeadlineSeconds (which counts from the pod's
// start and would kill a run resumed near it); `created` and each `resumed` carry the expiry
// from then on (the run deadline, podActivityDeadlineSec, after the acquire or the resume); the
// sweep leaves a lease in use until that moment and suspends it then (pod deleted, volume kept,
// the agent freed); a later resume renews it again on a new pod.
func TestResumedLeaseExpiry(t *testing.T) {
	e := startReuseEnv(t)
	const runDeadline = 600 * time.Second // reusableConfig's podActivityDeadlineSec
	acquiredAt := e.clock.Now()
	ref := e.acquire(t, "pod")
	created, _ := e.next(t, ref, events.KindCreated, 0)
	if got, want := expiresAt(t, created), acquiredAt.Truncate(time.Second).Add(runDeadline); !got.Equal(want) {
		t.Errorf("created expiresAt %s, want %s", got, want)
	}
	rec := e.record(t, ref)
	if err := waitReadyFor(t, e.cs, rec); err != nil {
		t.Fatal(err)
	}
	if p, _ := e.pod(t, rec); p.Spec.ActiveDeadlineSeconds != nil {
		t.Errorf("the reusable lease's pod has activeDeadlineSeconds %d: the kubelet would end it at the acquire's expiry whatever a resume renewed", *p.Spec.ActiveDeadlineSeconds)
	}

	e.publish(t, events.ReleaseRequest{RunID: ref.RunID, CompanyID: ref.CompanyID, ProviderLeaseID: rec.WorkloadName, ReleaseID: "0"})
	e.next(t, ref, events.KindReleased, 0) // as the host does, resumed only once released
	e.waitState(t, ref, lease.StateRetained)
	e.clock.add(runDeadline - 30*time.Second) // near the acquire's expiry: the case that was killed
	resumedAt := e.clock.Now()
	e.publish(t, events.ResumeRequest{RunID: ref.RunID, CompanyID: ref.CompanyID, ProviderLeaseID: rec.WorkloadName, ResumeID: "r1"})
	resumed, resSeq := e.next(t, ref, events.KindResumed, 0)
	want := resumedAt.Truncate(time.Second).Add(runDeadline)
	if got := expiresAt(t, resumed); !got.Equal(want) {
		t.Fatalf("resumed expiresAt %s (%v), want %s: the resume renews the expiry", got, resumed["expiresAt"], want)
	}
	rec = e.waitState(t, ref, lease.StateCreated)
	if rec.ExpiresAt == nil || !rec.ExpiresAt.Equal(want) {
		t.Fatalf("the record's expiry %v, want the one the host was told, %s", rec.ExpiresAt, want)
	}

	// In use past the acquire's expiry but within the renewed one: kept.
	e.clock.add(runDeadline - time.Second)
	if err := e.d.sweepLeases(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := e.record(t, ref).State; got != lease.StateCreated {
		t.Fatalf("swept a second before its expiry: %s, want created", got)
	}
	// At the expiry: suspended, the agent freed.
	e.clock.add(time.Second)
	if err := e.d.sweepLeases(t.Context()); err != nil {
		t.Fatal(err)
	}
	rec = e.waitState(t, ref, lease.StateSuspended)
	if _, ok := e.pod(t, rec); ok {
		t.Error("a lease suspended at its expiry kept its pod")
	}
	if !e.claimExists(t, rec) {
		t.Error("a lease suspended at its expiry lost its claim")
	}
	if holder, err := e.d.agents.holder(t.Context(), rec.CompanyID, rec.AgentID); err != nil || holder != "" {
		t.Errorf("the agent's guard after the lease was suspended at its expiry: %q (%v), want free", holder, err)
	}

	// A later resume: a new pod, the expiry renewed from then.
	resumedAt = e.clock.Now()
	e.publish(t, events.ResumeRequest{RunID: ref.RunID, CompanyID: ref.CompanyID, ProviderLeaseID: rec.WorkloadName, ResumeID: "r2"})
	resumed, _ = e.next(t, ref, events.KindResumed, resSeq)
	if got, want := expiresAt(t, resumed), resumedAt.Truncate(time.Second).Add(runDeadline); resumed["from"] != string(events.ResumedFromSuspended) || !got.Equal(want) {
		t.Errorf("resumed %v, want from suspended, expiresAt %s", resumed, want)
	}
}

// acquireFor publishes a reusable acquire of a run of agent in company and returns the run.
func (e *reuseEnv) acquireFor(t *testing.T, company, agent string) events.RunRef {
	t.Helper()
	run := pipelinetest.NewID("run")
	if _, err := e.pub.Publish(t.Context(), events.AcquireRequest{
		RunID: run, CompanyID: company, EnvironmentID: "env-1", AgentID: agent,
		Config: reusableConfig("pod"), ReuseLease: true,
	}); err != nil {
		t.Fatal(err)
	}
	return events.Ref(company, run)
}

// retainedLease is a reusable lease of a new company's agent, acquired and released: retained,
// its agent free.
func (e *reuseEnv) retainedLease(t *testing.T) lease.Record {
	t.Helper()
	company := pipelinetest.NewID("co")
	pipelinetest.CleanupTenant(t, e.cs, company)
	ref := e.acquireFor(t, company, pipelinetest.NewID("agent"))
	e.next(t, ref, events.KindCreated, 0)
	rec := e.record(t, ref)
	e.publish(t, events.ReleaseRequest{RunID: ref.RunID, CompanyID: ref.CompanyID, ProviderLeaseID: rec.WorkloadName, ReleaseID: "0"})
	// The record is retained before the agent is freed; the release's answer comes after both.
	e.next(t, ref, events.KindReleased, 0)
	rec = e.waitState(t, ref, lease.StateRetained)
	e.guardHeldBy(t, rec, "")
	return rec
}

func (e *reuseEnv) guardHeldBy(t *testing.T, rec lease.Record, want string) {
	t.Helper()
	holder, err := e.d.agents.holder(t.Context(), rec.CompanyID, rec.AgentID)
	if err != nil {
		t.Fatal(err)
	}
	if holder != want {
		t.Fatalf("agent %s held by %q, want %q", rec.AgentID, holder, want)
	}
}

// TestResumeTakesTheAgent: a resume holds the lease's agent as its acquire did (one run per agent
// at a time), in both orders. Resumed first, another run of the agent waits (parked) until the
// lease is released again, then starts. Another run first, the resume is refused with agent_busy
// naming agentId and the lease left retained, so the host retries it; once that run is released
// the resume goes through.
func TestResumeTakesTheAgent(t *testing.T) {
	e := startReuseEnv(t)

	t.Run("resume first", func(t *testing.T) {
		rec := e.retainedLease(t)
		e.publish(t, events.ResumeRequest{RunID: rec.RunID, CompanyID: rec.CompanyID, ProviderLeaseID: rec.WorkloadName, ResumeID: "r1"})
		e.next(t, rec.Ref(), events.KindResumed, 0)
		e.guardHeldBy(t, rec, rec.RunID)

		other := e.acquireFor(t, rec.CompanyID, rec.AgentID)
		parked, err := e.js.Stream(t.Context(), ParkedStream)
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, "the other run's dispatch parked", func() bool {
			_, err := parked.GetLastMsgForSubject(t.Context(), parkedSubject(rec.CompanyID, rec.AgentID))
			return err == nil
		})
		if got := e.record(t, other).State; got != lease.StateRequested {
			t.Fatalf("the other run's lease is %s beside the resumed one, want requested", got)
		}

		e.publish(t, events.ReleaseRequest{RunID: rec.RunID, CompanyID: rec.CompanyID, ProviderLeaseID: rec.WorkloadName, ReleaseID: "1"})
		e.next(t, other, events.KindCreated, 0)
		e.guardHeldBy(t, rec, other.RunID)
	})

	t.Run("other run first", func(t *testing.T) {
		rec := e.retainedLease(t)
		other := e.acquireFor(t, rec.CompanyID, rec.AgentID)
		e.next(t, other, events.KindCreated, 0)
		e.guardHeldBy(t, rec, other.RunID)

		e.publish(t, events.ResumeRequest{RunID: rec.RunID, CompanyID: rec.CompanyID, ProviderLeaseID: rec.WorkloadName, ResumeID: "busy"})
		failed, _ := e.next(t, rec.Ref(), events.KindFailed, 0)
		if failed["code"] != string(events.CodeAgentBusy) || failed["field"] != "agentId" || failed["request"] != string(events.LeaseResume) || failed["requestId"] != "busy" {
			t.Fatalf("resume while another run holds the agent: %v, want agent_busy naming agentId for request busy", failed)
		}
		if got := e.record(t, rec.Ref()); got.State != lease.StateRetained || got.Resumes != 0 {
			t.Fatalf("the refused resume moved the lease: %s, resumes %d", got.State, got.Resumes)
		}
		e.guardHeldBy(t, rec, other.RunID)

		otherRec := e.record(t, other)
		e.publish(t, events.ReleaseRequest{RunID: other.RunID, CompanyID: other.CompanyID, ProviderLeaseID: otherRec.WorkloadName, ReleaseID: "0"})
		e.next(t, other, events.KindReleased, 0) // answered once the agent is free
		e.waitState(t, other, lease.StateRetained)
		e.publish(t, events.ResumeRequest{RunID: rec.RunID, CompanyID: rec.CompanyID, ProviderLeaseID: rec.WorkloadName, ResumeID: "retry"})
		resumed, _ := e.next(t, rec.Ref(), events.KindResumed, 0)
		if resumed["resumeId"] != "retry" {
			t.Fatalf("resumed %v, want the retry's answer", resumed)
		}
		e.guardHeldBy(t, rec, rec.RunID)
	})
}

// TestLateResultKeepsAResumedLease: a reusable lease's one result (released, published when its
// first pod went at a suspend) may reach the dispatcher after a resume made the lease live again.
// It must neither finish the live lease (its next resume would be refused, and the host would
// drop the agent's workspace) nor free the agent its resume holds.
func TestLateResultKeepsAResumedLease(t *testing.T) {
	e := startReuseEnv(t)
	rec := e.retainedLease(t)
	e.publish(t, events.ResumeRequest{RunID: rec.RunID, CompanyID: rec.CompanyID, ProviderLeaseID: rec.WorkloadName, ResumeID: "r1"})
	e.next(t, rec.Ref(), events.KindResumed, 0)
	e.guardHeldBy(t, rec, rec.RunID)

	e.publish(t, events.RunResultEvent{RunID: rec.RunID, CompanyID: rec.CompanyID, Outcome: events.OutcomeReleased, Reason: events.ReasonReleased})
	cons, err := e.js.Consumer(t.Context(), e.s.RunStream(), events.DispatcherResultConsumer)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the result handled", func() bool {
		info, err := cons.Info(t.Context())
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.Delivered.Consumer > 0
	})
	if got := e.record(t, rec.Ref()).State; got != lease.StateCreated {
		t.Errorf("a late released result moved the resumed lease to %s, want created", got)
	}
	e.guardHeldBy(t, rec, rec.RunID)
}
