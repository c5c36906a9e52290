package meter

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
)

// MaxRequestBytes bounds the chat completions request body IncludeUsage reads: the broker must
// hold the body to rewrite it, so the bound is what one request may cost the broker in memory.
// 32 MiB fits a conversation with several base64 images; the broker answers a larger streaming
// request as it decides (refusing it, or forwarding it and counting the response unmetered).
const MaxRequestBytes = 32 << 20

// ErrRequestTooLarge is IncludeUsage's error for a body over MaxRequestBytes.
var ErrRequestTooLarge = errors.New("the request body is larger than the meter reads (32 MiB)")

// RequestError is a chat completions request IncludeUsage cannot rewrite safely. Field names
// the member at fault ("" for the body as a whole); Reason never quotes the body.
type RequestError struct {
	Field  string
	Reason string
}

func (e *RequestError) Error() string {
	if e.Field == "" {
		return "chat completions request: " + e.Reason
	}
	return "chat completions request: " + e.Field + ": " + e.Reason
}

// IncludeUsage makes a streaming chat completions request ask for usage. A chat completions
// stream states usage only when the request set stream_options.include_usage (see the package
// doc), and the agent writes the request, so the broker sets it: the reply gains one chunk
// with empty choices before data: [DONE], which clients of the API expect to handle.
//
// For a body with "stream": true and without "stream_options": {"include_usage": true} it
// returns a new body with include_usage set and changed true; otherwise it returns body
// itself and false. The edit is surgical: every other byte of the body is kept as it was
// (the member is added after the last one, or the value replaced in place), so the upstream
// reads the same request the agent sent, plus the option. The broker must update
// Content-Length.
//
// A body the upstream might read differently from this function is refused with a
// *RequestError rather than guessed at: a body that is not one JSON object, "stream",
// "stream_options" or "stream_options.include_usage" given twice (parsers disagree on which
// wins), a "stream" that is not a boolean or null, a "stream_options" that is not an object or
// null.
func IncludeUsage(body []byte) ([]byte, bool, error) {
	if len(body) > MaxRequestBytes {
		return nil, false, ErrRequestTooLarge
	}
	top, err := members(body, "")
	if err != nil {
		return nil, false, err
	}
	stream, hasStream := top.find("stream")
	if !hasStream || string(body[stream.start:stream.end]) != "true" {
		if hasStream {
			if v := string(body[stream.start:stream.end]); v != "false" && v != "null" {
				return nil, false, &RequestError{Field: "stream", Reason: "is not a boolean"}
			}
		}
		return body, false, nil
	}
	const option = `"include_usage":true`
	opts, hasOpts := top.find("stream_options")
	if !hasOpts {
		return splice(body, top.lastEnd, top.lastEnd, `,"stream_options":{`+option+`}`), true, nil
	}
	raw := body[opts.start:opts.end]
	switch raw[0] {
	case 'n': // null
		return splice(body, opts.start, opts.end, `{`+option+`}`), true, nil
	case '{':
	default:
		return nil, false, &RequestError{Field: "stream_options", Reason: "is not an object"}
	}
	inner, err := members(raw, "stream_options")
	if err != nil {
		return nil, false, err
	}
	iu, ok := inner.find("include_usage")
	switch {
	case !ok && len(inner.list) == 0:
		at := opts.start + inner.open + 1
		return splice(body, at, at, option), true, nil
	case !ok:
		at := opts.start + inner.lastEnd
		return splice(body, at, at, ","+option), true, nil
	case string(raw[iu.start:iu.end]) == "true":
		return body, false, nil
	default:
		return splice(body, opts.start+iu.start, opts.start+iu.end, "true"), true, nil
	}
}

// member is one member of a JSON object: its decoded key and its value's byte span.
type member struct {
	key        string
	start, end int
}

type object struct {
	list    []member
	open    int // offset of '{'
	lastEnd int // offset just after the last member's value, or after '{' when empty
}

// find returns the member with the key. members has refused duplicates of the keys asked for.
func (o object) find(key string) (member, bool) {
	for _, m := range o.list {
		if m.key == key {
			return m, true
		}
	}
	return member{}, false
}

// watched are the keys whose duplicates are refused, by the object they are in.
var watched = map[string][]string{
	"":               {"stream", "stream_options"},
	"stream_options": {"include_usage"},
}

// members reads data as one JSON object and lists its members with their spans. field names
// the object in errors.
func members(data []byte, field string) (object, error) {
	bad := func(reason string) error { return &RequestError{Field: field, Reason: reason} }
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if d, ok := tok.(json.Delim); err != nil || !ok || d != '{' {
		return object{}, bad("is not a JSON object")
	}
	o := object{open: int(dec.InputOffset()) - 1}
	o.lastEnd = o.open + 1
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return object{}, bad("is not valid JSON")
		}
		key, _ := tok.(string)
		var n spanLen
		if err := dec.Decode(&n); err != nil {
			return object{}, bad("is not valid JSON")
		}
		end := int(dec.InputOffset())
		m := member{key: key, start: end - int(n), end: end}
		for _, w := range watched[field] {
			if key == w {
				if _, dup := o.find(key); dup {
					return object{}, &RequestError{Field: joinField(field, key), Reason: "is given twice"}
				}
			}
		}
		o.list = append(o.list, m)
		o.lastEnd = end
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return object{}, bad("is not valid JSON")
	}
	if _, err := dec.Token(); err != io.EOF {
		return object{}, bad("has data after its JSON object")
	}
	return o, nil
}

// spanLen decodes a JSON value of any kind into its length in bytes: encoding/json hands an
// Unmarshaler the value's exact bytes, without whitespace, so members learns where each value
// lies without copying it (json.RawMessage would copy a request's whole conversation).
type spanLen int

func (n *spanLen) UnmarshalJSON(b []byte) error {
	*n = spanLen(len(b))
	return nil
}

func joinField(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}

func splice(body []byte, from, to int, insert string) []byte {
	out := make([]byte, 0, len(body)-(to-from)+len(insert))
	out = append(out, body[:from]...)
	out = append(out, insert...)
	return append(out, body[to:]...)
}
