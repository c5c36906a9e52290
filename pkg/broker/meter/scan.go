package meter

import (
	"fmt"
	"unicode/utf16"
	"unicode/utf8"
)

// The scanner's bounds. None of them is a limit on the document: past each, the scanner keeps
// validating and only stops remembering what it cannot use.
const (
	// maxDepth containers are tracked with their kind, so JSON is validated strictly to that
	// depth. Deeper values (a model's nested tool input, say) are skipped by counting brackets
	// outside strings, without validation; no usage lives there.
	maxDepth = 32
	// maxPathLen bounds a dotted path that can still match a schema path.
	maxPathLen = 64
	// maxStrLen bounds a captured string (a model or an event type) and a captured key.
	maxStrLen = 128
	// maxNumLen bounds a captured number: 2^53 has 16 digits.
	maxNumLen = 24
)

type scanState uint8

const (
	sValue    scanState = iota // a value must come next
	sArrFirst                  // after '[': a value or ']'
	sObjFirst                  // after '{': a key or '}'
	sObjKey                    // after ',' in an object: a key
	sColon                     // after a key: ':'
	sAfter                     // after a value: ',' or the container's close; at depth 0, the end
	sString                    // inside a string, a key's or a value's
	sEscape                    // after '\' in a string
	sUnicode                   // inside the four hex digits of \u
	sNumber
	sLiteral // true, false, null
	sDeep    // inside a container nested deeper than maxDepth
	sError
)

// numState is where a number is in JSON's number grammar.
type numState uint8

const (
	nMinus numState = iota // after '-'
	nZero                  // a leading 0 (accepting)
	nInt                   // integer digits (accepting)
	nDot                   // after '.'
	nFrac                  // fraction digits (accepting)
	nE                     // after 'e'
	nESign                 // after the exponent's sign
	nExp                   // exponent digits (accepting)
)

type frame struct {
	array bool
	// pathLen is the length of the container's own dotted path in scanner.path.
	pathLen uint8
	// interesting: the container's path is the root or a schema prefix, so its keys are read.
	interesting bool
}

// capture is what a document stated at one schema path.
type capture struct {
	set bool // a value other than null was stated
	// bad says why the value at a count's path cannot be used ("a string", "negative"); "" when
	// it can. A constant: it never quotes the document.
	bad    string
	n      int64
	str    [maxStrLen]byte
	strLen uint8
	long   bool // the string was longer than maxStrLen
}

// scanner reads one JSON document incrementally and captures the values at its schema's leaf
// paths. Memory is fixed: nothing grows with the document.
type scanner struct {
	sc *schema
	st scanState

	depth int // containers open, up to maxDepth; deeper ones are counted in deep
	stack [maxDepth]frame
	path  [maxPathLen]byte

	// The value about to be read or being read: its schema path index (-1 for none), whether it
	// is a schema prefix (an object there is descended into), and its path's length.
	valPath     int
	valInterest bool
	valPathLen  uint8

	// The string being read.
	strKey     bool // it is an object's key
	strCap     bool // its decoded bytes are kept (in buf)
	buf        [maxStrLen]byte
	bufLen     int
	bufLong    bool
	keyOdd     bool // the key holds a '.', so it can match no dotted path
	uni        rune // \u digits so far
	uniN       int
	highSurrog rune // a high surrogate waiting for its low half

	num    numState
	numCap bool
	numBuf [maxNumLen]byte
	numLen int

	lit    string // the literal being matched
	litPos int

	deep    int // containers open beyond maxDepth
	deepStr bool
	deepEsc bool

	seen    uint16 // schema paths met in this document, to refuse a key stated twice
	caps    [maxPaths]capture
	started bool  // a non-whitespace byte was read
	off     int64 // bytes read
	err     string
	errOff  int64
}

func (s *scanner) reset(sc *schema) {
	*s = scanner{sc: sc, st: sValue, valPath: -1, valInterest: true}
}

func (s *scanner) failed() bool { return s.st == sError }

// complete reports whether the bytes read so far are one whole JSON value. A number at the top
// level is whole once it can end, though more digits could still follow.
func (s *scanner) complete() bool {
	return s.depth == 0 && (s.st == sAfter || s.st == sNumber && s.numAccepting())
}

func (s *scanner) numAccepting() bool {
	return s.num == nZero || s.num == nInt || s.num == nFrac || s.num == nExp
}

