package k8s

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The log decoder reads what a tenant's pod wrote, behind the kubelet's timestamps. The seed
// corpora under testdata/fuzz run with every `go test`; `make fuzz` explores.

// FuzzLogDecoder decodes any bytes as one log stream.
func FuzzLogDecoder(f *testing.F) {
	f.Add([]byte(kl(at(1, 100), "a")+"no timestamp\n"+kl(at(1, 200), strings.Repeat("x", 40))), uint16(15), uint8(0), true)
	f.Fuzz(func(t *testing.T, data []byte, maxLineStep uint16, readStep uint8, final bool) {
		maxLine := int(maxLineStep) + 1
		got, cur := decodeStream(t, Cursor{}, maxLine, 0, stream{data: string(data), final: final})
		// No line is longer than maxLine, and the pieces put back together are the lines
		// without their timestamps. A follow stream's unterminated last line waits for the
		// next stream.
		var text strings.Builder
		for _, l := range got {
			if len(l.Text) > maxLine {
				t.Fatalf("line of %d bytes, more than %d", len(l.Text), maxLine)
			}
			text.WriteString(l.Text)
		}
		lines := bytes.Split(data, []byte("\n"))
		if last := lines[len(lines)-1]; !final || len(last) == 0 {
			lines = lines[:len(lines)-1]
		}
		var want strings.Builder
		stamped := true
		for _, l := range lines {
			_, rest, ts, ok := splitTimestamp(l)
			want.Write(rest)
			stamped = stamped && ok && !ts.IsZero()
		}
		if want.String() != text.String() {
			t.Fatalf("delivered %q, want %q", text.String(), want.String())
		}
		// The read buffer's size changes nothing, but that a smaller one can let the first pieces
		// of a follow stream's unterminated last line go out.
		small, _ := decodeStream(t, Cursor{}, maxLine, 16+int(readStep), stream{data: string(data), final: final})
		if !final && len(small) > len(got) {
			small = small[:len(got)]
		}
		if !sameLines(got, small) {
			t.Fatalf("read with a %d-byte buffer (-64 KiB +small):\n%s", 16+int(readStep), cmp.Diff(got, small))
		}
		// Resuming from the cursor reached, the same stream delivers nothing again. (A line
		// without a timestamp takes the one before it, which a resumed stream does not know;
		// the kubelet stamps every line.)
		if stamped && !cur.Time.IsZero() {
			if again, _ := decodeStream(t, cur, maxLine, 0, stream{data: string(data), final: final}); len(again) > 0 {
				t.Fatalf("delivered %+v again", again)
			}
		}
	})
}

// FuzzLogDecoderResume cuts a kubelet log anywhere and resumes from the cursor, as FollowLogs
// does when a stream breaks and the run-watcher does after a restart: every line arrives once,
// also when the cut falls inside a line of which some pieces went out. texts are the lines;
// steps move each line's timestamp against the latest so far, by 20 ms a unit, at most
// ReorderWindow back (the kubelet's promise for stdout and stderr).
func FuzzLogDecoderResume(f *testing.F) {
	f.Add([]byte("a\nb\na\nb"), []byte{0, 0, 0, 0}, uint32(9), uint8(255), uint8(0))
	f.Fuzz(func(t *testing.T, texts, steps []byte, cut uint32, maxLineStep, readStep uint8) {
		maxLine := int(maxLineStep) + 1
		var lines []string
		latest := t0
		for i, text := range bytes.Split(texts, []byte("\n")) {
			var step time.Duration
			if i < len(steps) {
				step = time.Duration(int8(steps[i])) * 20 * time.Millisecond
			}
			ts := latest.Add(max(step, -ReorderWindow))
			if ts.After(latest) {
				latest = ts
			}
			lines = append(lines, kl(ts, string(text)))
		}
		whole := strings.Join(lines, "")
		want, _ := decodeStream(t, Cursor{}, maxLine, 0, stream{data: whole, final: true})

		at := int(cut % uint32(len(whole)+1))
		got, cur := decodeStream(t, Cursor{}, maxLine, 16+int(readStep), stream{data: whole[:at], err: errCut})
		resumed := whole // the kubelet's answer to a request without SinceTime
		if !cur.Time.IsZero() {
			resumed = replay(cur, lines...)
		}
		rest, _ := decodeStream(t, cur, maxLine, 0, stream{data: resumed, final: true})
		if got = append(got, rest...); !sameLines(want, got) {
			t.Fatalf("cut at %d (-whole +cut and resumed):\n%s", at, cmp.Diff(want, got))
		}
	})
}

// decodeStream decodes s with a decoder resuming at from (and a read buffer of readSize bytes
// unless 0), and returns the lines it delivered and the cursor after them.
func decodeStream(t *testing.T, from Cursor, maxLine, readSize int, s stream) ([]Line, Cursor) {
	t.Helper()
	dec := newLogDecoder(from, maxLine)
	if readSize > 0 {
		dec.readSize = readSize
	}
	var got []Line
	err := dec.decode(s.reader(), s.final, func(l Line) error {
		got = append(got, l)
		return nil
	})
	if !errors.Is(err, s.err) {
		t.Fatalf("decode error = %v, want %v", err, s.err)
	}
	return got, dec.cur
}

// sameLines is cmp.Equal for lines, fast enough to call on every fuzz input.
func sameLines(a, b []Line) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].Time.Equal(b[i].Time) || a[i].TimeRaw != b[i].TimeRaw || a[i].Text != b[i].Text {
			return false
		}
	}
	return true
}
