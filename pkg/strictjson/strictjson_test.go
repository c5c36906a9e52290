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
	"testing"
	"unicode"
	"unicode/utf8"
)

func TestCheckKeys(t *testing.T) {
	tests := []struct {
		name     string
		doc      string
		wantPath string // "" = accepted
		wantText string
	}{
		{name: "plain object", doc: `{"a":1,"b":{"c":[1,{"d":2}]}}`},
		{name: "same key in sibling objects", doc: `{"a":{"x":1},"b":{"x":2}}`},
		{name: "scalar document", doc: `"x"`},
		{name: "duplicate at top", doc: `{"companyId":"a","companyId":"b"}`, wantPath: "companyId", wantText: "duplicate key"},
		{name: "case variant at top", doc: `{"companyId":"a","COMPANYID":"b"}`, wantPath: "COMPANYID", wantText: `differs from "companyId" only in case`},
		{name: "kelvin sign folds like k", doc: "{\"kind\":1,\"\u212aind\":2}", wantPath: "[\"\u212aind\"]", wantText: "only in case"},
		{name: "duplicate nested in an array", doc: `{"config":{"adapters":[{"envKeys":[],"envKeys":["X"]}]}}`, wantPath: "config.adapters[0].envKeys", wantText: "duplicate key"},
		{name: "odd key names are quoted", doc: `{"m":{"a/b":1,"a/b":2}}`, wantPath: `m["a/b"]`, wantText: "duplicate key"},
		{name: "too deep", doc: strings.Repeat("[", 70) + strings.Repeat("]", 70), wantPath: strings.Repeat("[0]", 65), wantText: "nested more than"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckKeys([]byte(tc.doc), "")
			if tc.wantPath == "" {
				if err != nil {
					t.Fatalf("CheckKeys: %v", err)
				}
				return
			}
			var ke *KeyError
			if !errors.As(err, &ke) {
				t.Fatalf("CheckKeys = %v, want a *KeyError", err)
			}
			if ke.Path != tc.wantPath || !strings.Contains(ke.Reason, tc.wantText) {
				t.Errorf("CheckKeys = %q at %q, want %q at %q", ke.Reason, ke.Path, tc.wantText, tc.wantPath)
			}
		})
	}
}

func TestCheckKeysMalformed(t *testing.T) {
	for _, doc := range []string{`{"a":`, `{"a":1}{"b":2}`, `[1,]`, ``} {
		if err := CheckKeys([]byte(doc), ""); !errors.Is(err, ErrMalformed) {
			t.Errorf("CheckKeys(%q) = %v, want ErrMalformed", doc, err)
		}
	}
}

type inner struct {
	Name string `json:"name"`
}

type embedded struct {
	Zone string `json:"zone"`
}

type outer struct {
	embedded
	CompanyID string          `json:"companyId"`
	Inner     inner           `json:"inner"`
	Ptr       *inner          `json:"ptr,omitempty"`
	Raw       json.RawMessage `json:"raw"`
	Skipped   string          `json:"-"`
	NoTag     string
}

func TestCheckFields(t *testing.T) {
	tests := []struct {
		name     string
		doc      string
		wantPath string
	}{
		{name: "exact names", doc: `{"companyId":"a","inner":{"name":"n"},"zone":"z","NoTag":"x"}`},
		{name: "unknown fields are fine", doc: `{"companyId":"a","extra":1}`},
		{name: "raw message contents are not a struct", doc: `{"raw":{"COMPANYID":1}}`},
		{name: "case variant of a field", doc: `{"COMPANYID":"a"}`, wantPath: "COMPANYID"},
		{name: "case variant inside a struct field", doc: `{"inner":{"NAME":"n"}}`, wantPath: "inner.NAME"},
		{name: "case variant inside a pointer field", doc: `{"ptr":{"Name":"n"}}`, wantPath: "ptr.Name"},
		{name: "case variant of a promoted field", doc: `{"Zone":"z"}`, wantPath: "Zone"},
		{name: "case variant of an untagged field", doc: `{"notag":"x"}`, wantPath: "notag"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckFields([]byte(tc.doc), &outer{}, "")
			if tc.wantPath == "" {
				if err != nil {
					t.Fatalf("CheckFields: %v", err)
				}
				return
			}
			var ke *KeyError
			if !errors.As(err, &ke) || ke.Path != tc.wantPath {
				t.Fatalf("CheckFields = %v, want a *KeyError at %q", err, tc.wantPath)
			}
		})
	}
}

