package isolation

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// sandboxImage is the local cluster's Paperclip sandbox (hack/cluster/sandbox-image.sh): a
// Debian userland whose coreutils the execs below run.
const sandboxImage = "kubeclip.local/sandbox:dev"

// podConfig is a pod lease's provider config: kubeclip's exec pod, running sandboxd, on the
// sandbox image, at the stub config's resources (500m CPU at most). The noisy company keeps them
// too: a pod's CPU is its own tenant's, bounded by its limit, and a pod let loose on both cores
// of this machine would measure the kernel's scheduler, not kubeclip.
func podConfig() json.RawMessage {
	return pt.StubConfig(nil, func(c map[string]any) {
		c["backend"] = "pod"
		c["podActivityDeadlineSec"] = 900
		c["adapters"].([]any)[0].(map[string]any)["runtimeImage"] = sandboxImage
	})
}

// podLease is an acquired pod lease, ready for execs.
type podLease struct {
	run *pt.Run
	execclient.Lease
}

// acquirePod acquires a pod lease of company and waits until its pod is ready.
func acquirePod(t *testing.T, company string) *podLease {
	t.Helper()
	r := env.Acquire(t, company, pt.NewID("agent"), podConfig())
	created := pt.WaitKind[events.RunCreatedEvent](r, runTimeout)
	r.WaitFor(runTimeout, "status Running/Ready", func(evs []events.Received) bool {
		for _, st := range pt.Only[events.RunStatusEvent](evs) {
			if st.Phase == events.PhaseRunning && st.Reason == events.ReasonReady {
				return true
			}
		}
		return false
	})
	return &podLease{run: r, Lease: execclient.Lease{CompanyID: company, RunID: r.RunID, ProviderLeaseID: created.ProviderLeaseID}}
}

// release releases the lease and waits for its run's result, which must be released: the
// normal end of an exec lease.
func (l *podLease) release(t *testing.T) {
	t.Helper()
	l.run.Release(l.ProviderLeaseID, false)
	if res := pt.WaitKind[events.RunResultEvent](l.run, runTimeout); res.Outcome != events.OutcomeReleased {
		t.Errorf("company %s's pod lease %s: result %s (%s: %s), want released", l.CompanyID, l.RunID, res.Outcome, res.Reason, res.Message)
	}
}

