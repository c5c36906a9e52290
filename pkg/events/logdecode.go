package events

import (
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

// decodeLogEvent is decode's fast path for the run stream's most frequent payload, a log event,
// which a replay reads by the hundred thousand: one pass over data, no reflection, and a string
// for each value instead of encoding/json's validity scan, decode and strictjson's key walk
// (about a quarter of their time).
//
// It takes only what kubeclip's own publisher writes: an object of RunLogEvent's keys, each
// spelled exactly and at most once, holding its own JSON type (no null), with lines of LogLine's
// keys likewise. Anything else (an unknown key, a key in another case or given twice, a number
// that is not a plain integer, a surrogate escape, invalid UTF-8, a syntax error, an oversized
// payload) reports ok = false, and decode reads data instead: the fast path never refuses a
// payload, never accepts one decode refuses and never reads a value otherwise than decode
// (FuzzDecodeLogEventAgreesWithDecode).
func decodeLogEvent(data []byte) (ev RunLogEvent, ok bool) {
	if len(data) > DefaultMaxMsgSize {
		return RunLogEvent{}, false
	}
	p := logParser{data: data}
	var seen uint8
	p.space()
	if !p.byte('{') {
		return RunLogEvent{}, false
	}
	for first := true; ; first = false {
		p.space()
		if p.byte('}') {
			break
		}
		if !first && (!p.byte(',') || !p.space()) {
			return RunLogEvent{}, false
		}
		key, ok := p.key()
		if !ok {
			return RunLogEvent{}, false
		}
		var bit uint8
		switch string(key) {
		case "runId":
			bit = 1 << 0
			ev.RunID, ok = p.str()
		case "companyId":
			bit = 1 << 1
			ev.CompanyID, ok = p.str()
		case "at":
			bit = 1 << 2
			ev.At, ok = p.time()
		case "seq":
			bit = 1 << 3
			ev.Seq, ok = p.uint()
		case "pod":
			bit = 1 << 4
			ev.Pod, ok = p.str()
		case "container":
			bit = 1 << 5
			ev.Container, ok = p.str()
		case "lines":
			bit = 1 << 6
			ev.Lines, ok = p.lines()
		case "logStopped":
			bit = 1 << 7
			var s string
			s, ok = p.str()
			ev.LogStopped = BudgetKind(s)
		default:
			return RunLogEvent{}, false
		}
		if !ok || seen&bit != 0 {
			return RunLogEvent{}, false
		}
		seen |= bit
	}
	p.space()
	return ev, p.i == len(p.data)
}

// lines reads a log event's array of lines; [] is an empty slice, as encoding/json makes it.
func (p *logParser) lines() ([]LogLine, bool) {
	if !p.byte('[') {
		return nil, false
	}
	lines := []LogLine{}
	p.space()
	if p.byte(']') {
		return lines, true
	}
	for {
		line, ok := p.line()
		if !ok {
			return nil, false
		}
		lines = append(lines, line)
		p.space()
		if p.byte(']') {
			return lines, true
		}
		if !p.byte(',') || !p.space() {
			return nil, false
		}
	}
}

// line reads one LogLine object.
func (p *logParser) line() (line LogLine, ok bool) {
	if !p.byte('{') {
		return LogLine{}, false
	}
	var seen uint8
	for first := true; ; first = false {
		p.space()
		if p.byte('}') {
			return line, true
		}
		if !first && (!p.byte(',') || !p.space()) {
			return LogLine{}, false
		}
		key, ok := p.key()
		if !ok {
			return LogLine{}, false
		}
		var bit uint8
		switch string(key) {
		case "ts":
			bit = 1 << 0
			line.TS, ok = p.str()
		case "text":
			bit = 1 << 1
			line.Text, ok = p.str()
		case "partial":
			bit = 1 << 2
			line.Partial, ok = p.bool()
		default:
			return LogLine{}, false
		}
		if !ok || seen&bit != 0 {
			return LogLine{}, false
		}
		seen |= bit
	}
}

// logParser reads the JSON of a log event; every method reports false on what it does not take.
type logParser struct {
	data []byte
	i    int
}

// space skips JSON whitespace; it always reports true, to chain after a delimiter.
func (p *logParser) space() bool {
	for p.i < len(p.data) {
		switch p.data[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return true
		}
	}
	return true
}

// byte consumes c if it comes next.
func (p *logParser) byte(c byte) bool {
	if p.i < len(p.data) && p.data[p.i] == c {
		p.i++
		return true
	}
	return false
}

// key reads an object key and the colon after it. The key is compared, not kept: no copy.
func (p *logParser) key() ([]byte, bool) {
	start := p.i + 1
	if !p.byte('"') {
		return nil, false
	}
	for p.i < len(p.data) {
		switch c := p.data[p.i]; {
		case c == '"':
			key := p.data[start:p.i]
			p.i++
			p.space()
			return key, p.byte(':') && p.space()
		case c == '\\' || c < 0x20 || c >= utf8.RuneSelf:
			return nil, false // no key of a log event needs an escape or a non-ASCII byte
		default:
			p.i++
		}
	}
	return nil, false
}

// str reads a string value as encoding/json unquotes it: the escapes JSON defines, \u escapes of
// non-surrogates included; invalid UTF-8 (which encoding/json replaces) is not taken.
func (p *logParser) str() (string, bool) {
	if !p.byte('"') {
		return "", false
	}
	start, plain := p.i, true
	for p.i < len(p.data) {
		c := p.data[p.i]
		switch {
		case c == '"':
			raw := p.data[start:p.i]
			p.i++
			if plain {
				return string(raw), true
			}
			return unquote(raw)
		case c == '\\':
			plain = false
			p.i += 2 // the escaped byte is checked by unquote; an escaped quote does not end the string
		case c < 0x20:
			return "", false
		case c >= utf8.RuneSelf:
			plain = false
			p.i++
		default:
			p.i++
		}
	}
	return "", false
}

// unquote decodes a string's escapes and checks its UTF-8.
func unquote(raw []byte) (string, bool) {
	var out strings.Builder
	out.Grow(len(raw))
	for i := 0; i < len(raw); {
		c := raw[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRune(raw[i:])
			if r == utf8.RuneError && size == 1 {
				return "", false
			}
			out.Write(raw[i : i+size])
			i += size
			continue
		}
		if c != '\\' {
			out.WriteByte(c)
			i++
			continue
		}
		if i+1 >= len(raw) {
			return "", false
		}
		switch raw[i+1] {
		case '"', '\\', '/':
			out.WriteByte(raw[i+1])
		case 'b':
			out.WriteByte('\b')
		case 'f':
			out.WriteByte('\f')
		case 'n':
			out.WriteByte('\n')
		case 'r':
			out.WriteByte('\r')
		case 't':
			out.WriteByte('\t')
		case 'u':
			r, ok := hex4(raw[i+2:])
			if !ok || utf16.IsSurrogate(r) {
				return "", false // not 4 hex digits, or half of a pair: decode's way with them
			}
			out.WriteRune(r)
			i += 6
			continue
		default:
			return "", false
		}
		i += 2
	}
	return out.String(), true
}

// hex4 reads the 4 hex digits of a \u escape.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// time reads the event's time as encoding/json does: the quoted literal, to time.Time's
// UnmarshalJSON.
func (p *logParser) time() (time.Time, bool) {
	start := p.i
	if !p.byte('"') {
		return time.Time{}, false
	}
	for p.i < len(p.data) {
		c := p.data[p.i]
		p.i++
		if c == '"' {
			var t time.Time
			return t, t.UnmarshalJSON(p.data[start:p.i]) == nil
		}
		if c == '\\' || c < 0x20 || c >= utf8.RuneSelf {
			return time.Time{}, false
		}
	}
	return time.Time{}, false
}

// uint reads a non-negative integer without sign, fraction or exponent.
func (p *logParser) uint() (uint64, bool) {
	start := p.i
	for p.i < len(p.data) && '0' <= p.data[p.i] && p.data[p.i] <= '9' {
		p.i++
	}
	digits := p.data[start:p.i]
	if len(digits) == 0 || len(digits) > 1 && digits[0] == '0' {
		return 0, false
	}
	if p.i < len(p.data) {
		switch p.data[p.i] {
		case '.', 'e', 'E':
			return 0, false
		}
	}
	n, err := strconv.ParseUint(string(digits), 10, 64)
	return n, err == nil
}

// bool reads true or false.
func (p *logParser) bool() (bool, bool) {
	rest := p.data[p.i:]
	switch {
	case len(rest) >= 4 && string(rest[:4]) == "true":
		p.i += 4
		return true, true
	case len(rest) >= 5 && string(rest[:5]) == "false":
		p.i += 5
		return false, true
	}
	return false, false
}
