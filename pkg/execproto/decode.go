package execproto

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"

	"github.com/kubeclip/kubeclip/pkg/strictjson"
)

// Decode decodes data, a request from a client kubeclip does not trust, into v strictly: at
// most MaxRequestBytes, one JSON object, no unknown field, no key given twice or in another
// case. Every problem is an invalid_request *Error naming the field when one is at fault.
func Decode(data []byte, v any) error {
	if len(data) > MaxRequestBytes {
		return InvalidRequest("", "request is %d bytes, more than the %d-byte limit", len(data), MaxRequestBytes)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return InvalidRequest("", "request is empty")
	}
	var keyErr *strictjson.KeyError
	if err := strictjson.CheckKeys(data, ""); err != nil {
		if errors.As(err, &keyErr) {
			return InvalidRequest(keyErr.Path, "%s", keyErr.Reason)
		}
		return InvalidRequest("", "request is not valid JSON")
	}
	if err := strictjson.CheckFields(data, v, ""); errors.As(err, &keyErr) {
		return InvalidRequest(keyErr.Path, "%s", keyErr.Reason)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			if typeErr.Field == "" {
				return InvalidRequest("", "request must be a JSON object")
			}
			return InvalidRequest(typeErr.Field, "must be %s", typeErr.Type.String())
		}
		// encoding/json reports an unknown key as `json: unknown field "x"`.
		if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			if f, uerr := strconv.Unquote(name); uerr == nil && len(f) <= 64 {
				return InvalidRequest(f, "unknown field")
			}
			return InvalidRequest("", "unknown field")
		}
		return InvalidRequest("", "request is not a valid JSON object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return InvalidRequest("", "more than one JSON value")
	}
	return nil
}
