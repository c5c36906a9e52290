package meter_test

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/broker/meter"
)

const (
	sse  = "text/event-stream"
	json = "application/json"
)

// fixture is a response body under testdata, in the shape the API documents (see the package
// doc for the sources), with the usage it states worked out by hand from the file.
type fixture struct {
	file   string
	format meter.Format
	want   meter.Usage
}

func (f fixture) contentType() string {
	if strings.HasSuffix(f.file, ".sse") {
		return sse + "; charset=utf-8"
	}
	return json
}

var fixtures = []fixture{
	{
		file: "anthropic_stream.sse", format: meter.AnthropicMessages,
		// message_start: input 12, cache write 1893, cache read 14212, output 3; message_delta: output 87.
		want: meter.Usage{Format: meter.AnthropicMessages, Stream: true, Model: "claude-sonnet-4-5-20250929",
			InputTokens: 12, OutputTokens: 87, CacheReadTokens: 14212, CacheWriteTokens: 1893, Metered: true, Complete: true},
	},
	{
		file: "anthropic_stream_tools.sse", format: meter.AnthropicMessages,
		// Two message_deltas: the second restates input (9645) and output (402); iterations[]
		// and the tool input's "usage" (999999) are not usage.
		want: meter.Usage{Format: meter.AnthropicMessages, Stream: true, Model: "claude-opus-4-1-20250805",
			InputTokens: 9645, OutputTokens: 402, Metered: true, Complete: true},
	},
	{
		file: "anthropic_stream_overloaded.sse", format: meter.AnthropicMessages,
		want: meter.Usage{Format: meter.AnthropicMessages, Stream: true, Model: "claude-haiku-4-5-20251001",
			InputTokens: 2048, OutputTokens: 1, Metered: true, Complete: false},
	},
	{
		file: "anthropic_message.json", format: meter.AnthropicMessages,
		want: meter.Usage{Format: meter.AnthropicMessages, Model: "claude-opus-4-1-20250805",
			InputTokens: 2095, OutputTokens: 503, CacheReadTokens: 31337, Metered: true, Complete: true},
	},
	{
		file: "anthropic_error.json", format: meter.AnthropicMessages,
		want: meter.Usage{Format: meter.AnthropicMessages, Complete: true, Reason: meter.ReasonNoUsage, Detail: "the body states no usage"},
	},
	{
		file: "openai_chat_stream.sse", format: meter.OpenAIChatCompletions,
		// prompt_tokens 1117 include cached_tokens 1024.
		want: meter.Usage{Format: meter.OpenAIChatCompletions, Stream: true, Model: "gpt-4o-2024-08-06",
			InputTokens: 93, OutputTokens: 46, CacheReadTokens: 1024, Metered: true, Complete: true},
	},
	{
		file: "openai_chat_stream_nousage.sse", format: meter.OpenAIChatCompletions,
		want: meter.Usage{Format: meter.OpenAIChatCompletions, Stream: true, Model: "gpt-4o-2024-08-06", Complete: true,
			Reason: meter.ReasonNoUsage, Detail: "the stream stated no usage: the request did not set stream_options.include_usage (see IncludeUsage)"},
	},
	{
		file: "openai_chat.json", format: meter.OpenAIChatCompletions,
		want: meter.Usage{Format: meter.OpenAIChatCompletions, Model: "gpt-4.1-2025-04-14",
			InputTokens: 370, OutputTokens: 37, CacheReadTokens: 4864, Metered: true, Complete: true},
	},
	{
		file: "openai_responses_stream.sse", format: meter.OpenAIResponses,
		want: meter.Usage{Format: meter.OpenAIResponses, Stream: true, Model: "gpt-5-codex",
			InputTokens: 1249, OutputTokens: 612, CacheReadTokens: 3072, Metered: true, Complete: true},
	},
	{
		file: "openai_responses_incomplete.sse", format: meter.OpenAIResponses,
		want: meter.Usage{Format: meter.OpenAIResponses, Stream: true, Model: "gpt-5-codex",
			InputTokens: 250, OutputTokens: 64, Metered: true, Complete: true},
	},
	{
		file: "openai_responses.json", format: meter.OpenAIResponses,
		want: meter.Usage{Format: meter.OpenAIResponses, Model: "gpt-5-2025-08-07",
			InputTokens: 270, OutputTokens: 91, CacheReadTokens: 1536, Metered: true, Complete: true},
	},
}