// describeError says where the document went wrong, for Usage.Detail.
func (s *scanner) describeError(where string) string {
	return fmt.Sprintf("%s is not valid JSON: %s at byte %d", where, s.err, s.errOff)
}

func (s *scanner) fail(msg string, i int) {
	s.st, s.err, s.errOff = sError, msg, s.off+int64(i)
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// feed reads the next bytes of the document.
func (s *scanner) feed(p []byte) {
	i := 0
	for i < len(p) {
		c := p[i]
		switch s.st {
		case sError:
			s.off += int64(len(p))
			return

		case sValue:
			if isSpace(c) {
				i++
				continue
			}
			s.beginValue(c, i)

		case sArrFirst:
			if isSpace(c) {
				i++
				continue
			}
			if c == ']' {
				s.closeContainer()
			} else {
				s.beginValue(c, i)
			}

		case sObjFirst, sObjKey:
			switch {
			case isSpace(c):
			case c == '"':
				s.beginString(true)
			case c == '}' && s.st == sObjFirst:
				s.closeContainer()
			default:
				s.fail(unexpected(c, "where an object key was expected"), i)
				continue
			}

		case sColon:
			switch {
			case isSpace(c):
			case c == ':':
				if !s.resolveKey(i) {
					continue
				}
				s.st = sValue
			default:
				s.fail(unexpected(c, "after an object key"), i)
				continue
			}

		case sAfter:
			switch {
			case isSpace(c):
			case s.depth == 0:
				s.fail(unexpected(c, "after the JSON value"), i)
				continue
			case c == ',':
				if s.stack[s.depth-1].array {
					s.st, s.valPath, s.valInterest = sValue, -1, false
				} else {
					s.st = sObjKey
				}
			case c == ']' && s.stack[s.depth-1].array, c == '}' && !s.stack[s.depth-1].array:
				s.closeContainer()
			default:
				s.fail(unexpected(c, "after a value"), i)
				continue
			}

		case sString:
			// The common case first: a run of plain characters.
			j := i
			for j < len(p) && p[j] != '"' && p[j] != '\\' && p[j] >= 0x20 {
				j++
			}
			if j > i {
				s.appendStr(p[i:j])
				i = j
				continue
			}
			switch c {
			case '"':
				s.flushSurrogate()
				s.endString()
			case '\\':
				s.st = sEscape
			default:
				s.fail("a control character inside a string", i)
				continue
			}

		case sEscape:
			var b byte
			switch c {
			case '"', '\\', '/':
				b = c
			case 'b':
				b = '\b'
			case 'f':
				b = '\f'
			case 'n':
				b = '\n'
			case 'r':
				b = '\r'
			case 't':
				b = '\t'
			case 'u':
				s.st, s.uni, s.uniN = sUnicode, 0, 0
				i++
				continue
			default:
				s.fail(unexpected(c, "after a backslash in a string"), i)
				continue
			}
			s.st = sString
			s.appendStr([]byte{b})

		case sUnicode:
			v, ok := hexValue(c)
			if !ok {
				s.fail(unexpected(c, "in a \\u escape"), i)
				continue
			}
			s.uni = s.uni<<4 | v
			if s.uniN++; s.uniN == 4 {
				s.st = sString
				s.unicodeEscape(s.uni)
			}

		case sNumber:
			if !s.numberByte(c) {
				if !s.numAccepting() {
					s.fail(unexpected(c, "inside a number"), i)
					continue
				}
				s.endNumber()
				continue // c belongs to what follows the number
			}
			if s.numCap {
				if s.numLen < len(s.numBuf) {
					s.numBuf[s.numLen] = c
				}
				s.numLen++
			}

		case sLiteral:
			if c != s.lit[s.litPos] {
				s.fail(unexpected(c, "inside the literal "+s.lit), i)
				continue
			}
			if s.litPos++; s.litPos == len(s.lit) {
				s.endLiteral()
			}

		case sDeep:
			switch {
			case s.deepEsc:
				s.deepEsc = false
			case s.deepStr:
				switch c {
				case '\\':
					s.deepEsc = true
				case '"':
					s.deepStr = false
				}
			case c == '"':
				s.deepStr = true
			case c == '{' || c == '[':
				s.deep++
			case c == '}' || c == ']':
				if s.deep--; s.deep == 0 {
					s.st = sAfter
				}
			}
		}
		i++
	}
	s.off += int64(len(p))
}

// unexpected describes a byte the grammar does not allow, without quoting the document beyond
// that byte.
func unexpected(c byte, where string) string {
	if c >= 0x20 && c < 0x7f {
		return fmt.Sprintf("unexpected %q %s", rune(c), where)
	}
	return fmt.Sprintf("unexpected byte 0x%02x %s", c, where)
}

func hexValue(c byte) (rune, bool) {
	switch {
	case c >= '0' && c <= '9':
		return rune(c - '0'), true
	case c >= 'a' && c <= 'f':
		return rune(c-'a') + 10, true
	case c >= 'A' && c <= 'F':
		return rune(c-'A') + 10, true
	}
	return 0, false
}

// beginValue starts the value whose first byte is c (not whitespace) at the path resolved for
// it (valPath, valInterest, valPathLen).
func (s *scanner) beginValue(c byte, i int) {
	s.started = true
	leafField := fieldNone
	if s.valPath >= 0 && s.sc.paths[s.valPath].leaf {
		leafField = s.sc.paths[s.valPath].field
	}
	isCount := leafField < numCounts
	switch {
	case c == '{' || c == '[':
		if isCount {
			s.markBad("an object or array")
		}
		if s.depth == maxDepth {
			s.st, s.deep, s.deepStr, s.deepEsc = sDeep, 1, false, false
			return
		}
		s.stack[s.depth] = frame{array: c == '[', pathLen: s.valPathLen, interesting: s.valInterest && c == '{'}
		s.depth++
		if c == '[' {
			s.st, s.valPath, s.valInterest = sArrFirst, -1, false
		} else {
			s.st = sObjFirst
		}
	case c == '"':
		if isCount {
			s.markBad("a string")
		}
		s.beginString(false)
		s.strCap = leafField == fieldModel || leafField == fieldType
	case c == '-' || (c >= '0' && c <= '9'):
		s.st, s.numCap, s.numLen = sNumber, isCount, 0
		switch c {
		case '-':
			s.num = nMinus
		case '0':
			s.num = nZero
		default:
			s.num = nInt
		}
		if s.numCap {
			s.numBuf[0] = c
			s.numLen = 1
		}
	case c == 't':
		s.st, s.lit, s.litPos = sLiteral, "true", 1
	case c == 'f':
		s.st, s.lit, s.litPos = sLiteral, "false", 1
	case c == 'n':
		s.st, s.lit, s.litPos = sLiteral, "null", 1
	default:
		s.fail(unexpected(c, "where a value was expected"), i)
	}
}

// leafIndex is the schema leaf the current value fills, or -1.
func (s *scanner) leafIndex() int {
	if s.valPath >= 0 && s.sc.paths[s.valPath].leaf {
		return s.valPath
	}
	return -1
}

func (s *scanner) markBad(why string) {
	if i := s.leafIndex(); i >= 0 {
		s.caps[i].set, s.caps[i].bad = false, why
	}
}

func (s *scanner) beginString(key bool) {
	s.st, s.strKey, s.bufLen, s.bufLong, s.keyOdd, s.highSurrog = sString, key, 0, false, false, 0
	s.started = true
	// A key is kept only where it can extend a schema path; beginValue decides for a value.
	s.strCap = key && s.depth > 0 && s.stack[s.depth-1].interesting
}

// appendStr adds decoded string bytes to buf when the string is kept.
func (s *scanner) appendStr(b []byte) {
	s.flushSurrogate()
	if !s.strCap {
		return
	}
	for _, c := range b {
		if c == '.' && s.strKey {
			s.keyOdd = true
		}
	}
	n := copy(s.buf[s.bufLen:], b)
	s.bufLen += n
	if n < len(b) {
		s.bufLong = true
	}
}

// unicodeEscape adds the rune of a \u escape, pairing surrogates as encoding/json does: a high
// surrogate and the low one right after it make one rune; any other surrogate is U+FFFD.
func (s *scanner) unicodeEscape(r rune) {
	if s.highSurrog != 0 {
		high := s.highSurrog
		s.highSurrog = 0
		if r >= 0xDC00 && r < 0xE000 {
			s.appendRune(utf16.DecodeRune(high, r))
			return
		}
		s.appendRune(utf8.RuneError)
	}
	switch {
	case r >= 0xD800 && r < 0xDC00:
		s.highSurrog = r
	case utf16.IsSurrogate(r):
		s.appendRune(utf8.RuneError)
	default:
		s.appendRune(r)
	}
}

// flushSurrogate writes a high surrogate that no low one followed as U+FFFD.
func (s *scanner) flushSurrogate() {
	if s.highSurrog != 0 {
		s.highSurrog = 0
		s.appendRune(utf8.RuneError)
	}
}

func (s *scanner) appendRune(r rune) {
	var b [utf8.UTFMax]byte
	n := utf8.EncodeRune(b[:], r)
	s.appendStr(b[:n])
}

func (s *scanner) endString() {
	if s.strKey {
		s.st = sColon
		return
	}
	if i := s.leafIndex(); i >= 0 && s.strCap {
		c := &s.caps[i]
		c.set, c.bad, c.long = true, "", s.bufLong
		c.strLen = uint8(copy(c.str[:], s.buf[:s.bufLen]))
	}
	s.st = sAfter
}

// resolveKey computes the path of the member whose key was just read. It fails the document
// when a schema path is stated twice: which of two values an upstream means is not for the
// meter to guess, and JSON parsers disagree (the first wins in some, the last in most).
func (s *scanner) resolveKey(i int) bool {
	s.valPath, s.valInterest = -1, false
	top := s.stack[s.depth-1]
	if !top.interesting || !s.strCap || s.bufLong || s.keyOdd {
		return true
	}
	n := int(top.pathLen)
	need := n + s.bufLen
	if n > 0 {
		need++
	}
	if need > maxPathLen {
		return true
	}
	if n > 0 {
		s.path[n] = '.'
		n++
	}
	n += copy(s.path[n:], s.buf[:s.bufLen])
	idx, ok := s.sc.index[string(s.path[:n])]
	if !ok {
		return true
	}
	if s.seen&(1<<idx) != 0 {
		s.fail("the key "+s.sc.paths[idx].path+" is stated twice", i)
		return false
	}
	s.seen |= 1 << idx
	s.valPath, s.valInterest, s.valPathLen = idx, !s.sc.paths[idx].leaf, uint8(n)
	return true
}

func (s *scanner) closeContainer() {
	s.depth--
	s.st = sAfter
}

// numberByte advances the number grammar by c, reporting whether c is part of the number.
func (s *scanner) numberByte(c byte) bool {
	digit := c >= '0' && c <= '9'
	switch s.num {
	case nMinus:
		switch {
		case c == '0':
			s.num = nZero
		case digit:
			s.num = nInt
		default:
			return false
		}
	case nZero, nInt:
		switch {
		case digit && s.num == nInt:
		case c == '.':
			s.num = nDot
		case c == 'e' || c == 'E':
			s.num = nE
		default:
			return false
		}
	case nDot, nFrac:
		switch {
		case digit:
			s.num = nFrac
		case (c == 'e' || c == 'E') && s.num == nFrac:
			s.num = nE
		default:
			return false
		}
	case nE:
		switch {
		case c == '+' || c == '-':
			s.num = nESign
		case digit:
			s.num = nExp
		default:
			return false
		}
	case nESign, nExp:
		if !digit {
			return false
		}
		s.num = nExp
	}
	return true
}

func (s *scanner) endNumber() {
	s.st = sAfter
	i := s.leafIndex()
	if i < 0 || !s.numCap {
		return
	}
	n, bad := parseCount(s.numBuf[:min(s.numLen, len(s.numBuf))], s.numLen > len(s.numBuf))
	c := &s.caps[i]
	if bad != "" {
		c.set, c.bad = false, bad
		return
	}
	c.set, c.bad, c.n = true, "", n
}

// parseCount reads a usage count: a JSON number that is an integer from 0 to 2^53. "-0" is 0.
func parseCount(b []byte, long bool) (int64, string) {
	for _, c := range b {
		if c == '.' || c == 'e' || c == 'E' {
			return 0, "not an integer"
		}
	}
	if long {
		return 0, "larger than 2^53"
	}
	neg := b[0] == '-'
	if neg {
		b = b[1:]
	}
	var n int64
	for _, c := range b {
		n = n*10 + int64(c-'0')
		if n > maxCount {
			return 0, "larger than 2^53"
		}
	}
	if neg && n != 0 {
		return 0, "negative"
	}
	return n, ""
}

func (s *scanner) endLiteral() {
	s.st = sAfter
	i := s.leafIndex()
	if i < 0 || s.lit == "null" {
		return // null states nothing
	}
	if f := s.sc.paths[i].field; f < numCounts {
		s.caps[i].set, s.caps[i].bad = false, "a boolean"
	}
}
