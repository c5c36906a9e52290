package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/kubeclip/kubeclip/internal/pipelinetest"
)

// TestBrokerPhase runs (p) small against the real credential-broker binary (KUBECLIP_BIN, as
// make test builds it, else a fresh build): every call and stream must come back whole on
// both routes and the upstream must see the real key only, with each figure filled in. No
// timing is asserted; the figures go to the log.
func TestBrokerPhase(t *testing.T) {
	bin, err := pipelinetest.Binaries()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(bin, brokerBinary)); err != nil {
		t.Fatalf("no %s among the binaries: %v", brokerBinary, err)
	}
	b := newLocalBench(settings{
		bin: bin, phases: "p", brokerCalls: 40, brokerWarmup: 4, brokerFirstBytes: 20,
		brokerStreamLevels: []int{10, 20}, brokerOpeners: 4,
	}, io.Discard)
	rep := newReport(b.session)
	if err := b.brokerPhase(t.Context(), rep); err != nil {
		t.Fatalf("(p) failed: %v", err)
	}
	f := rep.Broker
	if f == nil || len(rep.Rows) != 3 {
		t.Fatalf("(p) reported %d rows and figures %v, want 3 rows and figures", len(rep.Rows), f != nil)
	}
	var table bytes.Buffer
	if err := f.print(&table); err != nil {
		t.Fatal(err)
	}
	t.Logf("(p), small:\n%s", table.String())
	for _, r := range f.Routes {
		want := map[string]int{"(p) call": 40, "(p') first byte": 20}[r.What]
		if r.N != want || r.Errors != 0 || r.P50 == nil || r.Max == nil {
			t.Errorf("%s %s: n %d, errors %d, want %d samples and no error", r.What, r.Route, r.N, r.Errors, want)
		}
	}
	// Warm-up and measured calls of both routes, first bytes and streams, each reached the
	// upstream with the real key.
	if want := 2*(4+40) + 2*(4+20) + 20; f.UpstreamCalls != want || f.WrongKeys != 0 {
		t.Errorf("the upstream got %d calls, %d without the real key; want %d, none", f.UpstreamCalls, f.WrongKeys, want)
	}
	var streams []int
	for _, l := range f.Memory {
		streams = append(streams, l.Streams)
		if l.RSSMiB <= 0 || l.HeapMiB <= 0 || l.Goroutines <= 0 {
			t.Errorf("memory at %q: RSS %.1f MiB, heap %.1f MiB, %d goroutines; want all read", l.At, l.RSSMiB, l.HeapMiB, l.Goroutines)
		}
	}
	if len(streams) != 4 || streams[1] != 10 || streams[2] != 20 {
		t.Errorf("memory read at %v streams, want before, 10, 20, after", streams)
	}
}

// TestBrokerRigRefusesAnotherPlaceholder: a call through the broker with a placeholder it did
// not mint is refused, and the phase's call counts that as a failure (so (p) can fail).
func TestBrokerRigRefusesAnotherPlaceholder(t *testing.T) {
	bin, err := pipelinetest.Binaries()
	if err != nil {
		t.Fatal(err)
	}
	rig, err := startBrokerRig(t.Context(), filepath.Join(bin, brokerBinary))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := rig.close(); err != nil {
			t.Error(err)
		}
	}()
	c := rig.client(true, 1)
	defer c.CloseIdleConnections()
	if _, err := rig.call(t.Context(), c, true); err != nil {
		t.Fatalf("a call with the minted placeholder: %v", err)
	}
	p := []byte(rig.placeholder)
	i := len(p) - 5
	if p[i] == 'A' {
		p[i] = 'B'
	} else {
		p[i] = 'A'
	}
	rig.placeholder = string(p)
	if _, err := rig.call(t.Context(), c, true); err == nil {
		t.Fatal("a call with a placeholder the broker did not mint succeeded")
	}
	if calls, wrong := rig.upstream.counts(); calls != 1 || wrong != 0 {
		t.Errorf("the upstream got %d calls (%d without the real key), want the first only", calls, wrong)
	}
}
