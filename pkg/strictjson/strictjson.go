// Package strictjson reads JSON sent by clients kubeclip does not trust. encoding/json resolves
// two things silently that a hostile client can use to smuggle a value past a reviewer or a
// log: a key given twice (the last one wins) and a key that differs from a field's name only in
// case (it fills the field). Both are refused here, with the offending key's path, before the
// document is decoded.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"unicode"
)

// KeyError is a refused key. Path is where it sits, in the form kubeclip's errors name fields
// (`config.adapters[0].envKeys`); Key is the key itself.
type KeyError struct {
	Path   string
	Reason string
}

func (e *KeyError) Error() string { return e.Path + ": " + e.Reason }

// ErrMalformed is returned when the document is not valid JSON; encoding/json reports where.
var ErrMalformed = errors.New("malformed JSON")

// maxDepth bounds nesting so a document of a million '[' cannot exhaust the stack.
const maxDepth = 64

// CheckKeys walks the whole document and refuses any object that holds the same key twice, or
// two keys that are equal when case is ignored (Unicode simple folding, as encoding/json
// matches field names). root prefixes every path ("" for none). A document that is not valid
// JSON is ErrMalformed, whatever keys it holds.
func CheckKeys(data []byte, root string) error {
	return Check(data, nil, root)
}

// CheckFields refuses a key of the object in data that encoding/json would match to a field of
// v's struct type although it is not spelled as the field's JSON name (`COMPANYID` for
// `companyId`). Keys matching no field are left alone: payloads may grow fields. It recurses
// into fields whose type is itself a struct (or a pointer to one). data must have passed
// CheckKeys; a document that is not valid JSON passes (the decoder reports it).
func CheckFields(data []byte, v any, root string) error {
	if !json.Valid(data) {
		return nil
	}
	w := walker{data: data, root: root}
	_ = w.walk(0, structType(v)) // a refused key is CheckKeys' to report, and data has passed it
	if w.fieldErr != nil {
		return w.fieldErr
	}
	return nil
}

// Check is CheckKeys and CheckFields in one pass over data, as a decoder of client payloads
// calls them: ErrMalformed for a document that is not valid JSON, then the first refused key in
// document order, then a key spelled unlike the field of v it fills. It reads data twice
// (json.Valid, then the walk), allocates nothing for ASCII keys without escapes, and costs
// about as much as one json.Unmarshal of data.
func Check(data []byte, v any, root string) error {
	if !json.Valid(data) {
		return fmt.Errorf("%w: %w", ErrMalformed, validityError(data))
	}
	return CheckParsed(data, v, root)
}

// CheckParsed is Check without its json.Valid pass, for data that json.Unmarshal has just
// parsed (it returned no *json.SyntaxError, so data is valid JSON): a decoder that unmarshals
// first and checks the keys before it looks at the result reads data twice, not three times.
// For data that is not valid JSON its answer means nothing, but it returns.
func CheckParsed(data []byte, v any, root string) error {
	var path [8]step // deep enough for kubeclip's payloads without growing
	w := walker{data: data, root: root, path: path[:0]}
	if err := w.walk(0, structType(v)); err != nil {
		return err
	}
	if w.fieldErr != nil {
		return w.fieldErr
	}
	return nil
}

// TopLevel reads the values of the named keys of the object data holds, without descending
// into any value: what is nested inside costs one pass and no depth, so a request refused for
// its nesting (or for a key deep inside) still names its run, and its failure is reported. A
// name missing from the object has a nil value. Like Check it refuses, at the top level only, a
// key given twice or two keys that differ only in case (KeyError), and a key spelled unlike a
// name but matching it when case is ignored (`RUNID` for `runId`), since encoding/json would
// read it as that name. A document that is not valid JSON, or not an object, is ErrMalformed.
func TopLevel(data []byte, names ...string) ([]json.RawMessage, error) {
	if !json.Valid(data) {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, validityError(data))
	}
	w := walker{data: data}
	w.space()
	if w.at() != '{' {
		return nil, fmt.Errorf("%w: not a JSON object", ErrMalformed)
	}
	values := make([]json.RawMessage, len(names))
	var small [smallObject][]byte
	seen := small[:0]
	var folded map[string][]byte
	w.i++
	w.space()
	if w.at() == '}' {
		return values, nil
	}
	for {
		w.space()
		key := w.key()
		if prev, dup := w.seen(seen, folded, key); dup {
			if string(prev) == string(key) {
				return nil, &KeyError{Path: Join("", string(key)), Reason: "duplicate key"}
			}
			return nil, &KeyError{Path: Join("", string(key)), Reason: fmt.Sprintf("key differs from %s only in case", strconv.Quote(string(prev)))}
		}
		seen, folded = remember(seen, folded, key)
		w.space()
		w.i++ // ':'
		w.space()
		start := w.i
		w.skip()
		for n, name := range names {
			switch {
			case name == string(key):
				values[n] = json.RawMessage(data[start:w.i])
			case fold(name) == fold(string(key)):
				return nil, &KeyError{Path: Join("", string(key)), Reason: "unknown field; did you mean " + strconv.Quote(name) + "? (names are case-sensitive)"}
			}
		}
		w.space()
		c := w.at()
		w.i++ // ',' or '}'
		if c != ',' {
			return values, nil
		}
	}
}

