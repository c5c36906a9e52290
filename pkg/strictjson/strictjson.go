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
	"io"
	"reflect"
	"strconv"
	"strings"
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
// matches field names). root prefixes every path ("" for none).
func CheckKeys(data []byte, root string) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := walk(dec, root, 0); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: data after the top-level value", ErrMalformed)
	}
	return nil
}

func walk(dec *json.Decoder, path string, depth int) error {
	if depth > maxDepth {
		return &KeyError{Path: orRoot(path), Reason: fmt.Sprintf("nested more than %d levels deep", maxDepth)}
	}
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	delim, ok := tok.(json.Delim)
	if !ok {
		return nil // a scalar
	}
	switch delim {
	case '{':
		seen := map[string]string{} // folded key → key as written
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return fmt.Errorf("%w: %w", ErrMalformed, err)
			}
			key, _ := tok.(string)
			keyPath := Join(path, key)
			folded := fold(key)
			if prev, dup := seen[folded]; dup {
				if prev == key {
					return &KeyError{Path: keyPath, Reason: "duplicate key"}
				}
				return &KeyError{Path: keyPath, Reason: fmt.Sprintf("key differs from %s only in case", strconv.Quote(prev))}
			}
			seen[folded] = key
			if err := walk(dec, keyPath, depth+1); err != nil {
				return err
			}
		}
	case '[':
		for i := 0; dec.More(); i++ {
			if err := walk(dec, path+"["+strconv.Itoa(i)+"]", depth+1); err != nil {
				return err
			}
		}
	}
	if _, err := dec.Token(); err != nil { // the closing delimiter
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return nil
}

// CheckFields refuses a top-level key of the object in data that encoding/json would match to a
// field of v's struct type although it is not spelled as the field's JSON name (`COMPANYID` for
// `companyId`). Keys matching no field are left alone: payloads may grow fields. It recurses
// into fields whose type is itself a struct (or a pointer to one). data must have passed
// CheckKeys.
func CheckFields(data []byte, v any, root string) error {
	t := reflect.TypeOf(v)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	return checkFields(data, t, root)
}

func checkFields(data []byte, t reflect.Type, path string) error {
	var obj map[string]json.RawMessage
	if json.Unmarshal(data, &obj) != nil {
		return nil // not an object: the decoder reports the type error
	}
	fields := jsonFields(t)
	for key, raw := range obj {
		want, ok := fields[fold(key)]
		if !ok {
			continue
		}
		if want.name != key {
			return &KeyError{Path: Join(path, key), Reason: "unknown field; did you mean " + strconv.Quote(want.name) + "? (names are case-sensitive)"}
		}
		if want.typ != nil {
			if err := checkFields(raw, want.typ, Join(path, key)); err != nil {
				return err
			}
		}
	}
	return nil
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
