package runwatch

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// FuzzLogBatcher: whatever the agent prints, every event fits its bound, seq counts from 1,
// and the pieces put back together are the lines, in valid UTF-8.
func FuzzLogBatcher(f *testing.F) {
	f.Add([]byte("{\"type\":\"system\",\"subtype\":\"init\"}\nplain <text> & more\n"), "2026-08-24T10:30:09.502118734Z", uint8(0), uint8(0))
	f.Fuzz(func(t *testing.T, text []byte, ts string, maxBytesStep, maxLines uint8) {
		maxBytes := min(events.MaxLogEventBytes, 1<<10+int(maxBytesStep)<<8)
		b, err := NewLogBatcher(LogBatcherOptions{
			RunID: "0e8b6f4a-5a7c-4c1e-9f0b-2a9d7c3e1b44", CompanyID: "7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13",
			Pod: "pc-01k3b7r2m9x4c8v5n6t1q0w2ey-7xk2p", Container: "agent",
			MaxBytes: maxBytes, MaxLines: int(maxLines), Now: clock,
		})
		if err != nil {
			t.Fatal(err)
		}
		lineLimit := int(maxLines)
		if lineLimit == 0 {
			lineLimit = DefaultLogMaxLines
		}
		var evs []events.RunLogEvent
		var lines []string
		for _, l := range bytes.Split(text, []byte("\n")) {
			evs = append(evs, b.Add(events.LogLine{TS: ts, Text: string(l)})...)
			lines = append(lines, string(l))
		}
		if ev, ok := b.Flush(); ok {
			evs = append(evs, ev)
		}
		// Every event fits, seq counts from 1, and putting the pieces back together gives the
		// lines, in valid UTF-8, each with (a prefix of at most 64 bytes of) its timestamp.
		validTS := strings.ToValidUTF8(ts, "\uFFFD")
		var got []string
		var line *events.LogLine
		for i, ev := range evs {
			if size := len(encodeJSON(t, ev)); size > maxBytes {
				t.Fatalf("event %d is %d bytes, more than %d", ev.Seq, size, maxBytes)
			}
			if ev.Seq != uint64(i+1) || len(ev.Lines) == 0 || len(ev.Lines) > lineLimit {
				t.Fatalf("event %d has seq %d and %d lines (at most %d)", i, ev.Seq, len(ev.Lines), lineLimit)
			}
			for _, piece := range ev.Lines {
				if len(piece.TS) > 64 || !strings.HasPrefix(validTS, piece.TS) || (len(validTS) <= 64 && piece.TS != validTS) {
					t.Fatalf("piece timestamp %q of %q", piece.TS, ts)
				}
				if line == nil {
					line = &events.LogLine{TS: piece.TS}
				} else if piece.TS != line.TS {
					t.Fatalf("pieces of one line with timestamps %q and %q", line.TS, piece.TS)
				}
				line.Text += piece.Text
				if !piece.Partial {
					got = append(got, line.Text)
					line = nil
				}
			}
		}
		if line != nil {
			t.Fatalf("the last piece is partial")
		}
		for i, l := range lines {
			lines[i] = strings.ToValidUTF8(l, "\uFFFD")
		}
		if diff := cmp.Diff(lines, got); diff != "" {
			t.Fatalf("lines (-added +published):\n%s", diff)
		}
	})
}

// encodeJSON is an event's body as the publisher writes it.
func encodeJSON(t *testing.T, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		t.Fatalf("encoding %T: %v", v, err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}
