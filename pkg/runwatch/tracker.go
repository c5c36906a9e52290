package runwatch

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/runwatch/verdict"
	"github.com/kubeclip/kubeclip/pkg/workload"
)

// deps is what every run goroutine shares, built once by Watcher.Run: the settings, the
// publisher, the run stream, the ownership and lease buckets and the informer caches. None of
// it points back at the Watcher.
type deps struct {
	opts    Options
	log     zerolog.Logger
	pub     publisher
	stream  runStream
	owners  *owners
	leases  lease.Records
	cluster *clusterCache
	budgets runBudgets // the container logs'
	// workloads reach each backend's workload (workload.For): what the tracker observes of a
	// run, and whether a run the informers lost sight of still has one.
	workloads workload.Deps
}

// journalOptions is how a run's journal is made; log is the run's logger (its fields name the
// run).
func (d *deps) journalOptions(log zerolog.Logger) journalOptions {
	return journalOptions{subjects: d.opts.Subjects, pub: d.pub, stream: d.stream, now: d.opts.Now, interval: d.opts.FlushInterval, budgets: d.budgets, log: log}
}

// tracker follows one run: it wires the run's verdict (pkg/runwatch/verdict), its journal and
// its log follower. It publishes the run's status changes, runs the follower and publishes the
// result once the run is over and its last log line is out.
//
// Its state starts from what the run stream already holds, so a watcher that restarts (or takes
// over) resumes the log after the last published chunk and never publishes a second result.
type tracker struct {
	d         *deps
	ref       events.RunRef
	namespace string
	log       zerolog.Logger

	// wake has the watcher step the run (on one of its step workers, one step at a time).
	wake func()
	// inFlightEnded stops counting the run in flight (Observer.RunsInFlight).
	inFlightEnded func()
	// ownerEvents counts changes of the run's ownership key seen by the watcher; a replica
	// that lost the race for the run waits until it moves before claiming again.
	ownerEvents atomic.Uint64

	// Owned by the step in progress: the watcher never steps one run twice at once.
	backoff  time.Duration     // before the retry of a step that failed; 0 after a success
	workload workload.Workload // the lease's backend (workload.For), once ours
	// undispatched: before the next look at a lease not dispatched yet (own).
	undispatched time.Duration

	// acquiredAt is when the lease record was created (the acquire), from own.
	acquiredAt time.Time
	// readyReported: the run's start was reported (reportReady), here or by an earlier owner.
	readyReported bool
	blocked       bool   // another replica owns the run
	blockedAt     uint64 // ownerEvents when the claim was lost
	ours          bool   // the run has a lease in this installation's KUBECLIP_LEASES
	loaded        bool
	done          bool
	seenJob       bool
	seenPod       bool // an exec-capable lease's pod was seen: its absence now means it is gone
	status        statusLine
	follow        *follower
	end           *verdict.End // the run is over
	recheck       *time.Timer

	// Shared with the follower.
	journal *journal
}

// newTracker follows the run of ref in namespace; wake asks the watcher to step it.
func newTracker(d *deps, namespace string, ref events.RunRef, wake func()) *tracker {
	return &tracker{
		d:             d,
		ref:           ref,
		namespace:     namespace,
		log:           d.log.Hook(runLogFields(ref)),
		wake:          wake,
		inFlightEnded: countInFlight(d.opts.Observer),
		status:        newStatusLine(),
	}
}

// runLogFields names the run in each of its tracker's records. A hook, not the logger's own
// context: a context's fields take 500 bytes a logger, which every idle run would hold.
type runLogFields events.RunRef

func (r runLogFields) Run(e *zerolog.Event, _ zerolog.Level, _ string) {
	e.Str(events.LogKeyRunID, r.RunID).Str(events.LogKeyTenant, r.CompanyID)
}

// poke asks for the run to be looked at again; it never blocks.
func (t *tracker) poke() { t.wake() }

// Retries of a step that failed wait stepRetryBase, doubling up to stepRetryLimit. A run whose
// lease is not dispatched yet is looked at again after undispatchedRetryBase, doubling up to
// stepRetryLimit: the dispatcher's next step, milliseconds away.
const (
	stepRetryBase         = 100 * time.Millisecond
	stepRetryLimit        = 5 * time.Second
	undispatchedRetryBase = 5 * time.Millisecond
)

