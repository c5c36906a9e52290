package meter_test

import (
	"bytes"
	encjson "encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/broker/meter"
	"github.com/kubeclip/kubeclip/pkg/strictjson"
)

// FuzzMeter feeds the meter bodies as a hostile upstream could send them, and checks it against
// a reference written separately and plainly: the WHATWG event stream algorithm over the whole
// input at once, and encoding/json for each document. The fixtures under testdata are the
// seeds, beside the corpus under testdata/fuzz; all run with every `go test`, `-fuzz` explores.
//
// mode picks the format (mode%3) and the encoding (mode&4: event stream).
func FuzzMeter(f *testing.F) {
	for _, fx := range fixtures {
		mode := uint8(fx.format - 1)
		if strings.HasSuffix(fx.file, ".sse") {
			mode |= 4
		}
		b := fx.read(f)
		f.Add(b, mode)
		f.Add(bytes.ReplaceAll(b, []byte("\n"), []byte("\r")), mode)
	}
	f.Add([]byte(`{"usage":{"output_tokens":-0,"input_tokens":9007199254740993}}`), uint8(0))
	f.Add([]byte("data: {\"usage\":\n\ndata: [DONE]\n\n"), uint8(5))
	f.Add([]byte(`{"model":"a\ud83d\ude00\ud83d\ud83dx\udc00","usage":{"input_tokens":1}}`), uint8(0))

	f.Fuzz(func(t *testing.T, body []byte, mode uint8) {
		format := meter.Format(mode%3 + 1)
		ct := json
		if mode&4 != 0 {
			ct = sse
		}
		got := meterChunks(format, ct, body)

		// The verdict holds together.
		if got.Metered != (got.Reason == "") || got.Metered != (got.Detail == "") {
			t.Fatalf("Metered %v with reason %q, detail %q", got.Metered, got.Reason, got.Detail)
		}
		if got.InputTokens < 0 || got.OutputTokens < 0 || got.CacheReadTokens < 0 || got.CacheWriteTokens < 0 {
			t.Fatalf("a negative count: %+v", got)
		}

		// However the body is split into writes, the result is the same.
		third := len(body) / 3
		if diff := cmp.Diff(got, meterChunks(format, ct, body[:third], body[third:2*third], body[2*third:])); diff != "" {
			t.Fatalf("split in three (-whole +split):\n%s", diff)
		}
		if len(body) <= 4096 {
			ones := make([][]byte, len(body))
			for i := range body {
				ones[i] = body[i : i+1]
			}
			if diff := cmp.Diff(got, meterChunks(format, ct, ones...)); diff != "" {
				t.Fatalf("1-byte writes (-whole +split):\n%s", diff)
			}
		}

		want, ok := reference(format, ct == sse, body)
		if !ok {
			return // the reference cannot judge this body (see reference)
		}
		got.Detail = ""
		if !got.Metered {
			got.Model, got.InputTokens, got.OutputTokens, got.CacheReadTokens, got.CacheWriteTokens = "", 0, 0, 0, 0
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("meter and reference differ (-reference +meter):\n%s", diff)
		}
	})
}

// refSpec is where a format states usage, as the package doc describes it. Of two paths that
// fill one field in the same document, the later in the list wins.
type refSpec struct {
	counts   [][2]string // path, field ("in", "out", "read", "write")
	model    []string
	typ      bool // the top-level "type" may end the stream
	terminal []string
	chat     bool
}

func refSpecFor(f meter.Format, stream bool) refSpec {
	switch {
	case f == meter.AnthropicMessages && !stream:
		return refSpec{model: []string{"model"}, counts: [][2]string{
			{"usage.input_tokens", "in"}, {"usage.output_tokens", "out"},
			{"usage.cache_read_input_tokens", "read"}, {"usage.cache_creation_input_tokens", "write"}}}
	case f == meter.AnthropicMessages:
		return refSpec{model: []string{"message.model"}, typ: true, terminal: []string{"message_stop"}, counts: [][2]string{
			{"message.usage.input_tokens", "in"}, {"message.usage.output_tokens", "out"},
			{"message.usage.cache_read_input_tokens", "read"}, {"message.usage.cache_creation_input_tokens", "write"},
			{"usage.input_tokens", "in"}, {"usage.output_tokens", "out"},
			{"usage.cache_read_input_tokens", "read"}, {"usage.cache_creation_input_tokens", "write"}}}
	case f == meter.OpenAIChatCompletions:
		return refSpec{model: []string{"model"}, chat: true, counts: [][2]string{
			{"usage.prompt_tokens", "in"}, {"usage.completion_tokens", "out"}, {"usage.prompt_tokens_details.cached_tokens", "read"}}}
	case !stream:
		return refSpec{model: []string{"model"}, counts: [][2]string{
			{"usage.input_tokens", "in"}, {"usage.output_tokens", "out"}, {"usage.input_tokens_details.cached_tokens", "read"}}}
	default:
		return refSpec{model: []string{"response.model"}, typ: true, terminal: []string{"response.completed", "response.incomplete", "response.failed"},
			counts: [][2]string{{"response.usage.input_tokens", "in"}, {"response.usage.output_tokens", "out"},
				{"response.usage.input_tokens_details.cached_tokens", "read"}}}
	}
}