func (f fixture) read(t testing.TB) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", f.file))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func header(contentType string) http.Header {
	return http.Header{"Content-Type": {contentType}}
}

// meterChunks writes chunks to a fresh meter and returns its result.
func meterChunks(format meter.Format, contentType string, chunks ...[]byte) meter.Usage {
	m := meter.New(format, header(contentType))
	for _, c := range chunks {
		if n, err := m.Write(c); n != len(c) || err != nil {
			panic("Write did not take every byte")
		}
	}
	return m.Result()
}

func TestRecordedResponses(t *testing.T) {
	for _, f := range fixtures {
		t.Run(f.file, func(t *testing.T) {
			got := meterChunks(f.format, f.contentType(), f.read(t))
			if diff := cmp.Diff(f.want, got); diff != "" {
				t.Errorf("usage (-want +got):\n%s", diff)
			}
			t.Logf("%-32s in=%d out=%d cache_read=%d cache_write=%d metered=%v complete=%v reason=%q",
				f.file, got.InputTokens, got.OutputTokens, got.CacheReadTokens, got.CacheWriteTokens, got.Metered, got.Complete, got.Reason)
		})
	}
}

// TestRecordedLineEndings: the SSE standard allows CRLF, LF or CR line ends and one leading BOM;
// each must meter the same.
func TestRecordedLineEndings(t *testing.T) {
	variants := map[string]func([]byte) []byte{
		"crlf": func(b []byte) []byte { return bytes.ReplaceAll(b, []byte("\n"), []byte("\r\n")) },
		"cr":   func(b []byte) []byte { return bytes.ReplaceAll(b, []byte("\n"), []byte("\r")) },
		"bom":  func(b []byte) []byte { return append([]byte("\xEF\xBB\xBF"), b...) },
		"mixed": func(b []byte) []byte {
			ends := []string{"\n", "\r\n", "\r"}
			var out []byte
			for i, line := range bytes.Split(b, []byte("\n")) {
				if i > 0 {
					end := ends[i%3]
					if bytes.HasSuffix(out, []byte("\r")) && end == "\n" {
						end = "\r\n" // CR then LF would be one line end, not two
					}
					out = append(out, end...)
				}
				out = append(out, line...)
			}
			return out
		},
	}
	for _, f := range fixtures {
		if !strings.HasSuffix(f.file, ".sse") {
			continue
		}
		for name, conv := range variants {
			t.Run(f.file+"/"+name, func(t *testing.T) {
				b := conv(f.read(t))
				got := meterChunks(f.format, f.contentType(), b)
				if diff := cmp.Diff(f.want, got); diff != "" {
					t.Errorf("usage (-want +got):\n%s", diff)
				}
				// A CR at the end of one write and its LF at the start of the next are one line end.
				for i := range b {
					if b[i] == '\r' && i+1 < len(b) && b[i+1] == '\n' {
						if diff := cmp.Diff(f.want, meterChunks(f.format, f.contentType(), b[:i+1], b[i+1:])); diff != "" {
							t.Fatalf("split between CR and LF at %d (-want +got):\n%s", i, diff)
						}
					}
				}
			})
		}
	}
}

