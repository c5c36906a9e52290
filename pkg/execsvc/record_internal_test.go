package execsvc

import (
	"bytes"
	"runtime"
	"testing"
)

// TestRecorderSkipsLongLines: an 8 MiB stream-json line is not parsed (it is over the line
// bound), costs the recorder little more than the bound, and leaves no large buffer behind.
func TestRecorderSkipsLongLines(t *testing.T) {
	line := append([]byte(`{"type":"assistant","message":{"content":[{"type":"text","text":"`), bytes.Repeat([]byte("A"), 8<<20)...)
	line = append(line, "\"}]}}\n"...)
	r := &lineParser{max: DefaultMaxRecordedLine}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for b := line; len(b) > 0; {
		n := min(len(b), 32<<10)
		r.feed(b[:n])
		b = b[n:]
	}
	runtime.ReadMemStats(&after)
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("an 8 MiB line allocated %d bytes in the recorder; %d bytes kept", alloc, cap(r.line))
	if alloc > 4*DefaultMaxRecordedLine {
		t.Errorf("an 8 MiB line allocated %d bytes, want at most %d (4× the line bound)", alloc, 4*DefaultMaxRecordedLine)
	}
	if cap(r.line) > lineKeep {
		t.Errorf("the recorder keeps a %d-byte line buffer after the line, want at most %d", cap(r.line), lineKeep)
	}
	// A short line after it is parsed again.
	r.feed([]byte(`{"type":"system","subtype":"init","session_id":"s1"}` + "\n"))
	if !r.sawJSON {
		t.Error("the line after a long one was not parsed")
	}
}
