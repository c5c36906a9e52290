package sandboxd

import (
	"bytes"
	"fmt"
)

// A command's output past its journal's cap is not simply dropped: the journal keeps the head
// (everything up to the cap less a tail reserve) and the last tailKeep bytes of each stream,
// and appends those after a marker when the command exits. An agent prints its result last (a
// Claude Code `result` line, Codex's final message): keeping only the first bytes loses exactly
// the line Paperclip parses, and the run fails however well it went.
const (
	// tailShare is the fraction of the cap each stream's tail may hold (1/16: 4 MiB of the
	// 64 MiB Paperclip asks for), within [tailMin, tailMax].
	tailShare = 16
	// tailMin: below it the cap is too small to split; the journal drops what is past it.
	tailMin = 4 << 10
	// tailMax bounds one stream's tail, and with the memory budget every tail together: a
	// result line is kilobytes, an agent's last turn rarely more than a few hundred.
	tailMax = 4 << 20
	// tailChunk is the payload of each frame the tail is journaled in: the size pump reads.
	tailChunk = 32 << 10
	// tailMarkerMax bounds the marker line's length.
	tailMarkerMax = 160
)

// tailKeep is how much of each stream's last output a journal with cap max keeps, 0 for none.
func tailKeep(max int64) int64 {
	t := min(max/tailShare, tailMax)
	if t < tailMin {
		return 0
	}
	return t
}

// tailReserve is the part of cap max held back from the head for both streams' tails: the
// bytes, their frame headers and the markers.
func tailReserve(max int64) int64 {
	t := tailKeep(max)
	if t == 0 {
		return 0
	}
	frames := (t+tailChunk-1)/tailChunk + 1 // the tail's chunks and the marker
	return 2 * (t + tailMarkerMax + frames*frameHeaderSize)
}

// tailMarker is the line the journal writes where a stream's output was skipped: the head may
// end mid-line, so it starts with a newline, and it is not JSON, so a stream-json reader
// (Paperclip's adapters, pkg/streamjson) passes over it.
func tailMarker(skipped, kept int64) []byte {
	return fmt.Appendf(nil, "\n[sandboxd: %d bytes of output skipped here (over the exec's maxOutputBytes); the last %d bytes follow]\n", skipped, kept)
}

// tailRing holds the last len(buf) bytes written to it.
type tailRing struct {
	buf  []byte
	next int   // where the next byte goes
	seen int64 // bytes written in all
}

func (r *tailRing) write(p []byte) {
	r.seen += int64(len(p))
	if len(p) >= len(r.buf) {
		copy(r.buf, p[len(p)-len(r.buf):])
		r.next = 0
		return
	}
	n := copy(r.buf[r.next:], p)
	copy(r.buf, p[n:])
	r.next = (r.next + len(p)) % len(r.buf)
}

// kept returns the bytes the ring holds, oldest first, and how many were written before them.
// A tail that lost its beginning starts at its first whole line when one begins in its first
// half, so a line reader does not see half a JSON object after the marker.
func (r *tailRing) kept() (data []byte, dropped int64) {
	size := int64(len(r.buf))
	if r.seen <= size {
		return r.buf[:r.seen], 0
	}
	data = append(append(make([]byte, 0, size), r.buf[r.next:]...), r.buf[:r.next]...)
	dropped = r.seen - size
	if i := bytes.IndexByte(data, '\n'); i >= 0 && int64(i) < size/2 {
		data, dropped = data[i+1:], dropped+int64(i+1)
	}
	return data, dropped
}