// newExecClient is an exec client of company on a NATS connection of its own, so the test
// measures kubeclip's workers, not one test connection's reader delivering B's messages behind
// thousands of A's. (A Paperclip serving both companies shares its connection between them; that
// is the plugin's, not the workers'.)
func newExecClient(t *testing.T, company string) *execclient.Client {
	t.Helper()
	nc, err := nats.Connect(env.NATS.URL(), nats.Name("isolation-"+company), nats.CustomInboxPrefix(inbox.CLIPrefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	c, err := execclient.New(execclient.Options{NATS: nc, Subjects: env.Subjects})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// quietExecs runs n short execs in l one after another, recorded or not, as an agent's
// commands are, and returns their round trips (start → exit received) and what each printed, by
// exec id. Each must exit 0 having printed its own token, whole.
func quietExecs(t *testing.T, c *execclient.Client, l *podLease, phase string, n int, record bool) ([]time.Duration, map[string]string) {
	t.Helper()
	var took []time.Duration
	printed := map[string]string{}
	for i := range n {
		token := fmt.Sprintf("%s-%d", phase, i+1)
		x := execclient.Exec{Lease: l.Lease, ID: pt.NewID("exec"), Command: "echo", Args: []string{token}, Record: record, Timeout: time.Minute}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		start := time.Now()
		res, err := c.Run(ctx, x)
		took = append(took, time.Since(start))
		cancel()
		if err != nil || res.ExitCode == nil || *res.ExitCode != 0 || string(res.Stdout) != token+"\n" {
			t.Fatalf("company %s's exec %d %s (%s): exit %v, stdout %q, stderr %q, err %v; want exit 0 printing %q",
				l.CompanyID, i+1, x.ID, phase, res.ExitCode, res.Stdout, res.Stderr, err, token+"\n")
		}
		printed[x.ID] = token + "\n"
	}
	return took, printed
}

// checkRecorded checks that the run's history holds every exec of printed whole: its output as
// printed, then its final event with exit code 0, recording never stopped.
func checkRecorded(t *testing.T, l *podLease, printed map[string]string) {
	t.Helper()
	evs := l.run.WaitFor(runTimeout, "the final event of every exec", func(evs []events.Received) bool {
		n := 0
		for _, ev := range pt.Only[events.RunExecEvent](evs) {
			if _, ok := printed[ev.ExecID]; ok && ev.Exit != nil {
				n++
			}
		}
		return n == len(printed)
	})
	text := map[string]string{}
	for _, ev := range pt.Only[events.RunExecEvent](evs) {
		want, ok := printed[ev.ExecID]
		switch {
		case !ok:
		case ev.RecordingStopped != "":
			t.Errorf("company %s's exec %s: recording stopped by the %s budget", l.CompanyID, ev.ExecID, ev.RecordingStopped)
		case ev.Exit != nil:
			if ev.Exit.ExitCode == nil || *ev.Exit.ExitCode != 0 || text[ev.ExecID] != want {
				t.Errorf("company %s's exec %s recorded %q and exit %v, want %q and exit 0", l.CompanyID, ev.ExecID, text[ev.ExecID], ev.Exit.ExitCode, want)
			}
		default:
			text[ev.ExecID] += ev.Text
		}
	}
}

// loudExec is what company A's loud exec got: the bytes its client received, the notices, and
// how it ended.
type loudExec struct {
	id       string
	received int64
	notices  []execproto.Notice
	res      execclient.Result
	err      error
	// took is the whole exec's round trip; stoppedAfter is when the notice arrived.
	took, stoppedAfter time.Duration
}

// byteCount counts the bytes written to it.
type byteCount struct {
	mu sync.Mutex
	n  int64
}

func (c *byteCount) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n += int64(len(b))
	return len(b), nil
}

// runLoudExec prints loudExecBytes of /dev/zero as base64 in l, recorded, as fast as the pod
// and the recording take it: past the company's daily recorded-output budget in under a minute
// here (each 16 KiB event is a budget charge, a progress write and a publish, in turn).
func runLoudExec(t *testing.T, c *execclient.Client, l *podLease) loudExec {
	var out byteCount
	var mu sync.Mutex
	got := loudExec{id: pt.NewID("exec")}
	x := execclient.Exec{
		Lease: l.Lease, ID: got.id, Command: "sh", Args: []string{"-c", "head -c " + strconv.Itoa(loudExecBytes) + " /dev/zero | base64"},
		Record: true, Timeout: 3 * time.Minute, Stdout: &out,
	}
	start := time.Now()
	x.OnNotice = func(n execproto.Notice) {
		mu.Lock()
		defer mu.Unlock()
		if got.notices = append(got.notices, n); len(got.notices) == 1 {
			got.stoppedAfter = time.Since(start)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	got.res, got.err = c.Run(ctx, x)
	got.took = time.Since(start)
	mu.Lock()
	defer mu.Unlock()
	got.received = out.n
	got.notices = slices.Clone(got.notices)
	return got
}

// loudExecOutput is how many bytes base64 prints for loudExecBytes of input: four characters
// per three bytes, and a newline after every 76 characters and after the last line.
func loudExecOutput() int64 {
	chars := int64(loudExecBytes+2) / 3 * 4
	return chars + (chars+75)/76
}

// checkLoudExec checks the designed behaviour of a recording past its company's budget
// (execproto.NoticeRecordingStopped, events.RunExecEvent.RecordingStopped): the command is not
// killed and its client receives all of its output, the client is told in a notice naming the
// company's budget, and the run's history stops at the budget with an event that says so and
// keeps the final event.
func checkLoudExec(t *testing.T, l *podLease, got loudExec) {
	t.Helper()
	budget := (&events.BudgetExceededError{
		Kind: events.BudgetCompany, Limit: companyBudget(), Source: events.BudgetSourceExec, Company: l.CompanyID, Window: events.DefaultBudgetWindow,
	}).Budget()
	if got.err != nil || got.res.ExitCode == nil || *got.res.ExitCode != 0 {
		t.Errorf("company A's loud exec: exit %v, err %v; want exit 0 (a budget stops the recording, not the command)", got.res.ExitCode, got.err)
	}
	if want := loudExecOutput(); got.received != want {
		t.Errorf("company A's loud exec: its client received %d bytes, want all %d", got.received, want)
	}
	if len(got.notices) != 1 || got.notices[0].Reason != execproto.NoticeRecordingStopped || !strings.Contains(got.notices[0].Message, budget) {
		t.Errorf("company A's loud exec: notices %+v; want one %s naming %q", got.notices, execproto.NoticeRecordingStopped, budget)
	} else {
		t.Logf("company A's loud exec: notice %s: %s", got.notices[0].Reason, got.notices[0].Message)
	}

	evs := l.run.WaitFor(runTimeout, "the loud exec's final event", func(evs []events.Received) bool {
		for _, ev := range pt.Only[events.RunExecEvent](evs) {
			if ev.ExecID == got.id && ev.Exit != nil {
				return true
			}
		}
		return false
	})
	var recorded, stored int64
	var stops []events.BudgetKind
	var final *events.RunExecEvent
	for _, r := range evs {
		ev, ok := r.Event.(events.RunExecEvent)
		if !ok || ev.ExecID != got.id {
			continue
		}
		n, err := events.StoredBytes(env.Subjects, ev)
		if err != nil {
			t.Fatal(err)
		}
		stored += n
		switch {
		case ev.Exit != nil:
			final = &ev
		case ev.RecordingStopped != "":
			stops = append(stops, ev.RecordingStopped)
		default:
			recorded += int64(len(ev.Text))
		}
	}
	t.Logf("company A's loud exec: printed %d bytes in %s, recorded %d of them in the run stream (%d bytes stored with the events' envelopes) until the notice after %s; company budget %d bytes a day",
		got.received, got.took.Round(time.Millisecond), recorded, stored, got.stoppedAfter.Round(time.Millisecond), companyBudget())
	switch {
	case len(stops) != 1 || stops[0] != events.BudgetCompany:
		t.Errorf("company A's loud exec: recording stopped by %v, want once by the company budget", stops)
	case final.RecordingStopped != events.BudgetCompany || !final.Exit.Truncated || final.Exit.ExitCode == nil || *final.Exit.ExitCode != 0:
		t.Errorf("company A's loud exec's final event: %+v, want exit 0, truncated, recording stopped by the company budget", final)
	case recorded >= got.received:
		t.Errorf("company A's loud exec: %d of %d bytes recorded; want fewer than printed", recorded, got.received)
	}
}

// companyBudget is what one company may write a day per source (recorded output, container
// logs) at the isolation env's store settings, the workers' defaults (--store-bytes 8 GiB,
// --store-companies 4, --run-retention 14 days): the run stream's budgeted part over 4
// companies × 2 sources × 15 windows, 34,359,733 bytes.
func companyBudget() int64 {
	return events.Options{}.CompanyBudget(events.DefaultBudgetWindow)
}

// bucketKeys returns bucket's keys that have company as one of their tokens.
func bucketKeys(t *testing.T, bucket, company string) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	kv, err := env.JS.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatalf("bucket %s: %v", bucket, err)
	}
	keys, err := kv.Keys(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		t.Fatalf("listing %s's keys: %v", bucket, err)
	}
	var out []string
	for _, k := range keys {
		if slices.Contains(strings.Split(k, "."), company) {
			out = append(out, k)
		}
	}
	return out
}

// runCounters are the keys of KUBECLIP_BUDGETS that count a run's bytes (<source>.run.<company>.<run>),
// not a company's window.
func runCounters(keys []string) []string {
	var out []string
	for _, k := range keys {
		if parts := strings.Split(k, "."); len(parts) > 1 && parts[1] == "run" {
			out = append(out, k)
		}
	}
	return out
}

// counterValue reads a KUBECLIP_BUDGETS counter: its bytes (0 when there is none).
func counterValue(t *testing.T, key string) int64 {
	t.Helper()
	kv, err := env.JS.KeyValue(t.Context(), events.BudgetBucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(t.Context(), key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0
	}
	if err != nil {
		t.Fatalf("reading %s: %v", key, err)
	}
	n, err := strconv.ParseInt(string(e.Value()), 10, 64)
	if err != nil {
		t.Fatalf("counter %s holds %q: %v", key, e.Value(), err)
	}
	return n
}

// companyCounter is the key of company's counter of source for the current window.
func companyCounter(source, company string) string {
	window := time.Now().UnixNano() / int64(events.DefaultBudgetWindow)
	return source + ".company." + company + "." + strconv.FormatInt(window, 10)
}

// reportBuckets logs, for KUBECLIP_EXECS and KUBECLIP_BUDGETS, which keys each company holds,
// when.
func reportBuckets(t *testing.T, when string, companies map[string]string) {
	t.Helper()
	t.Logf("%-8s %-18s %-8s %5s  %s", "when", "bucket", "company", "keys", "which")
	for _, bucket := range []string{execsvc.RecordedBucket, events.BudgetBucket} {
		for _, name := range slices.Sorted(maps.Keys(companies)) {
			keys := bucketKeys(t, bucket, companies[name])
			slices.Sort(keys)
			t.Logf("%-8s %-18s %-8s %5d  %s", when, bucket, name, len(keys), strings.Join(keys, " "))
		}
	}
}

// percentile is the p-th percentile (0 < p ≤ 1) of d, nearest rank.
func percentile(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(float64(len(s))*p+0.999999) - 1
	return s[max(0, min(i, len(s)-1))]
}

// probed is what probeRunStream measured: a quiet client's publish round trips to the run
// stream, to the two buckets a recorded exec writes (KUBECLIP_EXECS, KUBECLIP_BUDGETS), and to
// a stream of its own beside them.
type probed struct{ run, execs, budgets, own []time.Duration }

// probeRunStream publishes, every 5 ms until the returned func is called, one small message to
// each store a recorded exec writes (the run stream on a subject of company's that names no run
// of it, and a key of company's in each bucket) and one to a scratch stream of its own, each
// from a connection of the probe's own, and returns their round trips. Alike, they say the
// shared stores keep up beside another company's flood and a slower exec waits elsewhere; a
// shared store far slower would say it is the store.
func probeRunStream(t *testing.T, company string) func() probed {
	t.Helper()
	nc, err := nats.Connect(env.NATS.URL(), nats.Name("noisy-neighbour-probe"))
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const scratch = "NOISY_PROBE"
	if _, err := js.CreateOrUpdateStream(t.Context(), jetstream.StreamConfig{
		Name: scratch, Subjects: []string{"noisyprobe.>"}, Storage: jetstream.FileStorage, MaxMsgs: 10_000,
	}); err != nil {
		t.Fatal(err)
	}
	runSubj := env.Subjects.Prefix() + ".run." + company + "." + pt.NewID("run") + ".probe"
	execsKey := "$KV." + execsvc.RecordedBucket + "." + company + ".probe"
	budgetsKey := "$KV." + events.BudgetBucket + ".probe." + company
	var got probed
	done, finished := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			for _, p := range []struct {
				subj string
				into *[]time.Duration
			}{
				{runSubj, &got.run},
				{execsKey, &got.execs},
				{budgetsKey, &got.budgets},
				{"noisyprobe.x", &got.own},
			} {
				start := time.Now()
				if _, err := js.Publish(t.Context(), p.subj, []byte("probe")); err != nil {
					t.Errorf("probe publish to %s: %v", p.subj, err)
					return
				}
				*p.into = append(*p.into, time.Since(start))
			}
		}
	}()
	return func() probed {
		close(done)
		<-finished
		ctx := context.WithoutCancel(t.Context())
		if err := js.DeleteStream(ctx, scratch); err != nil {
			t.Errorf("deleting the probe's stream: %v", err)
		}
		for stream, key := range map[string]string{"KV_" + execsvc.RecordedBucket: execsKey, "KV_" + events.BudgetBucket: budgetsKey} {
			st, err := js.Stream(ctx, stream)
			if err == nil {
				err = st.Purge(ctx, jetstream.WithPurgeSubject(key))
			}
			if err != nil {
				t.Errorf("purging the probe's key %s: %v", key, err)
			}
		}
		nc.Close()
		if len(got.run) == 0 {
			t.Fatal("the probe published nothing")
		}
		return got
	}
}