// TestEverySplit writes each fixture in two writes at every split point, in 1-byte writes, and
// in random writes: events and JSON values split across writes must meter as if whole.
func TestEverySplit(t *testing.T) {
	rng := rand.New(rand.NewPCG(27, 1))
	for _, f := range fixtures {
		t.Run(f.file, func(t *testing.T) {
			b := f.read(t)
			for k := 0; k <= len(b); k++ {
				if diff := cmp.Diff(f.want, meterChunks(f.format, f.contentType(), b[:k], b[k:])); diff != "" {
					t.Fatalf("split at %d of %d (-want +got):\n%s", k, len(b), diff)
				}
			}
			ones := make([][]byte, len(b))
			for i := range b {
				ones[i] = b[i : i+1]
			}
			if diff := cmp.Diff(f.want, meterChunks(f.format, f.contentType(), ones...)); diff != "" {
				t.Fatalf("1-byte writes (-want +got):\n%s", diff)
			}
			for range 50 {
				var chunks [][]byte
				for rest := b; len(rest) > 0; {
					n := min(len(rest), 1+rng.IntN(64))
					chunks, rest = append(chunks, rest[:n]), rest[n:]
				}
				if diff := cmp.Diff(f.want, meterChunks(f.format, f.contentType(), chunks...)); diff != "" {
					t.Fatalf("random writes (-want +got):\n%s", diff)
				}
			}
			t.Logf("%-32s bytes=%d splits=%d", f.file, len(b), len(b)+1)
		})
	}
}

// TestBodyPassesBytesThrough reads each fixture through Body with readers that return short
// reads and data with EOF: the bytes must come out identical, Write must leave its argument as
// it was, and done must be called exactly once with the fixture's usage.
func TestBodyPassesBytesThrough(t *testing.T) {
	readers := map[string]func(io.Reader) io.Reader{
		"whole":    func(r io.Reader) io.Reader { return r },
		"one-byte": iotest.OneByteReader,
		"half":     iotest.HalfReader,
		"data-err": iotest.DataErrReader,
	}
	for _, f := range fixtures {
		for name, wrap := range readers {
			t.Run(f.file+"/"+name, func(t *testing.T) {
				b := f.read(t)
				var calls []meter.Usage
				body := meter.Body(io.NopCloser(wrap(bytes.NewReader(b))), meter.New(f.format, header(f.contentType())),
					func(u meter.Usage) { calls = append(calls, u) })
				var out bytes.Buffer
				if _, err := io.Copy(&out, body); err != nil {
					t.Fatal(err)
				}
				if err := body.Close(); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(out.Bytes(), b) {
					t.Fatalf("the bytes read differ from the body's (%d vs %d bytes)", out.Len(), len(b))
				}
				if len(calls) != 1 {
					t.Fatalf("done called %d times, want 1", len(calls))
				}
				if diff := cmp.Diff(f.want, calls[0]); diff != "" {
					t.Errorf("usage (-want +got):\n%s", diff)
				}
			})
		}
	}
	t.Run("write leaves its argument alone", func(t *testing.T) {
		for _, f := range fixtures {
			b := f.read(t)
			orig := bytes.Clone(b)
			m := meter.New(f.format, header(f.contentType()))
			for i := 0; i < len(b); i += 7 {
				_, _ = m.Write(b[i:min(i+7, len(b))])
			}
			if !bytes.Equal(b, orig) {
				t.Fatalf("%s: Write modified its argument", f.file)
			}
		}
	})
}

