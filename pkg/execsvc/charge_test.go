package execsvc_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execclient"
)

// TestDribbledOutputIsChargedWhatItStores: a recorded command that prints one byte every
// millisecond, 2,000 in all, is coalesced into an event per 100 ms whose envelope (subject,
// headers, ids, JSON: about 900 bytes, more with long ids) dwarfs its text. What its run's
// budget counter is charged must be at least what its events add to the run stream, so a
// dribbling agent pays per event, not per byte printed. The company id is as long as an id may
// be (events.MaxTokenLen), the envelope at its largest. The exit event is never charged (one
// per exec, so the result is never lost to a budget) and is left out.
func TestDribbledOutputIsChargedWhatItStores(t *testing.T) {
	const n = 2000
	e := newEnv(t, 1)
	l := e.newLease(strings.Repeat("c", events.MaxTokenLen))
	ctx := t.Context()
	stream, err := e.js.Stream(ctx, e.subjects.RunStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := info.State.Bytes
	res := e.run(l, execclient.Exec{Command: "sh", Args: []string{"-c", `i=0; while [ $i -lt ` + strconv.Itoa(n) + ` ]; do printf x; sleep 0.001; i=$((i+1)); done`}, Record: true})
	evs := execEvents(t, e.js, e.subjects, l)
	if info, err = stream.Info(ctx); err != nil {
		t.Fatal(err)
	}
	grown := int64(info.State.Bytes - before)

	// The exit event, last on the run's exec subject, as the file store counts a message: its
	// subject, headers and data and a 30-byte record (nats-server's fileStoreMsgSize).
	subject, err := e.subjects.Run(l.CompanyID, l.RunID, events.KindExec)
	if err != nil {
		t.Fatal(err)
	}
	exit, err := stream.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatal(err)
	}
	hdr := 0
	if len(exit.Header) > 0 {
		// NATS/1.0\r\n, each "Key: value\r\n", a closing \r\n.
		hdr = len("NATS/1.0\r\n") + 2
		for k, vs := range exit.Header {
			for _, v := range vs {
				hdr += len(k) + 2 + len(v) + 2
			}
		}
	}
	exitBytes := int64(30 + len(exit.Subject) + hdr + len(exit.Data))

	counters, err := e.js.KeyValue(ctx, events.BudgetBucket)
	if err != nil {
		t.Fatal(err)
	}
	entry, err := counters.Get(ctx, "exec.run."+l.ref.Key())
	if err != nil {
		t.Fatal(err)
	}
	charged, err := strconv.ParseInt(string(entry.Value()), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	var text int
	for _, ev := range evs {
		text += len(ev.Text)
	}
	t.Logf("%d bytes printed one a millisecond (%d recorded) in %d events grew the run stream by %d bytes (×%.1f; the exit event %d); the run was charged %d",
		n, text, len(evs), grown, float64(grown)/n, exitBytes, charged)
	if len(res.Stdout) != n || text != n {
		t.Errorf("the client got %d bytes and the stream holds %d, want %d", len(res.Stdout), text, n)
	}
	if stored := grown - exitBytes; charged < stored {
		t.Errorf("the run was charged %d bytes for events that grew the run stream by %d: a dribbling agent pays less than it stores", charged, stored)
	}
}