// skip moves past the value at w.i, counting brackets rather than recursing, so it needs no
// stack however deep the value nests.
func (w *walker) skip() {
	switch w.at() {
	case '"':
		w.str()
		return
	case '{', '[':
	default: // a number, true, false or null
		for w.i < len(w.data) && !isDelim(w.data[w.i]) {
			w.i++
		}
		return
	}
	depth := 0
	for w.i < len(w.data) {
		switch w.data[w.i] {
		case '"':
			w.str()
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		}
		w.i++
		if depth == 0 {
			return
		}
	}
}

// validityError is encoding/json's account of why data is not valid JSON.
func validityError(data []byte) error {
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	return errors.New("invalid JSON")
}

// structType is the struct type v points to, or nil when v holds no struct.
func structType(v any) reflect.Type {
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	return t
}

// smallObject is how many keys an object may hold before the walker looks its keys up in a map
// of their folded forms instead of comparing each new key with every earlier one.
const smallObject = 16

// walker reads one valid JSON document once. It keeps the path to the value it reads as a stack
// of keys and indexes and formats it only for an error. It never reads past data's end and
// every loop moves on by a byte at least, so a document that is not valid JSON after all ends
// the walk early rather than in a panic or a loop.
type walker struct {
	data []byte
	i    int
	root string
	path []step
	// fieldErr is the first key found spelled unlike the struct field it fills.
	fieldErr *KeyError
}

// step is one key (key != nil) or array index on the path to the current value.
type step struct {
	key   []byte
	index int
}

// walk reads the value at w.i; t is the struct type it decodes into, or nil. It returns the
// first duplicate or case-variant key, or a value nested deeper than maxDepth.
func (w *walker) walk(depth int, t reflect.Type) error {
	if depth > maxDepth {
		return &KeyError{Path: orRoot(w.pathString()), Reason: fmt.Sprintf("nested more than %d levels deep", maxDepth)}
	}
	w.space()
	switch w.at() {
	case '{':
		return w.object(depth, t)
	case '[':
		w.i++
		w.space()
		if w.at() == ']' {
			w.i++
			return nil
		}
		for index := 0; ; index++ {
			w.path = append(w.path, step{index: index})
			if err := w.walk(depth+1, nil); err != nil {
				return err
			}
			w.path = w.path[:len(w.path)-1]
			w.space()
			c := w.at()
			w.i++ // ',' or ']'
			if c != ',' {
				return nil
			}
		}
	case '"':
		w.str()
	default: // a number, true, false or null
		for w.i < len(w.data) && !isDelim(w.data[w.i]) {
			w.i++
		}
	}
	return nil
}

// object reads the object at w.i.
func (w *walker) object(depth int, t reflect.Type) error {
	var fields map[string]field
	if t != nil {
		fields = cachedFields(t)
	}
	var small [smallObject][]byte
	seen := small[:0]
	var folded map[string][]byte // folded key → key as written, once seen outgrows small
	w.i++
	w.space()
	if w.at() == '}' {
		w.i++
		return nil
	}
	for {
		w.space()
		key := w.key()
		if prev, dup := w.seen(seen, folded, key); dup {
			w.path = append(w.path, step{key: key})
			if string(prev) == string(key) {
				return &KeyError{Path: w.pathString(), Reason: "duplicate key"}
			}
			return &KeyError{Path: w.pathString(), Reason: fmt.Sprintf("key differs from %s only in case", strconv.Quote(string(prev)))}
		}
		seen, folded = remember(seen, folded, key)
		w.path = append(w.path, step{key: key})
		var inner reflect.Type
		if want, ok := lookup(fields, key); ok {
			if want.name != string(key) && w.fieldErr == nil {
				w.fieldErr = &KeyError{Path: w.pathString(), Reason: "unknown field; did you mean " + strconv.Quote(want.name) + "? (names are case-sensitive)"}
			}
			inner = want.typ
		}
		w.space()
		w.i++ // ':'
		if err := w.walk(depth+1, inner); err != nil {
			return err
		}
		w.path = w.path[:len(w.path)-1]
		w.space()
		c := w.at()
		w.i++ // ',' or '}'
		if c != ',' {
			return nil
		}
	}
}

// seen reports the earlier key of the object that equals key when case is ignored.
func (w *walker) seen(small [][]byte, folded map[string][]byte, key []byte) ([]byte, bool) {
	if folded != nil {
		prev, ok := folded[fold(string(key))]
		return prev, ok
	}
	for _, prev := range small {
		if bytes.EqualFold(prev, key) {
			return prev, true
		}
	}
	return nil, false
}

// key reads the string at w.i and returns it decoded: the bytes as written when they are
// ASCII without escapes, else what encoding/json makes of them (escapes resolved, invalid
// UTF-8 replaced), so that keys compare as the decoder will see them.
func (w *walker) key() []byte {
	start := w.i
	plain := w.str()
	raw := w.data[start:min(w.i, len(w.data))]
	if plain && len(raw) >= 2 {
		return raw[1 : len(raw)-1]
	}
	var s string
	_ = json.Unmarshal(raw, &s) // raw is a valid JSON string in valid JSON
	return []byte(s)
}