// TestBodyAbandoned: the agent going away closes the body before EOF; done reports what was
// read (a stream cut short), once, however often Close is called.
func TestBodyAbandoned(t *testing.T) {
	f := fixtures[0]
	b := f.read(t)
	cut := bytes.Index(b, []byte("event: message_delta"))
	calls := 0
	var got meter.Usage
	body := meter.Body(io.NopCloser(bytes.NewReader(b)), meter.New(f.format, header(sse)), func(u meter.Usage) { calls++; got = u })
	if _, err := io.CopyN(io.Discard, body, int64(cut)); err != nil {
		t.Fatal(err)
	}
	_ = body.Close()
	_ = body.Close()
	want := meter.Usage{Format: meter.AnthropicMessages, Stream: true, Model: "claude-sonnet-4-5-20250929",
		InputTokens: 12, OutputTokens: 3, CacheReadTokens: 14212, CacheWriteTokens: 1893, Metered: true}
	if diff := cmp.Diff(want, got); diff != "" || calls != 1 {
		t.Errorf("done called %d times; usage (-want +got):\n%s", calls, diff)
	}
	// The upstream going away is a read error: done is called then, not at Close.
	calls = 0
	body = meter.Body(io.NopCloser(io.MultiReader(bytes.NewReader(b[:cut]), iotest.ErrReader(io.ErrUnexpectedEOF))),
		meter.New(f.format, header(sse)), func(u meter.Usage) { calls++; got = u })
	if _, err := io.Copy(io.Discard, body); err == nil {
		t.Fatal("copy succeeded, want the upstream's error")
	}
	if calls != 1 || got.Complete || !got.Metered {
		t.Errorf("after a read error: done called %d times with %+v", calls, got)
	}
	_ = body.Close()
	if calls != 1 {
		t.Errorf("Close after the read error called done again")
	}
}

func TestFormatOf(t *testing.T) {
	tests := []struct {
		path string
		want meter.Format
	}{
		{"/v1/messages", meter.AnthropicMessages},
		{"v1/messages", meter.AnthropicMessages},
		{"/v1/messages/", meter.AnthropicMessages},
		{"/v1//messages", meter.AnthropicMessages},
		{"/v1/./messages", meter.AnthropicMessages},
		{"/v1/x/../messages", meter.AnthropicMessages},
		{"/v1/chat/completions", meter.OpenAIChatCompletions},
		{"/v1/responses", meter.OpenAIResponses},
		{"/v1/messages/count_tokens", meter.FormatNone},
		{"/v1/messages/batches", meter.FormatNone},
		{"/V1/messages", meter.FormatNone},
		{"/v1/models", meter.FormatNone},
		{"", meter.FormatNone},
	}
	for _, tc := range tests {
		if got := meter.FormatOf(tc.path); got != tc.want {
			t.Errorf("FormatOf(%q) = %v, want %v", tc.path, got, tc.want)
		}
	}
}

// TestUnmeteredResponses: responses the meter does not read say why before reading a byte.
func TestUnmeteredResponses(t *testing.T) {
	b := fixtures[0].read(t)
	tests := []struct {
		name   string
		format meter.Format
		header http.Header
		want   meter.Reason
	}{
		{"path", meter.FormatNone, header(sse), meter.ReasonPath},
		{"gzip", meter.AnthropicMessages, http.Header{"Content-Type": {sse}, "Content-Encoding": {"gzip"}}, meter.ReasonEncoded},
		{"br after identity", meter.AnthropicMessages, http.Header{"Content-Type": {sse}, "Content-Encoding": {"identity", "br"}}, meter.ReasonEncoded},
		{"list", meter.AnthropicMessages, http.Header{"Content-Type": {sse}, "Content-Encoding": {"identity, gzip"}}, meter.ReasonEncoded},
		{"html", meter.AnthropicMessages, header("text/html; charset=utf-8"), meter.ReasonContentType},
		{"no content type", meter.AnthropicMessages, http.Header{}, meter.ReasonContentType},
		{"unparsable content type", meter.AnthropicMessages, header("text/event-stream; ;"), meter.ReasonContentType},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := meter.New(tc.format, tc.header)
			_, _ = m.Write(b)
			got := m.Result()
			if got.Metered || got.Reason != tc.want || got.Detail == "" {
				t.Errorf("Result = %+v, want unmetered %q with a detail", got, tc.want)
			}
		})
	}
	t.Run("identity is read", func(t *testing.T) {
		m := meter.New(meter.AnthropicMessages, http.Header{"Content-Type": {sse}, "Content-Encoding": {"Identity"}})
		_, _ = m.Write(b)
		if got := m.Result(); !got.Metered {
			t.Errorf("Result = %+v, want metered", got)
		}
	})
	t.Run("ForResponse reads the request's path", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPost, "https://api.anthropic.com/v1/messages?beta=true", nil)
		m := meter.ForResponse(&http.Response{Request: req, Header: header(sse)})
		_, _ = m.Write(b)
		if got := m.Result(); !got.Metered || got.Format != meter.AnthropicMessages {
			t.Errorf("Result = %+v, want metered anthropic", got)
		}
		if got := meter.ForResponse(&http.Response{Header: header(sse)}).Result(); got.Reason != meter.ReasonPath {
			t.Errorf("without a request: Result = %+v, want reason path", got)
		}
	})
}

