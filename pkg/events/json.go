package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	"github.com/kubeclip/kubeclip/pkg/strictjson"
)

// DefaultMaxMsgSize is the largest payload kubeclip accepts or publishes: 1 MiB, NATS's default
// max_payload. A lease request is a few KiB; a log event at most MaxLogEventBytes.
const DefaultMaxMsgSize = 1 << 20

// MaxLogEventBytes bounds a log event's encoded JSON payload: big enough to carry hundreds of
// typical lines per message, small enough that a slow reader never has to swallow a large
// message, and far under the 1 MiB stream limit. A line too long for one event is split
// (LogLine.Partial), never truncated.
const MaxLogEventBytes = 64 << 10

// marshal encodes a payload without HTML escaping: log text full of '<' and '&' stays readable
// and compact, and the run-watcher's log batcher (which encodes the same way) sizes events byte
// for byte as they are published.
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// decode unmarshals a payload, rejecting an oversized, empty or malformed one with a
// TerminalError that names the field. Unknown fields are tolerated so Paperclip can add fields
// without breaking older kubeclip releases; a key given twice, two keys differing only in case,
// or a field name in the wrong case are refused (strictjson), because encoding/json would
// resolve them silently and a check could then read another value than the handler.
func decode(data []byte, v any) error {
	if len(data) > DefaultMaxMsgSize {
		return InvalidRequest("", "payload is %d bytes, more than the %d-byte limit", len(data), DefaultMaxMsgSize)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return InvalidRequest("", "payload is empty")
	}
	// Unmarshal checks that data is valid JSON before it fills v; once it has, the keys are
	// checked (one more read of data, not two), and a refused key is the error, before
	// anything Unmarshal made of data.
	err := json.Unmarshal(data, v)
	var syntaxErr *json.SyntaxError
	if !errors.As(err, &syntaxErr) {
		var keyErr *strictjson.KeyError
		if err := strictjson.CheckParsed(data, v, ""); errors.As(err, &keyErr) {
			return InvalidRequest(keyErr.Path, "%s", keyErr.Reason)
		}
	}
	if err == nil {
		return nil
	}
	var typeErr *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntaxErr):
		return InvalidRequest("", "payload is not valid JSON (at byte %d): %v", syntaxErr.Offset, syntaxErr)
	case errors.As(err, &typeErr):
		if typeErr.Field == "" {
			return InvalidRequest("", "payload must be a JSON object, not %s", typeErr.Value)
		}
		return InvalidRequest(typeErr.Field, "must be %s, not %s", jsonTypeName(typeErr.Type), typeErr.Value)
	default:
		return InvalidRequest("", "decoding payload: %v", err)
	}
}

func jsonTypeName(t reflect.Type) string {
	if t == nil {
		return "a JSON value"
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64,
		reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Pointer:
		return jsonTypeName(t.Elem())
	}
	return fmt.Sprintf("a %s", t.Kind())
}