// str skips the string at w.i and reports whether it is ASCII without escapes.
func (w *walker) str() (plain bool) {
	plain = true
	w.i++ // '"'
	for w.i < len(w.data) {
		c := w.data[w.i]
		w.i++
		switch {
		case c == '"':
			return plain
		case c == '\\':
			plain = false
			w.i++ // the escaped byte; a \uXXXX's hex digits are plain bytes
		case c >= 0x80:
			plain = false
		}
	}
	return false
}

// at is the byte at w.i, or 0 past the end.
func (w *walker) at() byte {
	if w.i < len(w.data) {
		return w.data[w.i]
	}
	return 0
}

func (w *walker) space() {
	for w.i < len(w.data) {
		switch w.data[w.i] {
		case ' ', '\t', '\n', '\r':
			w.i++
		default:
			return
		}
	}
}

func isDelim(c byte) bool {
	switch c {
	case ',', ']', '}', ' ', '\t', '\n', '\r':
		return true
	}
	return false
}

// pathString formats the path to the current value, as kubeclip's errors name fields.
func (w *walker) pathString() string {
	p := w.root
	for _, s := range w.path {
		if s.key == nil {
			p += "[" + strconv.Itoa(s.index) + "]"
			continue
		}
		p = Join(p, string(s.key))
	}
	return p
}

// lookup finds the field key fills, matched as encoding/json matches names (case ignored).
func lookup(fields map[string]field, key []byte) (field, bool) {
	if fields == nil {
		return field{}, false
	}
	var buf [64]byte
	if len(key) <= len(buf) && isASCII(key) {
		// An ASCII string folds to its upper case: the least rune of the orbits of 'k' and 's'
		// (with the Kelvin sign and the long s) is the capital letter.
		for i, c := range key {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			buf[i] = c
		}
		f, ok := fields[string(buf[:len(key)])]
		return f, ok
	}
	f, ok := fields[fold(string(key))]
	return f, ok
}

func isASCII(b []byte) bool {
	for _, c := range b {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

// fieldCache holds each struct type's fields by folded JSON name, computed once per type as
// encoding/json caches its own field lists: the walk of a payload only looks them up.
var fieldCache sync.Map // reflect.Type → map[string]field

func cachedFields(t reflect.Type) map[string]field {
	if f, ok := fieldCache.Load(t); ok {
		return f.(map[string]field)
	}
	f, _ := fieldCache.LoadOrStore(t, jsonFields(t))
	return f.(map[string]field)
}

type field struct {
	name string
	typ  reflect.Type // the struct type to recurse into, or nil
}

// jsonFields lists the JSON names of t's fields by their folded form, with embedded structs'
// fields promoted as encoding/json promotes them.
func jsonFields(t reflect.Type) map[string]field {
	out := map[string]field{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && name == "" && ft.Kind() == reflect.Struct {
			for k, v := range jsonFields(ft) {
				out[k] = v
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fd := field{name: name}
		if ft.Kind() == reflect.Struct && ft != reflect.TypeFor[json.RawMessage]() && !implementsUnmarshaler(ft) {
			fd.typ = ft
		}
		out[fold(name)] = fd
	}
	return out
}

func implementsUnmarshaler(t reflect.Type) bool {
	u := reflect.TypeFor[json.Unmarshaler]()
	return t.Implements(u) || reflect.PointerTo(t).Implements(u)
}

// fold maps s to one representative of its case-insensitive class: every rune becomes the
// smallest rune of its Unicode simple-folding orbit, so "K", "k" and the Kelvin sign fold alike,
// as encoding/json matches them.
func fold(s string) string {
	return strings.Map(func(r rune) rune {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		return least
	}, s)
}

// Join appends an object key to a path: `a.b` for identifier-like keys, `a["x/y"]` otherwise.
func Join(parent, key string) string {
	if !isIdentifier(key) {
		return parent + "[" + strconv.Quote(key) + "]"
	}
	if parent == "" {
		return key
	}
	return parent + "." + key
}

func orRoot(path string) string {
	if path == "" {
		return "payload"
	}
	return path
}

func isIdentifier(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		switch {
		case r == '_' || r == '$' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z'):
		case i > 0 && r >= '0' && r <= '9':
		default:
			return false
		}
	}
	return true
}

// remember adds key to an object's keys so far: a slice while the object is small, past
// smallObject a map by folded key (what seen looks a key up in).
func remember(seen [][]byte, folded map[string][]byte, key []byte) ([][]byte, map[string][]byte) {
	switch {
	case folded != nil:
		folded[fold(string(key))] = key
	case len(seen) < smallObject:
		seen = append(seen, key)
	default:
		folded = make(map[string][]byte, 2*smallObject)
		for _, k := range append(seen, key) {
			folded[fold(string(k))] = k
		}
	}
	return seen, folded
}