// TestHostileResponses: the upstream's bytes are untrusted like everything else. Each case
// must end in a clear verdict, never a panic or a guess.
func TestHostileResponses(t *testing.T) {
	const a, c, r = meter.AnthropicMessages, meter.OpenAIChatCompletions, meter.OpenAIResponses
	start := `event: message_start` + "\n" + `data: {"type":"message_start","message":{"model":"m","usage":{"input_tokens":10,"output_tokens":1}}}` + "\n\n"
	tests := []struct {
		name        string
		format      meter.Format
		contentType string
		body        string
		want        meter.Usage // Detail is checked for wantDetail only
		wantDetail  string
	}{
		{
			name: "usage split over data lines", format: a, contentType: sse,
			body: "data: {\"type\":\"message_start\",\ndata: \"message\":{\"usage\":\n:a comment between\ndata: {\"input_tokens\":7,\"output_tokens\":2}}}\n\n",
			want: meter.Usage{InputTokens: 7, OutputTokens: 2, Metered: true},
		},
		{
			name: "escaped keys are the keys they spell", format: a, contentType: json,
			body: `{"\u0075sage":{"output\u005ftokens":5,"input_tokens":3},"mod\u0065l":"claude-\u0078"}`,
			want: meter.Usage{InputTokens: 3, OutputTokens: 5, Model: "claude-x", Metered: true, Complete: true},
		},
		{
			name: "a dotted key is not a path", format: a, contentType: json,
			body: `{"usage.output_tokens":5,"usage":{"input_tokens":3}}`,
			want: meter.Usage{InputTokens: 3, Metered: true, Complete: true},
		},
		{
			name: "keys match by case", format: a, contentType: json,
			body: `{"Usage":{"output_tokens":5},"usage":{"Output_Tokens":6,"output_tokens":4}}`,
			want: meter.Usage{OutputTokens: 4, Metered: true, Complete: true},
		},
		{
			name: "usage in arrays is not usage", format: a, contentType: json,
			body: `{"content":[{"usage":{"output_tokens":9}}],"usage":[{"output_tokens":9}]}`,
			want: meter.Usage{Complete: true, Reason: meter.ReasonNoUsage},
		},
		{
			name: "nulls state nothing", format: a, contentType: sse,
			body: start + `data: {"type":"message_delta","usage":{"input_tokens":null,"output_tokens":40}}` + "\n\n",
			want: meter.Usage{Model: "m", InputTokens: 10, OutputTokens: 40, Metered: true},
		},
		{
			name: "-0 is 0", format: a, contentType: json,
			body: `{"usage":{"output_tokens":-0,"input_tokens":0}}`,
			want: meter.Usage{Metered: true, Complete: true},
		},
		{
			name: "2^53 is the largest count", format: a, contentType: json,
			body: `{"usage":{"output_tokens":9007199254740992}}`,
			want: meter.Usage{OutputTokens: 1 << 53, Metered: true, Complete: true},
		},
		{
			name: "negative count", format: a, contentType: sse,
			body: start + `data: {"type":"message_delta","usage":{"output_tokens":-3}}` + "\n\n",
			want: meter.Usage{Model: "m", InputTokens: 10, OutputTokens: 1, Reason: meter.ReasonBadValue}, wantDetail: "event 2: usage.output_tokens is negative",
		},
		{
			name: "fractional count", format: c, contentType: json,
			body: `{"usage":{"prompt_tokens":10.5,"completion_tokens":1}}`,
			want: meter.Usage{Reason: meter.ReasonBadValue}, wantDetail: "the body: usage.prompt_tokens is not an integer",
		},
		{
			name: "exponent count", format: c, contentType: json,
			body: `{"usage":{"prompt_tokens":1e3}}`,
			want: meter.Usage{Reason: meter.ReasonBadValue}, wantDetail: "not an integer",
		},
		{
			name: "count over 2^53", format: r, contentType: json,
			body: `{"usage":{"input_tokens":9007199254740993}}`,
			want: meter.Usage{Reason: meter.ReasonBadValue}, wantDetail: "larger than 2^53",
		},
		{
			name: "count of 100 digits", format: r, contentType: json,
			body: `{"usage":{"input_tokens":` + strings.Repeat("9", 100) + `}}`,
			want: meter.Usage{Reason: meter.ReasonBadValue}, wantDetail: "larger than 2^53",
		},
		{
			name: "string count", format: a, contentType: json,
			body: `{"usage":{"output_tokens":"12"}}`,
			want: meter.Usage{Reason: meter.ReasonBadValue}, wantDetail: "usage.output_tokens is a string",
		},
		{
			name: "object count", format: a, contentType: json,
			body: `{"usage":{"output_tokens":{"n":12}}}`,
			want: meter.Usage{Reason: meter.ReasonBadValue}, wantDetail: "is an object or array",
		},
		{
			name: "boolean count", format: a, contentType: json,
			body: `{"usage":{"output_tokens":true}}`,
			want: meter.Usage{Reason: meter.ReasonBadValue}, wantDetail: "is a boolean",
		},
		{
			name: "usage stated twice in one document", format: a, contentType: json,
			body: `{"usage":{"output_tokens":5},"usage":{"output_tokens":1}}`,
			want: meter.Usage{Reason: meter.ReasonMalformed}, wantDetail: "the key usage is stated twice",
		},
		{
			name: "a count stated twice in one document", format: c, contentType: sse,
			body: `data: {"usage":{"prompt_tokens":5,"prompt_tokens":1}}` + "\n\n",
			want: meter.Usage{Reason: meter.ReasonMalformed}, wantDetail: "usage.prompt_tokens is stated twice",
		},
		{
			name: "cached tokens exceed input", format: c, contentType: json,
			body: `{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":6}}}`,
			want: meter.Usage{OutputTokens: 1, CacheReadTokens: 6, Complete: true, Reason: meter.ReasonInconsistent},
		},
		{
			name: "event data that is not JSON", format: a, contentType: sse,
			body: start + "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":40}\x01}\n\n",
			want: meter.Usage{Model: "m", InputTokens: 10, OutputTokens: 1, Reason: meter.ReasonMalformed}, wantDetail: "the data of event 2 is not valid JSON: unexpected byte 0x01 after a value at byte 52",
		},
		{
			name: "event data cut inside its value", format: a, contentType: sse,
			body: start + "data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":40}\n\n",
			want: meter.Usage{Model: "m", InputTokens: 10, OutputTokens: 1, Reason: meter.ReasonMalformed}, wantDetail: "event 2 is not valid JSON: it ends inside its value",
		},
		{
			name: "two values in one event", format: a, contentType: sse,
			body: start + "data: {}\ndata: {}\n\n",
			want: meter.Usage{Model: "m", InputTokens: 10, OutputTokens: 1, Reason: meter.ReasonMalformed}, wantDetail: "after the JSON value",
		},
		{
			name: "nothing after a fault is read", format: a, contentType: sse,
			body: start + "data: nonsense\n\n" + `data: {"type":"message_delta","usage":{"output_tokens":40}}` + "\n\n",
			want: meter.Usage{Model: "m", InputTokens: 10, OutputTokens: 1, Reason: meter.ReasonMalformed},
		},
		{
			name: "an event the stream ends inside is not read", format: a, contentType: sse,
			body: start + `data: {"type":"message_delta","usage":{"output_tokens":40}}` + "\n",
			want: meter.Usage{Model: "m", InputTokens: 10, OutputTokens: 1, Metered: true},
		},
		{
			name: "empty and blank data, comments, unknown fields and data without a colon", format: a, contentType: sse,
			body: ": keep-alive\n\ndata:\n\ndata:   \n\ndata\n\nretry: 100\nid: 7\nevent: x\nfoo: bar\n\n" + start,
			want: meter.Usage{Model: "m", InputTokens: 10, OutputTokens: 1, Metered: true},
		},
		{
			name: "datum is not data", format: a, contentType: sse,
			body: `datum: {"type":"message_start","message":{"usage":{"input_tokens":10}}}` + "\n\n" +
				`Data: {"type":"message_start","message":{"usage":{"input_tokens":10}}}` + "\n\n",
			want: meter.Usage{Reason: meter.ReasonTruncated},
		},
		{
			name: "no space after the colon", format: a, contentType: sse,
			body: `data:{"type":"message_start","message":{"usage":{"input_tokens":10}}}` + "\n\n",
			want: meter.Usage{InputTokens: 10, Metered: true},
		},
		{
			name: "a partial BOM spoils only the first line", format: a, contentType: sse,
			body: "\xEF\xBBdata: {\"usage\":{\"output_tokens\":99}}\n\n" + start,
			want: meter.Usage{Model: "m", InputTokens: 10, OutputTokens: 1, Metered: true},
		},
		{
			name: "a model that is not a label is dropped", format: a, contentType: json,
			body: `{"model":"claude sonnet\n","usage":{"output_tokens":1}}`,
			want: meter.Usage{OutputTokens: 1, Metered: true, Complete: true},
		},
		{
			name: "a model that is too long is dropped", format: a, contentType: json,
			body: `{"model":"` + strings.Repeat("m", 129) + `","usage":{"output_tokens":1}}`,
			want: meter.Usage{OutputTokens: 1, Metered: true, Complete: true},
		},
		{
			name: "a model of 128 characters is kept", format: a, contentType: json,
			body: `{"model":"` + strings.Repeat("m", 128) + `","usage":{"output_tokens":1}}`,
			want: meter.Usage{Model: strings.Repeat("m", 128), OutputTokens: 1, Metered: true, Complete: true},
		},
		{
			name: "surrogate pairs and lone surrogates", format: a, contentType: json,
			body: `{"model":"a\ud83d\ude00b\ud83dc","usage":{"output_tokens":1}}`,
			want: meter.Usage{OutputTokens: 1, Metered: true, Complete: true},
		},
		{
			name: "usage nested deeper than the scanner tracks", format: a, contentType: json,
			body: `{"content":[{"input":` + strings.Repeat(`{"a":[`, 5000) + `"}]\"{["` + strings.Repeat(`]}`, 5000) + `}],"usage":{"output_tokens":8}}`,
			want: meter.Usage{OutputTokens: 8, Metered: true, Complete: true},
		},
		{
			name: "a long key near usage", format: a, contentType: json,
			body: `{"usage":{"` + strings.Repeat("k", 1000) + `":1,"output_tokens":8}}`,
			want: meter.Usage{OutputTokens: 8, Metered: true, Complete: true},
		},
		{
			name: "trailing garbage after the body", format: a, contentType: json,
			body: `{"usage":{"output_tokens":8}} x`,
			want: meter.Usage{Reason: meter.ReasonMalformed}, wantDetail: "the body is not valid JSON: unexpected 'x' after the JSON value at byte 30",
		},
		{
			name: "a control character in a string", format: a, contentType: json,
			body: "{\"id\":\"a\tb\",\"usage\":{\"output_tokens\":8}}",
			want: meter.Usage{Reason: meter.ReasonMalformed}, wantDetail: "a control character inside a string",
		},
		{
			name: "a body cut short", format: a, contentType: json,
			body: `{"usage":{"output_tokens":8}`,
			want: meter.Usage{Reason: meter.ReasonTruncated}, wantDetail: "the body ended after 28 bytes, inside its JSON value",
		},
		{
			name: "an empty body", format: a, contentType: json,
			body: " \n",
			want: meter.Usage{Reason: meter.ReasonNoUsage}, wantDetail: "the body is empty",
		},
		{
			name: "a stream that stated nothing and never ended", format: r, contentType: sse,
			body: `data: {"type":"response.created","response":{"usage":null}}` + "\n\n",
			want: meter.Usage{Reason: meter.ReasonTruncated}, wantDetail: "none of them stating usage",
		},
		{
			name: "[DONE] ends only a chat stream", format: r, contentType: sse,
			body: `data: {"type":"response.in_progress","response":{"usage":{"input_tokens":3}}}` + "\n\ndata: [DONE]\n\n",
			want: meter.Usage{InputTokens: 3, Metered: true},
		},
		{
			name: "[DONE] with a space after it is not [DONE]", format: c, contentType: sse,
			body: `data: {"usage":{"prompt_tokens":3}}` + "\n\ndata: [DONE] \n\n",
			want: meter.Usage{InputTokens: 3, Reason: meter.ReasonMalformed},
		},
		{
			name: "the last usage of a chat stream wins", format: c, contentType: sse,
			body: `data: {"usage":{"prompt_tokens":3,"completion_tokens":1}}` + "\n\n" + `data: {"usage":{"prompt_tokens":3,"completion_tokens":9},"model":"gpt"}` + "\n\n" + `data: {"usage":null}` + "\n\ndata: [DONE]\n\n",
			want: meter.Usage{Model: "gpt", InputTokens: 3, OutputTokens: 9, Metered: true, Complete: true},
		},
		{
			name: "a terminal type ends a responses stream whatever the event name", format: r, contentType: sse,
			body: "event: whatever\ndata: {\"response\":{\"usage\":{\"output_tokens\":2}},\"type\":\"response.failed\"}\n\n",
			want: meter.Usage{OutputTokens: 2, Metered: true, Complete: true},
		},
		{
			name: "a responses body's stream paths are not its paths", format: r, contentType: json,
			body: `{"response":{"usage":{"output_tokens":2}}}`,
			want: meter.Usage{Complete: true, Reason: meter.ReasonNoUsage},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			want := tc.want
			want.Format, want.Stream = tc.format, tc.contentType == sse
			b := []byte(tc.body)
			got := meterChunks(tc.format, tc.contentType, b)
			if !strings.Contains(got.Detail, tc.wantDetail) {
				t.Errorf("Detail = %q, want it to contain %q", got.Detail, tc.wantDetail)
			}
			if (got.Detail == "") != got.Metered {
				t.Errorf("Metered = %v with Detail %q", got.Metered, got.Detail)
			}
			got.Detail = ""
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("usage (-want +got):\n%s", diff)
			}
			for k := 0; k <= len(b); k += max(1, len(b)/200) {
				split := meterChunks(tc.format, tc.contentType, b[:k], b[k:])
				split.Detail = ""
				if diff := cmp.Diff(want, split); diff != "" {
					t.Fatalf("split at %d (-want +got):\n%s", k, diff)
				}
			}
		})
	}
}