type refState struct {
	spec     refSpec
	counts   map[string]int64
	model    string
	complete bool
	fault    meter.Reason
}

// reference meters body the plain way. ok is false for bodies it cannot judge like the meter
// would: a document with a key twice or two keys differing only in case anywhere (the meter
// refuses duplicates only where usage lives, and matches keys by case), and an invalid
// document nested deeper than the meter validates.
func reference(f meter.Format, stream bool, body []byte) (meter.Usage, bool) {
	r := &refState{spec: refSpecFor(f, stream), counts: map[string]int64{}}
	u := meter.Usage{Format: f, Stream: stream}
	if !stream {
		if strings.Trim(string(body), " \t\r\n") == "" {
			u.Reason = meter.ReasonNoUsage
			return u, true
		}
		if refTruncated(body) {
			if hasDuplicateKey(body) {
				return u, false // the meter may refuse it before its end
			}
			u.Reason = meter.ReasonTruncated
			return u, true
		}
		if !r.document(body) {
			return u, false
		}
		r.complete = r.fault == ""
	} else {
		for _, data := range refEvents(body) {
			if r.fault != "" {
				break
			}
			switch {
			case data == "[DONE]":
				r.complete = r.complete || r.spec.chat
			case strings.Trim(data, " \t\r\n") == "":
			default:
				if !r.document([]byte(data)) {
					return u, false
				}
			}
		}
	}
	u.Complete = r.complete
	in, read := r.counts["in"], r.counts["read"]
	if f != meter.AnthropicMessages {
		in -= read
	}
	switch {
	case r.fault != "":
		u.Reason = r.fault
	case len(r.counts) == 0 && !r.complete:
		u.Reason = meter.ReasonTruncated
	case len(r.counts) == 0:
		u.Reason = meter.ReasonNoUsage
	case in < 0:
		u.Reason = meter.ReasonInconsistent
	default:
		u.Metered, u.Model = true, r.model
		u.InputTokens, u.OutputTokens, u.CacheReadTokens, u.CacheWriteTokens = in, r.counts["out"], read, r.counts["write"]
	}
	return u, true
}

// document merges one document; false when the reference cannot judge it.
func (r *refState) document(data []byte) bool {
	if err := strictjson.CheckKeys(data, ""); err != nil {
		if errors.Is(err, strictjson.ErrMalformed) && bytes.Count(data, []byte("{"))+bytes.Count(data, []byte("[")) <= 32 {
			r.fault = meter.ReasonMalformed
			return true
		}
		return false
	}
	dec := encjson.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		panic("strictjson accepted what encoding/json refuses: " + err.Error())
	}
	lookup := func(path string) any {
		v := doc
		for _, k := range strings.Split(path, ".") {
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		}
		return v
	}
	counts := map[string]int64{}
	for _, c := range r.spec.counts {
		switch v := lookup(c[0]).(type) {
		case nil:
		case encjson.Number:
			n, ok := refCount(string(v))
			if !ok {
				r.fault = meter.ReasonBadValue
				return true
			}
			counts[c[1]] = n
		default:
			r.fault = meter.ReasonBadValue
			return true
		}
	}
	for k, n := range counts {
		r.counts[k] = n
	}
	for _, p := range r.spec.model {
		if s, ok := lookup(p).(string); ok && refModel(s) {
			r.model = s
		}
	}
	if r.spec.typ {
		if s, ok := lookup("type").(string); ok {
			for _, term := range r.spec.terminal {
				r.complete = r.complete || s == term
			}
		}
	}
	return true
}

func refCount(s string) (int64, bool) {
	digits := strings.TrimPrefix(s, "-")
	if strings.ContainsAny(digits, ".eE") || len(digits) > 16 {
		return 0, false
	}
	var n int64
	for _, c := range digits {
		n = n*10 + int64(c-'0')
	}
	if n > 1<<53 || (n != 0 && digits != s) {
		return 0, false
	}
	return n, true
}

