package execsvc_test

import (
	"strings"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execclient"
)

// TestRecordedByteAtATimeIsCoalesced: a recorded command that prints 2,000 bytes one write at
// a time grows the run stream by at most twice its output plus a few events' fixed cost, not
// one event per byte; its output is in the stream whole and in order.
func TestRecordedByteAtATimeIsCoalesced(t *testing.T) {
	const n = 2000
	e := newEnv(t, 1)
	l := e.newLease(newID("co"))
	stream, err := e.js.Stream(t.Context(), e.subjects.RunStream())
	if err != nil {
		t.Fatal(err)
	}
	bytesNow := func() uint64 {
		info, err := stream.Info(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Bytes
	}
	before := bytesNow()
	res := e.run(l, execclient.Exec{Command: "sh", Args: []string{"-c", `i=0; while [ $i -lt ` + "2000" + ` ]; do printf x; i=$((i+1)); done`}, Record: true})
	evs := execEvents(t, e.js, e.subjects, l)
	grown := bytesNow() - before

	var out strings.Builder
	for _, ev := range evs {
		out.WriteString(ev.Text)
	}
	if out.String() != strings.Repeat("x", n) || string(res.Stdout) != out.String() {
		t.Errorf("recorded %d bytes, the client got %d, want %d", out.Len(), len(res.Stdout), n)
	}
	// The fixed cost of an event (headers, ids, JSON) is under 1 KiB; the exit event is one.
	const perEvent = 1 << 10
	t.Logf("%d bytes of output in %d journal chunks grew the run stream by %d bytes in %d events: ×%.2f",
		n, res.LastSeq, grown, len(evs), float64(grown)/n)
	if limit := uint64(2*n + 4*perEvent); grown > limit {
		t.Errorf("the run stream grew by %d bytes (×%.0f) for %d bytes of output, want at most %d", grown, float64(grown)/n, n, limit)
	}
	if last := evs[len(evs)-1]; last.Exit == nil || last.Seq != res.LastSeq+1 {
		t.Errorf("last event = %+v, want the exit after seq %d", last, res.LastSeq)
	}
	for i := 1; i < len(evs); i++ {
		if evs[i].Seq <= evs[i-1].Seq {
			t.Errorf("event %d has seq %d after %d", i, evs[i].Seq, evs[i-1].Seq)
		}
	}
	_ = events.ExecStdout
}
