package runwatch

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
)

const ts = "2026-08-24T10:29:59.123456789Z"

func newBatcher(t *testing.T, mod func(*LogBatcherOptions)) *LogBatcher {
	t.Helper()
	opts := LogBatcherOptions{RunID: "r1", CompanyID: "c1", Pod: "pc-01j9x-abcde", Container: "agent", Now: clock}
	if mod != nil {
		mod(&opts)
	}
	b, err := NewLogBatcher(opts)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// reassemble joins split pieces back into lines.
func reassemble(t *testing.T, evs []events.RunLogEvent) []string {
	t.Helper()
	var out []string
	var cur strings.Builder
	open := false
	for _, ev := range evs {
		for _, l := range ev.Lines {
			if l.TS != ts {
				t.Errorf("line lost its timestamp: %q", l.TS)
			}
			cur.WriteString(l.Text)
			open = l.Partial
			if !open {
				out = append(out, cur.String())
				cur.Reset()
			}
		}
	}
	if open {
		t.Errorf("the last piece is marked partial")
	}
	return out
}

func TestLogBatcherBoundsEveryEvent(t *testing.T) {
	tests := []struct {
		name  string
		lines []string
		want  []string // after UTF-8 repair; nil means lines
	}{
		{name: "one huge ASCII line", lines: []string{strings.Repeat("abcdefghij", 20_000)}},
		{name: "huge line of two-byte runes", lines: []string{strings.Repeat("é", 70_000)}},
		{name: "huge line of four-byte runes", lines: []string{strings.Repeat("🚀", 40_000)}},
		{name: "huge line of escaped characters", lines: []string{strings.Repeat("\"\\\x01\u2028<>&", 20_000)}},
		{name: "control characters only", lines: []string{strings.Repeat("\x00\x1f", 40_000)}},
		{name: "invalid UTF-8 is repaired", lines: []string{"ok \xff\xfe done", strings.Repeat("\xff", 70_000)}, want: []string{"ok \uFFFD done", "\uFFFD"}},
		{name: "many small lines", lines: repeatLines("2026-08-24 INFO reconciled tenant paperclip-c1 in 12ms", 5000)},
		{name: "mixed", lines: append(append(repeatLines("short", 10), strings.Repeat("x", 100_000)), repeatLines("after", 10)...)},
		{name: "a line exactly at the bound is split only if it must be", lines: []string{strings.Repeat("y", 65_000), "z"}},
	}
	// Sizes are measured with the Publisher's own encoding (Msg builds the message only).
	p, err := events.NewPublisher(events.PublisherOptions{JS: noPublish{}, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := newBatcher(t, nil)
			var evs []events.RunLogEvent
			for _, l := range tc.lines {
				evs = append(evs, b.Add(events.LogLine{TS: ts, Text: l})...)
			}
			if ev, ok := b.Flush(); ok {
				evs = append(evs, ev)
			}
			for i, ev := range evs {
				if ev.Seq != uint64(i+1) {
					t.Errorf("event %d has seq %d: seq must count from 1 without gaps", i, ev.Seq)
				}
				msg, err := p.Msg(ev)
				if err != nil {
					t.Fatal(err)
				}
				if len(msg.Data) > events.MaxLogEventBytes {
					t.Errorf("event %d encodes to %d bytes, more than %d", i, len(msg.Data), events.MaxLogEventBytes)
				}
				// A piece that is not a line's last fills its event: splitting is not wasteful.
				if len(ev.Lines) == 1 && ev.Lines[0].Partial && len(msg.Data) < events.MaxLogEventBytes*9/10 {
					t.Errorf("event %d carries a partial piece of only %d bytes", i, len(msg.Data))
				}
			}
			want := tc.want
			if want == nil {
				want = tc.lines
			}
			if diff := cmp.Diff(want, reassemble(t, evs)); diff != "" {
				t.Errorf("reassembled lines differ (-want +got):\n%.2000s", diff)
			}
		})
	}
}

// TestLogBatcherSplitsRepaired checks the repaired-invalid case separately: 70k invalid bytes
// become 70k U+FFFD runes, not one.
func TestLogBatcherSplitsRepaired(t *testing.T) {
	b := newBatcher(t, nil)
	evs := b.Add(events.LogLine{TS: ts, Text: strings.Repeat("a\xff", 30_000)})
	if ev, ok := b.Flush(); ok {
		evs = append(evs, ev)
	}
	got := reassemble(t, evs)
	if len(got) != 1 || got[0] != strings.Repeat("a\uFFFD", 30_000) {
		t.Errorf("repaired line is wrong (%d lines)", len(got))
	}
}

func repeatLines(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func TestLogBatcherMaxLines(t *testing.T) {
	b := newBatcher(t, func(o *LogBatcherOptions) { o.MaxLines = 3 })
	var sizes []int
	for range 7 {
		for _, ev := range b.Add(events.LogLine{TS: ts, Text: "line"}) {
			sizes = append(sizes, len(ev.Lines))
		}
	}
	if diff := cmp.Diff([]int{3, 3}, sizes); diff != "" {
		t.Errorf("events completed by Add (-want +got):\n%s", diff)
	}
	if b.Pending() != 1 {
		t.Errorf("pending = %d, want 1", b.Pending())
	}
	ev, ok := b.Flush()
	if !ok || len(ev.Lines) != 1 || ev.Seq != 3 {
		t.Errorf("Flush = %+v, %v", ev, ok)
	}
	if _, ok := b.Flush(); ok {
		t.Errorf("a second Flush should have nothing")
	}
}

func TestLogBatcherSharedSequence(t *testing.T) {
	seq := newSequence(41) // continuing a restarted run
	a := newBatcher(t, func(o *LogBatcherOptions) { o.seq = seq; o.Container = "init" })
	b := newBatcher(t, func(o *LogBatcherOptions) { o.seq = seq })
	var got []uint64
	for _, bt := range []*LogBatcher{a, b, a} {
		bt.Add(events.LogLine{TS: ts, Text: "x"})
		ev, _ := bt.Flush()
		got = append(got, ev.Seq)
	}
	if diff := cmp.Diff([]uint64{42, 43, 44}, got); diff != "" {
		t.Errorf("seqs (-want +got):\n%s", diff)
	}
	if seq.lastIssued() != 44 {
		t.Errorf("Last = %d", seq.lastIssued())
	}
}

func TestNewLogBatcherValidates(t *testing.T) {
	for name, opts := range map[string]LogBatcherOptions{
		"bad run id":      {RunID: "r.1", CompanyID: "c1"},
		"bound too big":   {RunID: "r1", CompanyID: "c1", MaxBytes: 1 << 20},
		"bound too small": {RunID: "r1", CompanyID: "c1", MaxBytes: 100},
		"negative lines":  {RunID: "r1", CompanyID: "c1", MaxLines: -1},
	} {
		if _, err := NewLogBatcher(opts); err == nil {
			t.Errorf("%s: NewLogBatcher accepted %+v", name, opts)
		}
	}
}

// noPublish is a publisher that must not be reached: Msg never publishes.
type noPublish struct{}

func (noPublish) PublishMsg(context.Context, *nats.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	panic("Msg must not publish")
}
