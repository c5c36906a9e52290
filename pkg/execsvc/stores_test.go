package execsvc_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
)

// agentCommand prints n numbered lines and a stream-json result, as an agent does.
func agentCommand(n int) execclient.Exec {
	return execclient.Exec{Command: "sh", Args: []string{"-c", fmt.Sprintf(
		`i=1; while [ $i -le %d ]; do echo "line $i"; i=$((i+1)); done; echo '{"type":"result","subtype":"success","is_error":false,"result":"done","session_id":"s-1"}'`, n)}, Record: true}
}

// bucketKeys lists bucket's keys.
func bucketKeys(t *testing.T, js jetstream.JetStream, bucket string) []string {
	t.Helper()
	kv, err := js.KeyValue(t.Context(), bucket)
	if err != nil {
		t.Fatal(err)
	}
	lister, err := kv.ListKeys(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	return keys
}

// TestEndedExecsLeaveNoEntries: recorded execs that run and end leave no entry in
// KUBECLIP_EXECS; before, every one stayed for the bucket's 7-day TTL and 294,337 of them filled
// it. Their output is recorded whole.
func TestEndedExecsLeaveNoEntries(t *testing.T) {
	e := newEnv(t, 1)
	const runs = 8
	for range runs {
		l := e.newLease(newID("co"))
		res := e.run(l, agentCommand(20))
		if got := recorded(t, e, l); got.text != len(res.Stdout) || got.stopped != "" {
			t.Errorf("recorded %d bytes of %d (stopped %q)", got.text, len(res.Stdout), got.stopped)
		}
	}
	if keys := bucketKeys(t, e.js, execsvc.RecordedBucket); len(keys) != 0 {
		t.Errorf("after %d recorded execs ended %s holds %d entries: %q", runs, execsvc.RecordedBucket, len(keys), keys)
	}
}

// fill publishes entries of company A into bucket (its KV subjects under prefix, values of
// valueSize bytes, then of one byte to take what room is left) until the bucket, at its
// configured size, refuses them (10077).
func fill(t *testing.T, js jetstream.JetStream, bucket, prefix string, valueSize int) int {
	t.Helper()
	n := 0
	for _, size := range []int{valueSize, 1} {
		value := []byte(strings.Repeat("7", size))
		for full := false; !full; {
			var futures []jetstream.PubAckFuture
			for range 2000 {
				f, err := js.PublishAsync(fmt.Sprintf("$KV.%s.%s.%d", bucket, prefix, n), value)
				if err != nil {
					t.Fatal(err)
				}
				futures = append(futures, f)
				n++
			}
			for _, f := range futures {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					var apiErr *jetstream.APIError
					if !errors.As(err, &apiErr) || apiErr.ErrorCode != 10077 {
						t.Fatalf("filling %s: %v", bucket, err)
					}
					full = true
				case <-time.After(time.Minute):
					t.Fatalf("filling %s: no ack", bucket)
				}
			}
		}
	}
	return n
}

// storeCounts counts the failed store writes a replica's observer is told, by bucket.
type storeCounts struct {
	countingObserver
	mu     sync.Mutex
	failed map[string]int
}

func (o *storeCounts) StoreWriteFailed(bucket string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.failed[bucket]++
}

func (o *storeCounts) count(bucket string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.failed[bucket]
}

// TestFullStoresRefuseNoStart: company A fills KUBECLIP_EXECS, or KUBECLIP_BUDGETS, at their
// configured sizes (DiscardNew); company B's recorded agent command still starts, its whole
// output and final event are recorded, and the replica counts the writes it let through.
// Before, B's start was refused (`10077 maximum bytes exceeded`, answered unavailable) when
// KUBECLIP_EXECS was full, and B's recording retried its charge for the session's life when
// KUBECLIP_BUDGETS was.
func TestFullStoresRefuseNoStart(t *testing.T) {
	for _, tc := range []struct {
		bucket, prefix string
		valueSize      int
	}{
		{execsvc.RecordedBucket, "company-a.run-a", 900},
		{events.BudgetBucket, "exec.run.company-a", 32},
	} {
		t.Run(tc.bucket, func(t *testing.T) {
			obs := &storeCounts{failed: map[string]int{}}
			e := newEnvTuned(t, 0, func(o *execsvc.Options) { obs.r = &replica{}; o.Observer = obs })
			e.startReplica()
			n := fill(t, e.js, tc.bucket, tc.prefix, tc.valueSize)
			t.Logf("%d entries of company A filled %s", n, tc.bucket)

			l := e.newLease(newID("company-b"))
			res, err := e.try(l, agentCommand(200))
			if err != nil {
				t.Fatalf("company B's recorded exec: %v", err)
			}
			got := recorded(t, e, l)
			if got.text != len(res.Stdout) || got.stopped != "" || !strings.Contains(string(res.Stdout), "line 200") {
				t.Errorf("company B's exec recorded %d bytes of %d (stopped by %q)", got.text, len(res.Stdout), got.stopped)
			}
			last := execEvents(t, e.js, e.subjects, l)
			if fin := last[len(last)-1]; fin.Exit == nil || fin.Agent == nil || fin.Agent.Summary != "done" {
				t.Errorf("company B's final event: %+v, want the exit with the agent's result", fin)
			}
			if obs.count(tc.bucket) == 0 {
				t.Errorf("no failed write to %s counted", tc.bucket)
			}
		})
	}
}

// TestRecordingStoppedNotice: the client of a recording a budget stopped is told why, once:
// which company's budget, of how many bytes (the Paperclip plugin writes it into the run's log).
func TestRecordingStoppedNotice(t *testing.T) {
	const kib = 1 << 10
	e := newEnv(t, 0)
	e.record = execsvc.RecordLimits{CompanyBytes: 16 * kib}
	e.startReplica()
	company := newID("co")
	l := e.newLease(company)
	var mu sync.Mutex
	var notices []execproto.Notice
	x := execclient.Exec{Command: "sh", Args: []string{"-c", `i=0; while [ $i -lt 64 ]; do head -c 1024 /dev/zero | tr '\0' x; i=$((i+1)); done`}, Record: true}
	x.OnNotice = func(n execproto.Notice) { mu.Lock(); notices = append(notices, n); mu.Unlock() }
	res := e.run(l, x)
	if len(res.Stdout) != 64*kib {
		t.Errorf("the client received %d bytes, want all %d", len(res.Stdout), 64*kib)
	}
	mu.Lock()
	defer mu.Unlock()
	want := fmt.Sprintf("output recording stopped because company %s's recorded-output budget per company of %d bytes per day was reached", company, 16*kib)
	if len(notices) != 1 || notices[0].Reason != execproto.NoticeRecordingStopped || !strings.HasPrefix(notices[0].Message, want) || notices[0].ExecID != res.ExecID {
		t.Errorf("notices %+v, want one recordingStopped saying %q", notices, want)
	}
}