// wakeUp steps the run once (the watcher calls it when the run was poked) and reports finished
// once the run is done and neither its Job nor its pods are left: the watcher then forgets the
// run and stops its tracker.
func (t *tracker) wakeUp(ctx context.Context) (finished bool) {
	err := t.step(ctx)
	switch {
	case err == nil:
		t.backoff = 0
	case ctx.Err() != nil:
		return false
	default:
		// Publishing failed (NATS unreachable) or the stream could not be read: try again
		// with a growing pause; the Kubernetes state is still in the informer cache.
		t.backoff = min(max(2*t.backoff, stepRetryBase), stepRetryLimit)
		t.log.Warn().Err(err).Dur("retry_in", t.backoff).Msg("tracking run failed; retrying")
		time.AfterFunc(t.backoff, t.poke)
	}
	if t.done {
		t.inFlightEnded()
		return t.d.cluster.gone(t.ref, t.namespace)
	}
	return false
}

// stop ends what the tracker runs besides its steps (its recheck timer, its log follower)
// once the watcher forgot the run or stops; the run's state is in the stream, not here.
func (t *tracker) stop() {
	t.inFlightEnded()
	if t.recheck != nil {
		t.recheck.Stop()
	}
	if t.follow != nil {
		t.follow.stopAndWait()
	}
}

// ownerChanged is called by the watcher when the run's ownership key changed (expired, was
// released): the run may be free to take.
func (t *tracker) ownerChanged() {
	t.ownerEvents.Add(1)
	t.poke()
}

