package meter

import (
	"bytes"
	"fmt"
)

// Server-sent events are framed as the WHATWG HTML standard's event stream interpretation
// says (html.spec.whatwg.org/multipage/server-sent-events.html): lines end in CRLF, LF or CR; one
// leading byte order mark is dropped; a line starting with ':' is a comment; "name:value" loses
// one space after the colon and a line without a colon is a field with an empty value; `data`
// values are joined with LF; a blank line dispatches the event unless it had no data line; an
// event the stream ends inside is never dispatched. Only `data` matters to the meter: each
// event's data is one JSON document, whose own "type" names it, so `event`, `id` and `retry`
// are skipped like unknown fields. Data is fed to the scanner as it arrives, never gathered, so
// an event of any size costs the same few KiB.

type sseState uint8

const (
	lineStart sseState = iota
	fieldName          // reading a line's field name, up to ':' or the line's end
	dataSpace          // right after "data:", where one space is dropped
	dataValue          // inside a data value
	skipLine           // inside a comment or a field the meter does not read
)

var bom = [3]byte{0xEF, 0xBB, 0xBF}

// doneData is the data of the event that ends a chat completions stream.
const doneData = "[DONE]"

type sseReader struct {
	st sseState
	// cr: the last byte was a CR, so an LF right after it ends the same line.
	cr bool
	// bomN counts the leading BOM's bytes consumed; past is set once the stream's start is.
	bomN uint8
	past bool

	name    [4]byte // enough to tell "data" from every other name
	nameLen int

	lines   int   // data lines in the current event
	dataLen int64 // bytes of the current event's data, including the LFs joining its lines
	head    [len(doneData)]byte
}

func (r *sseReader) isData() bool { return r.nameLen == 4 && string(r.name[:]) == "data" }

func (m *Meter) writeSSE(p []byte) {
	r := &m.sse
	i := 0
	for !r.past && i < len(p) {
		if p[i] != bom[r.bomN] {
			r.past = true
			if r.bomN > 0 {
				// A partial BOM begins the first line's field name, which no field has.
				r.st = skipLine
			}
			break
		}
		i++
		if r.bomN++; int(r.bomN) == len(bom) {
			r.past = true
		}
	}
	for i < len(p) && m.fault == "" {
		c := p[i]
		if r.cr {
			r.cr = false
			if c == '\n' {
				i++
				continue
			}
		}
		switch r.st {
		case lineStart:
			switch c {
			case '\n', '\r':
				m.dispatch()
				r.cr = c == '\r'
			case ':':
				r.st = skipLine
			default:
				r.st, r.nameLen = fieldName, 0
				continue
			}
		case fieldName:
			switch c {
			case ':':
				if r.isData() {
					r.st = dataSpace
				} else {
					r.st = skipLine
				}
			case '\n', '\r':
				if r.isData() {
					m.beginDataLine() // "data" alone is a data line with an empty value
				}
				r.st, r.cr = lineStart, c == '\r'
			default:
				if r.nameLen < len(r.name) {
					r.name[r.nameLen] = c
				}
				r.nameLen++
			}
		case dataSpace:
			m.beginDataLine()
			r.st = dataValue
			if c != ' ' {
				continue
			}
		case dataValue, skipLine:
			rest := p[i:]
			n := bytes.IndexByte(rest, '\n')
			if n < 0 {
				n = len(rest)
			}
			if k := bytes.IndexByte(rest[:n], '\r'); k >= 0 {
				n = k
			}
			if r.st == dataValue {
				m.feedData(rest[:n])
			}
			if i += n; i == len(p) {
				continue
			}
			r.st, r.cr = lineStart, p[i] == '\r'
		}
		i++
	}
}

var lineFeed = []byte{'\n'}

func (m *Meter) beginDataLine() {
	if m.sse.lines > 0 {
		m.feedData(lineFeed)
	}
	m.sse.lines++
}

func (m *Meter) feedData(b []byte) {
	r := &m.sse
	if r.dataLen < int64(len(r.head)) {
		copy(r.head[r.dataLen:], b)
	}
	r.dataLen += int64(len(b))
	if !m.doc.failed() {
		m.doc.feed(b)
	}
}

// dispatch ends the current event (a blank line was read).
func (m *Meter) dispatch() {
	r := &m.sse
	if r.lines == 0 {
		return // no data line: no event
	}
	m.events++
	switch {
	case r.dataLen == int64(len(doneData)) && string(r.head[:]) == doneData:
		if m.format == OpenAIChatCompletions {
			m.complete = true
		}
	case !m.doc.started:
		// Empty (or blank) data: no document, nothing stated.
	case m.doc.failed():
		m.stop(ReasonMalformed, m.doc.describeError(fmt.Sprintf("the data of event %d", m.events)))
	case !m.doc.complete():
		m.stop(ReasonMalformed, fmt.Sprintf("the data of event %d is not valid JSON: it ends inside its value", m.events))
	default:
		m.endDocument()
	}
	r.lines, r.dataLen = 0, 0
	m.doc.reset(m.schema)
}