func FuzzCheckKeys(f *testing.F) {
	for _, seed := range []string{`{"a":1}`, `{"a":1,"A":2}`, `[{"x":[{"y":{}}]}]`, `{"a":`} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		err := CheckKeys(data, "")
		if err == nil && !json.Valid(data) {
			t.Fatalf("CheckKeys accepted invalid JSON %q", data)
		}
		var ke *KeyError
		if errors.As(err, &ke) && ke.Path == "" {
			t.Fatalf("KeyError without a path for %q", data)
		}
		if err != nil {
			return
		}
		// An accepted object with its first key repeated in front, as given or in another
		// case, is refused at that key: keys compare as decoded, not as written.
		obj := bytes.TrimSpace(data)
		dec := json.NewDecoder(bytes.NewReader(obj))
		if tok, _ := dec.Token(); tok != json.Delim('{') {
			return
		}
		tok, _ := dec.Token()
		key, ok := tok.(string)
		if !ok {
			return
		}
		for _, repeated := range []string{key, otherCase(key)} {
			if repeated == "" {
				continue
			}
			quoted, _ := json.Marshal(repeated)
			doc := append(append([]byte("{"), quoted...), ":0,"...)
			err := CheckKeys(append(doc, obj[1:]...), "")
			if !errors.As(err, &ke) || ke.Path != Join("", key) {
				t.Fatalf("%q in front of %q: CheckKeys = %v, want a KeyError at %q", repeated, data, err, Join("", key))
			}
		}
	})
}

// otherCase returns s with its first rune that has another case in it, or "" when none has.
func otherCase(s string) string {
	for i, r := range s {
		if f := unicode.SimpleFold(r); f != r {
			return s[:i] + string(f) + s[i+utf8.RuneLen(r):]
		}
	}
	return ""
}

// tokenCheckKeys is CheckKeys as it was written first, with encoding/json's tokenizer: the
// reference the one-pass walker must agree with.
func tokenCheckKeys(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := tokenWalk(dec, "", 0); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return ErrMalformed
	}
	return nil
}

func tokenWalk(dec *json.Decoder, path string, depth int) error {
	if depth > maxDepth {
		return &KeyError{Path: orRoot(path), Reason: fmt.Sprintf("nested more than %d levels deep", maxDepth)}
	}
	tok, err := dec.Token()
	if err != nil {
		return ErrMalformed
	}
	delim, ok := tok.(json.Delim)
	if !ok {
		return nil
	}
	switch delim {
	case '{':
		seen := map[string]string{}
		for dec.More() {
			tok, err := dec.Token()
			if err != nil {
				return ErrMalformed
			}
			key, _ := tok.(string)
			keyPath := Join(path, key)
			if prev, dup := seen[fold(key)]; dup {
				if prev == key {
					return &KeyError{Path: keyPath, Reason: "duplicate key"}
				}
				return &KeyError{Path: keyPath, Reason: fmt.Sprintf("key differs from %s only in case", strconv.Quote(prev))}
			}
			seen[fold(key)] = key
			if err := tokenWalk(dec, keyPath, depth+1); err != nil {
				return err
			}
		}
	case '[':
		for i := 0; dec.More(); i++ {
			if err := tokenWalk(dec, path+"["+strconv.Itoa(i)+"]", depth+1); err != nil {
				return err
			}
		}
	}
	if _, err := dec.Token(); err != nil {
		return ErrMalformed
	}
	return nil
}

// mapCheckFields is CheckFields as it was written first, with a map of the object's keys.
func mapCheckFields(data []byte, t reflect.Type, path string) error {
	var obj map[string]json.RawMessage
	if json.Unmarshal(data, &obj) != nil {
		return nil
	}
	fields := jsonFields(t)
	for key, raw := range obj {
		want, ok := fields[fold(key)]
		if !ok {
			continue
		}
		if want.name != key {
			return &KeyError{Path: Join(path, key), Reason: "unknown field"}
		}
		if want.typ != nil {
			if err := mapCheckFields(raw, want.typ, Join(path, key)); err != nil {
				return err
			}
		}
	}
	return nil
}