// own makes sure this replica owns the run before it acts on it. It returns false when another
// replica owns it, or when the run already has its result.
func (t *tracker) own(ctx context.Context) (bool, error) {
	owners := t.d.owners
	if owners.owns(t.ref) {
		return true, nil
	}
	if t.loaded {
		t.reset("ownership of the run was lost")
	}
	gen := t.ownerEvents.Load()
	if t.blocked && gen == t.blockedAt {
		return false, nil // nothing changed since another replica won it
	}
	if !t.ours {
		// Another kubeclip installation (its own NATS) may share the cluster: only the runs
		// leased here are this watcher's. The lease record exists before the workload does,
		// and names the namespace it went into: objects claiming the run elsewhere are not it.
		rec, _, err := t.d.leases.Get(ctx, t.ref)
		if errors.Is(err, lease.ErrNotFound) {
			t.log.Debug().Msg("run has no lease here; another installation's, ignored")
			t.done = true
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if rec.State == lease.StateRequested {
			// A warm pod an acquire just claimed carries the run's labels a moment before the
			// dispatcher's dispatch transition names it as the lease's workload: look again
			// shortly (no object of the run changes meanwhile to wake it).
			t.undispatched = min(max(2*t.undispatched, undispatchedRetryBase), stepRetryLimit)
			time.AfterFunc(t.undispatched, t.poke)
			return false, nil
		}
		if rec.Namespace != "" {
			// Objects labelled with the run elsewhere are not it (objects filters by namespace).
			t.namespace = rec.Namespace
		}
		w, err := workload.For(policy.Backend(rec.Backend), t.d.workloads)
		if err != nil {
			t.log.Error().Err(err).Msg("run's lease names no known backend; not following it")
			t.done = true
			return false, nil
		}
		t.workload, t.ours, t.acquiredAt = w, true, rec.CreatedAt
	}
	finished, err := resultPublished(ctx, t.d.stream, t.d.opts.Subjects, t.ref)
	if err != nil {
		return false, err
	}
	if finished {
		t.done = true
		return false, nil
	}
	ok, err := owners.claim(ctx, t.ref)
	if err != nil {
		return false, err
	}
	t.blocked, t.blockedAt = !ok, gen
	if ok {
		t.log.Debug().Str("replica", owners.id).Msg("owning run")
	}
	return ok, nil
}

// reset forgets everything learnt about the run, so it is loaded again from the stream by
// whichever replica owns it next.
func (t *tracker) reset(why string) {
	t.log.Info().Msg(why + "; dropping the run's state")
	if t.follow != nil {
		t.follow.stopAndWait()
		t.follow = nil
	}
	if t.recheck != nil {
		t.recheck.Stop()
		t.recheck = nil
	}
	if t.journal != nil {
		t.journal.stop()
	}
	t.loaded, t.journal, t.end = false, nil, nil
	t.status = newStatusLine()
}

// fenced handles a publish refused because another replica wrote the run's events: this
// replica gives the run up and, if the run is free again, reloads it from the stream.
func (t *tracker) fenced(ctx context.Context) {
	t.d.owners.release(ctx, t.ref)
	t.reset("another replica wrote this run's log")
	t.poke()
}

// load reads what was already published for the run (own checked it has no result yet): its
// last status, and its log, which the journal continues.
func (t *tracker) load(ctx context.Context) error {
	if err := t.status.load(ctx, t.d.stream, t.d.opts.Subjects, t.ref); err != nil {
		return err
	}
	j, err := loadJournal(ctx, t.ref, t.d.journalOptions(t.log))
	if err != nil {
		return err
	}
	t.journal = j
	if t.status.seq > 0 {
		// Someone published its status before this replica owned it; past Pending, that
		// owner reported the run ready.
		if lo := t.d.opts.lifecycle(); lo != nil {
			lo.RunTakenOver()
		}
		t.readyReported = t.status.phase != events.PhasePending
	}
	if seq := j.lastSeq(); seq > 0 {
		t.log.Info().Uint64("seq", seq).Msg("resuming run after its last published log chunk")
	}
	return nil
}

// step looks at the run's current Job and pod and publishes whatever changed.
func (t *tracker) step(ctx context.Context) error {
	if t.done {
		return nil
	}
	if ok, err := t.own(ctx); !ok || err != nil {
		return err
	}
	if !t.loaded {
		if err := t.load(ctx); err != nil {
			return err
		}
		t.loaded = true
	}
	job, pod := t.workload.Observe(t.d.cluster.objects(t.ref, t.namespace))
	if job != nil {
		t.seenJob = true
	}
	if pod != nil && t.workload.Backend().ExecCapable() {
		t.seenPod = true
	}
	if job == nil && pod == nil && !t.seenJob && !t.seenPod {
		return nil // a pod's event raced ahead of the informer's view of the Job
	}

	if t.end == nil {
		var release *verdict.Release
		if t.workload.Backend().ExecCapable() && (pod == nil || pod.DeletionTimestamp != nil) {
			// Its pod is going: a release decides how the run ended, if one began.
			var err error
			if release, err = leaseRelease(ctx, t.d, t.ref); err != nil {
				return err
			}
		}
		d := t.decide(job, pod, release)
		if d.End != nil {
			// The result waits for the log's tail (the follower's final read, k8s.ReadLogs):
			// start it now, while the terminal status is published, not a round trip later.
			if err := t.startFollowing(ctx, pod); err != nil {
				return err
			}
			if t.follow != nil {
				t.follow.stop()
			}
		}
		if err := t.publishStatus(ctx, d, pod); errors.Is(err, errFenced) {
			t.fenced(ctx)
			return nil
		} else if err != nil {
			return err
		}
		t.end = d.End
	}

	if t.follow != nil && t.follow.finished() && errors.Is(t.follow.err(), errFenced) {
		t.fenced(ctx)
		return nil
	}
	if t.follow != nil && t.end == nil && t.follow.finished() {
		// The follower gave up while the run goes on (a publish failed, the API server went
		// away): publish what it read, then follow again from the cursor.
		t.log.Warn().Err(t.follow.err()).Msg("log follower stopped early; restarting it")
		if err := t.flush(ctx); err != nil {
			return err
		}
		if t.journal == nil {
			return nil // fenced while flushing: the run is reloaded from the stream
		}
		t.follow = nil
	}
	if err := t.startFollowing(ctx, pod); err != nil {
		return err
	}

	if t.end == nil {
		return nil
	}
	// The run is over: let the follower read the rest of the log, then publish the result. The
	// step does not wait for the read (a step worker serves every run): the follower pokes once
	// it is finished.
	if t.follow != nil {
		t.follow.stop()
		if !t.follow.finished() {
			return nil
		}
		if err := t.follow.err(); err != nil && !errors.Is(err, context.Canceled) {
			t.log.Warn().Err(err).Msg("log follower ended with an error; publishing the result with the lines read")
		}
	}
	if err := t.flush(ctx); err != nil {
		return err
	}
	if t.journal == nil {
		return nil // fenced while flushing
	}
	if err := endRun(ctx, t.d, t.log, t.ref, *t.end, resultAgent(*t.end, t.workload.Backend(), t.journal)); err != nil {
		return err
	}
	t.done = true
	t.journal.stop()
	t.journal = nil // a finished run keeps no log state while its Job waits for its TTL
	t.d.owners.release(ctx, t.ref)
	return nil
}

// startFollowing starts the follower of the pod's container once it has run, unless one runs.
// An exec-capable lease's container log is sandboxd's own: its commands' output reaches clients
// through the exec service (and, when recorded, as exec events), not from here.
func (t *tracker) startFollowing(ctx context.Context, pod *corev1.Pod) error {
	container := t.d.opts.Container
	if t.follow != nil || pod == nil || t.workload.Backend().ExecCapable() || !containerStarted(pod, container) {
		return nil
	}
	if err := t.journal.setPod(pod.Name, container); err != nil {
		return err
	}
	target := followTarget{clientset: t.d.opts.Clientset, namespace: t.namespace, pod: pod.Name, container: container}
	t.follow = startFollower(ctx, target, t.journal, t.log, t.d.opts.Observer, t.poke)
	return nil
}

// decide asks for the run's verdict on its Job and pod, and on an exec-capable lease's release
// once one began; a verdict that changes with time alone (a grace running out) has the tracker
// look again then.
func (t *tracker) decide(job *batchv1.Job, pod *corev1.Pod, release *verdict.Release) verdict.Decision {
	opts := t.d.opts
	in := verdict.Input{Job: job, Pod: pod, SeenJob: t.seenJob, SeenPod: t.seenPod, ExecCapable: t.workload.Backend().ExecCapable(), Release: release}
	if job != nil {
		if q, refused := t.d.cluster.quotaRefusal(job); refused {
			in.QuotaRefusal = q.String()
		}
	}
	d := verdict.Decide(in, verdict.Options{
		Container: opts.Container, Now: opts.Now(),
		UnschedulableGrace: opts.UnschedulableGrace, StartErrorGrace: opts.StartErrorGrace,
	})
	if d.RecheckAfter > 0 {
		if t.recheck != nil {
			t.recheck.Stop()
		}
		t.recheck = time.AfterFunc(d.RecheckAfter, t.poke)
	}
	return d
}

// publishStatus publishes the run's status as decided, fenced on the last one this replica
// knows.
func (t *tracker) publishStatus(ctx context.Context, d verdict.Decision, pod *corev1.Pod) error {
	podName, podIP := "", ""
	if pod != nil {
		podName, podIP = pod.Name, pod.Status.PodIP
	}
	before := t.status.seq
	if err := t.status.publish(ctx, t.d.pub, t.ref, d.Phase, d.Reason, d.Message, podName, podIP); err != nil {
		return err
	}
	if t.status.seq != before {
		t.log.Debug().Str("phase", string(d.Phase)).Str("reason", d.Reason).Msg("published status")
		t.reportReady(pod)
	}
	return nil
}

// reportReady tells the LifecycleObserver, once per run, how long after the acquire the first
// status that found the agent's container started went out: Running, or the run's end when it
// was over before the watcher looked (a warm pod's container started before its acquire, so
// the container's own start time is not the measure).
func (t *tracker) reportReady(pod *corev1.Pod) {
	lo := t.d.opts.lifecycle()
	if lo == nil || t.readyReported || t.acquiredAt.IsZero() || pod == nil || !containerStarted(pod, t.d.opts.Container) {
		return
	}
	t.readyReported = true
	lo.RunReady(t.d.opts.Now().Sub(t.acquiredAt))
}

// flush publishes the journal's pending lines; a fenced publish gives the run up.
func (t *tracker) flush(ctx context.Context) error {
	err := t.journal.flush(ctx)
	if errors.Is(err, errFenced) {
		t.fenced(ctx)
		return nil
	}
	return err
}
