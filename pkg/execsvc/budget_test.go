package execsvc_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
)

// TestRecordingBudgets: a recorded exec over the exec, run or company budget stops recording
// with a `recordingStopped` event naming the budget and a truncated exit, while its client
// still receives all of its output; another company recording at the same time is unaffected.
func TestRecordingBudgets(t *testing.T) {
	const kib = 1 << 10
	// print writes n KiB in 1 KiB writes.
	print := func(n int) execclient.Exec {
		return execclient.Exec{Command: "sh", Args: []string{"-c", fmt.Sprintf(`i=0; while [ $i -lt %d ]; do head -c 1024 /dev/zero | tr '\0' x; i=$((i+1)); done`, n)}, Record: true}
	}
	for _, tc := range []struct {
		name   string
		limits execsvc.RecordLimits
		// before runs first in the same company (another run) and must be recorded whole.
		before int
		over   int
		want   events.BudgetKind
	}{
		{name: "exec", limits: execsvc.RecordLimits{ExecBytes: 32 * kib}, over: 64, want: events.BudgetExec},
		{name: "run", limits: execsvc.RecordLimits{RunBytes: 32 * kib}, over: 64, want: events.BudgetRun},
		{name: "company", limits: execsvc.RecordLimits{CompanyBytes: 48 * kib}, before: 32, over: 32, want: events.BudgetCompany},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 0)
			e.record = tc.limits
			r := e.startReplica()
			company := newID("co")
			if tc.before > 0 {
				l := e.newLease(company)
				e.run(l, print(tc.before))
				if got := recorded(t, e, l); got.text != tc.before*kib || got.stopped != "" {
					t.Fatalf("the company's first run recorded %d bytes (stopped: %q), want %d", got.text, got.stopped, tc.before*kib)
				}
			}
			over, other := e.newLease(company), e.newLease(newID("co"))
			var wg sync.WaitGroup
			var overRes, otherRes execclient.Result
			wg.Go(func() { overRes = e.run(over, print(tc.over)) })
			wg.Go(func() { otherRes = e.run(other, print(16)) })
			wg.Wait()

			if len(overRes.Stdout) != tc.over*kib || len(otherRes.Stdout) != 16*kib {
				t.Errorf("the clients received %d and %d bytes, want all %d and %d", len(overRes.Stdout), len(otherRes.Stdout), tc.over*kib, 16*kib)
			}
			got := recorded(t, e, over)
			if got.stopped != tc.want || !got.exitStopped || !got.truncated || got.text >= tc.over*kib {
				t.Errorf("over budget: recorded %d bytes, stopped by %q (on the exit: %v, truncated %v), want stopped by %q", got.text, got.stopped, got.exitStopped, got.truncated, tc.want)
			}
			if got.stopEvents != 1 {
				t.Errorf("%d events say recording stopped, want 1", got.stopEvents)
			}
			if o := recorded(t, e, other); o.text != 16*kib || o.stopped != "" || o.truncated {
				t.Errorf("the other company recorded %d bytes (stopped by %q, truncated %v), want all %d", o.text, o.stopped, o.truncated, 16*kib)
			}
			if r.budgets.Load() == 0 {
				t.Error("the observer was not told of the budget refusal")
			}
		})
	}
}

type recordedRun struct {
	text        int
	stopped     events.BudgetKind
	stopEvents  int
	exitStopped bool
	truncated   bool
}

// recorded sums up the run's exec events.
func recorded(t *testing.T, e *env, l *testLease) recordedRun {
	t.Helper()
	var got recordedRun
	var text strings.Builder
	for _, ev := range execEvents(t, e.js, e.subjects, l) {
		text.WriteString(ev.Text)
		switch {
		case ev.Exit != nil:
			got.exitStopped, got.truncated = ev.RecordingStopped != "", ev.Exit.Truncated
		case ev.RecordingStopped != "":
			got.stopped = ev.RecordingStopped
			got.stopEvents++
		}
	}
	got.text = text.Len()
	return got
}

// TestInterleavedOutputPaysWhatItStores: stdout and stderr one byte each in turn defeat
// coalescing (an event holds one stream), but every event is charged its fixed cost, so the run
// stream grows by about the exec budget, not by ~700 bytes per byte printed.
func TestInterleavedOutputPaysWhatItStores(t *testing.T) {
	const budget = 32 << 10
	e := newEnv(t, 0)
	e.record = execsvc.RecordLimits{ExecBytes: budget}
	e.startReplica()
	l := e.newLease(newID("co"))
	stream, err := e.js.Stream(t.Context(), e.subjects.RunStream())
	if err != nil {
		t.Fatal(err)
	}
	size := func() uint64 {
		info, err := stream.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Bytes
	}
	before := size()
	res := e.run(l, execclient.Exec{Command: "sh", Args: []string{"-c", `i=0; while [ $i -lt 300 ]; do printf o; sleep 0.002; printf e >&2; sleep 0.002; i=$((i+1)); done`}, Record: true})
	got := recorded(t, e, l)
	grown := size() - before
	t.Logf("600 interleaved bytes in %d journal chunks grew the run stream by %d bytes; recording stopped by %q", res.LastSeq, grown, got.stopped)
	if len(res.Stdout) != 300 || len(res.Stderr) != 300 {
		t.Errorf("the client received %d/%d bytes, want 300/300", len(res.Stdout), len(res.Stderr))
	}
	if res.LastSeq < 200 || got.stopped != events.BudgetExec {
		t.Errorf("%d journal chunks, recording stopped by %q: want the streams' turns in chunks of their own and the exec budget to stop recording", res.LastSeq, got.stopped)
	}
	// The budget, plus the stop and the exit events.
	if limit := uint64(budget + 4<<10); grown > limit {
		t.Errorf("the run stream grew by %d bytes, want at most %d (the %d-byte exec budget and its slack)", grown, limit, budget)
	}
}