// FuzzCheckAgreesWithTokenizer holds the one-pass walker to the tokenizer-based checks it
// replaced: on valid JSON the same refused key (path and reason) or none, and a case-variant
// field wherever the map-based check found one; invalid JSON is refused by both. CheckParsed
// on any input returns (no panic, no endless loop).
func FuzzCheckAgreesWithTokenizer(f *testing.F) {
	for _, seed := range []string{
		`{"companyId":"a","inner":{"name":"n"},"zone":"z","NoTag":"x"}`, `{"inner":{"NAME":"n"}}`,
		`{"ptr":{"Name":"n"},"COMPANYID":1}`, `{"a":[{"b":1,"B":2}]}`, `{"k":1,"\u212a":2}`,
		`{"a\u0062":1,"ab":2}`, `{"\xff":1,"\xfe":2}`, `[[[[{"x":{"x":1,"x":2}}]]]]`,
		`{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"k":11,"l":12,"m":13,"n":14,"o":15,"p":16,"q":17,"A":18}`,
		`{"a":`, `{"a":1 "a":2}`, `[1,]`, ` {"a" : [ 1 , {"b":true} ] } `, `"x"`, `null`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_ = CheckParsed(data, &outer{}, "")
		got, want := CheckKeys(data, ""), tokenCheckKeys(data)
		if !json.Valid(data) {
			if got == nil || want == nil {
				t.Fatalf("%q is not valid JSON: CheckKeys = %v, the tokenizer's = %v", data, got, want)
			}
			return
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("CheckKeys(%q) = %v, the tokenizer's = %v", data, got, want)
		}
		if got != nil {
			return
		}
		gotF, wantF := CheckFields(data, &outer{}, ""), mapCheckFields(data, reflect.TypeFor[outer](), "")
		if (gotF == nil) != (wantF == nil) {
			t.Fatalf("CheckFields(%q) = %v, the map-based one's = %v", data, gotF, wantF)
		}
		if checked := Check(data, &outer{}, ""); fmt.Sprint(checked) != fmt.Sprint(gotF) {
			t.Fatalf("Check(%q) = %v, CheckKeys then CheckFields = %v", data, checked, gotF)
		}
	})
}

// TestTopLevel pins the shallow read of a request's ids: it never descends, so a document
// nested far past maxDepth (or past encoding/json's own limit in a value it skips) still yields
// its top-level keys; repeats and case variants are refused at the top level only.
func TestTopLevel(t *testing.T) {
	deep := strings.Repeat(`{"a":`, 5000) + `1` + strings.Repeat(`}`, 5000)
	tests := []struct {
		name     string
		doc      string
		wantRun  string
		wantPath string // a *KeyError at this path
		wantBad  bool   // ErrMalformed
	}{
		{name: "plain", doc: `{"runId":"r1","companyId":"c1"}`, wantRun: `"r1"`},
		{name: "config nested 5,000 deep", doc: `{"companyId":"c1","config":` + deep + `,"runId":"r1"}`, wantRun: `"r1"`},
		{name: "arrays and strings with brackets skipped", doc: `{"x":[[["]}"]],{"y":"\"{"}],"runId":"r1"}`, wantRun: `"r1"`},
		{name: "repeat nested elsewhere is not read", doc: `{"runId":"r1","config":{"a":1,"a":2}}`, wantRun: `"r1"`},
		{name: "missing", doc: `{"companyId":"c1"}`},
		{name: "repeated", doc: `{"runId":"r1","runId":"r2"}`, wantPath: "runId"},
		{name: "case variant of another key", doc: `{"config":1,"CONFIG":2,"runId":"r1"}`, wantPath: "CONFIG"},
		{name: "misspelled name", doc: `{"RUNID":"r1"}`, wantPath: "RUNID"},
		{name: "not an object", doc: `["runId"]`, wantBad: true},
		{name: "malformed", doc: `{"runId":"r1"`, wantBad: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := TopLevel([]byte(tc.doc), "runId")
			var ke *KeyError
			switch {
			case tc.wantBad:
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("TopLevel = %v, want ErrMalformed", err)
				}
			case tc.wantPath != "":
				if !errors.As(err, &ke) || ke.Path != tc.wantPath {
					t.Fatalf("TopLevel = %v, want a *KeyError at %s", err, tc.wantPath)
				}
			case err != nil:
				t.Fatalf("TopLevel: %v", err)
			case string(got[0]) != tc.wantRun:
				t.Errorf("runId = %s, want %s", got[0], tc.wantRun)
			}
		})
	}
}