func refModel(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// refEvents is the data of every event an event stream dispatches, by the WHATWG algorithm
// applied to the whole stream at once.
func refEvents(b []byte) []string {
	b = bytes.TrimPrefix(b, []byte("\xEF\xBB\xBF"))
	var lines []string
	start := 0
	for i := 0; i < len(b); i++ {
		if b[i] == '\n' || b[i] == '\r' {
			lines = append(lines, string(b[start:i]))
			if b[i] == '\r' && i+1 < len(b) && b[i+1] == '\n' {
				i++
			}
			start = i + 1
		}
	}
	// b[start:] is a line the stream ended inside: it cannot complete an event.
	var events []string
	var data strings.Builder
	hasData := false
	for _, line := range lines {
		switch {
		case line == "":
			if hasData {
				events = append(events, strings.TrimSuffix(data.String(), "\n"))
			}
			data.Reset()
			hasData = false
		case line[0] == ':':
		default:
			name, value, found := strings.Cut(line, ":")
			if found {
				value = strings.TrimPrefix(value, " ")
			}
			if name == "data" {
				data.WriteString(value)
				data.WriteByte('\n')
				hasData = true
			}
		}
	}
	return events
}

// FuzzIncludeUsage feeds IncludeUsage request bodies as an agent could write them.
func FuzzIncludeUsage(f *testing.F) {
	for _, s := range []string{
		`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		`{"stream":true,"stream_options":null}`,
		`{"stream":true,"stream_options":{"include_usage":false,"x":[1,{"include_usage":true}]}}`,
		`{"stream":true,"stream_options":{ }}`,
		`{"stream":false,"stream":true}`,
		`{"str\u0065am":true}`,
		` {"stream" : true } `,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		orig := bytes.Clone(body)
		out, changed, err := meter.IncludeUsage(body)
		if !bytes.Equal(body, orig) {
			t.Fatal("IncludeUsage modified its argument")
		}
		if err != nil {
			var re *meter.RequestError
			if !errors.As(err, &re) {
				t.Fatalf("error %v is not a *RequestError", err)
			}
			return
		}
		if !changed {
			if !bytes.Equal(out, body) {
				t.Fatal("unchanged, but the body returned differs")
			}
			// Unchanged means the upstream will not stream, or will state usage. Keys are
			// matched exactly, as the upstream does (a struct would take "STREAM" too).
			var req, opts map[string]encjson.RawMessage
			if err := encjson.Unmarshal(body, &req); err != nil {
				t.Fatalf("accepted a body encoding/json refuses: %v", err)
			}
			_ = encjson.Unmarshal(req["stream_options"], &opts)
			if string(req["stream"]) == "true" && string(opts["include_usage"]) != "true" {
				t.Fatalf("a streaming request without include_usage was left unchanged")
			}
			return
		}
		checkIncludesUsage(t, body, out)
	})
}

// refTruncated reports whether encoding/json finds body cut short: valid as far as it goes.
// encoding/json ends its input with a virtual space, so a body cut inside a literal or a number
// is an "invalid character ' '" one past its last byte.
func refTruncated(body []byte) bool {
	err := encjson.Unmarshal(body, new(any))
	var se *encjson.SyntaxError
	if !errors.As(err, &se) {
		return false
	}
	return strings.Contains(se.Error(), "unexpected end of JSON input") ||
		strings.HasPrefix(se.Error(), "invalid character ' '") && se.Offset == int64(len(body)) && body[len(body)-1] != ' '
}

// hasDuplicateKey reports whether an object in the JSON text data, complete or not, holds a key
// twice.
func hasDuplicateKey(data []byte) bool {
	type level struct {
		obj, wantKey bool
		keys         map[string]bool
	}
	var stack []*level
	afterValue := func() {
		if len(stack) > 0 && stack[len(stack)-1].obj {
			stack[len(stack)-1].wantKey = true
		}
	}
	dec := encjson.NewDecoder(bytes.NewReader(data))
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		if n := len(stack); n > 0 && stack[n-1].obj && stack[n-1].wantKey {
			if key, ok := tok.(string); ok {
				if stack[n-1].keys[key] {
					return true
				}
				stack[n-1].keys[key], stack[n-1].wantKey = true, false
				continue
			}
		}
		switch tok {
		case encjson.Delim('{'):
			stack = append(stack, &level{obj: true, wantKey: true, keys: map[string]bool{}})
		case encjson.Delim('['):
			stack = append(stack, &level{})
		case encjson.Delim('}'), encjson.Delim(']'):
			stack = stack[:len(stack)-1]
			afterValue()
		default:
			afterValue()
		}
	}
}

// TestReferenceJudgesFixtures keeps the fuzz reference honest: it must judge every fixture, and
// judge it as the hand-worked expectations do.
func TestReferenceJudgesFixtures(t *testing.T) {
	for _, fx := range fixtures {
		want := fx.want
		want.Detail = ""
		if !want.Metered {
			want.Model = ""
		}
		got, ok := reference(fx.format, strings.HasSuffix(fx.file, ".sse"), fx.read(t))
		if !ok {
			t.Errorf("%s: the reference cannot judge it", fx.file)
			continue
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: reference (-want +got):\n%s", fx.file, diff)
		}
	}
}
