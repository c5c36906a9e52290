// Package meter reads the usage a model API states in its own responses, as the response
// streams through the credential broker to the agent (issue 27). What a company spends then
// comes from the upstream, not from the run's stdout, which the agent writes and can forge.
//
// A Meter is an io.Writer the broker tees the upstream's response bytes into (or wraps the
// response body with Body). It never alters the bytes, never fails a write, and never buffers
// the body: it parses server-sent events and JSON incrementally, byte by byte, and keeps only
// the handful of values it meters. Its memory is a fixed few KiB whatever the response's size,
// so a 50 MiB event or body is metered like a small one. That matters beyond memory: output the
// agent can ask for (a long completion, a generated image in base64, a deeply nested tool call)
// must not be a way to make a response unmetered, so no size or depth makes the meter give up.
//
// # Formats
//
// The format comes from the request's path (FormatOf), the encoding from the response's
// Content-Type (text/event-stream or application/json). The paths read, with the sources
// checked for each:
//
//   - Anthropic Messages (/v1/messages). The JSON body's top-level `usage` {input_tokens,
//     output_tokens, cache_creation_input_tokens, cache_read_input_tokens} and `model`. Streaming:
//     `message_start` carries message.usage and message.model; one or more `message_delta` carry
//     top-level `usage` whose counts are cumulative, not increments (platform.claude.com
//     build-with-claude/streaming: "The usage field in this event contains cumulative token
//     counts"; the SDKs' MessageDeltaUsage documents input_tokens, cache_creation_input_tokens
//     and cache_read_input_tokens there too, each "cumulative"; PostHog's python SDK 7.75.4 fixed
//     the summing of several deltas that server tools produce). So the last value stated for a
//     field wins; nested copies such as usage.iterations[] are never read. The stream ends with
//     `message_stop`.
//   - OpenAI Chat Completions (/v1/chat/completions). The JSON body's `usage` {prompt_tokens,
//     completion_tokens, prompt_tokens_details.cached_tokens} and `model`. Streaming: `data:`
//     chunks; only when the request set stream_options.include_usage does "an additional chunk
//     ... before the data: [DONE] message" carry usage "for the entire request", every other
//     chunk carrying usage null (OpenAI's OpenAPI spec, ChatCompletionStreamOptions). IncludeUsage
//     rewrites a request so it does. The last non-null usage wins (some compatible servers state
//     it on every chunk); `data: [DONE]` ends the stream.
//   - OpenAI Responses (/v1/responses). The JSON body's `usage` {input_tokens, output_tokens,
//     input_tokens_details.cached_tokens} and `model`. Streaming: typed events whose
//     `response` object carries usage (null until the end); the stream ends with
//     response.completed, response.incomplete or response.failed and has no [DONE] sentinel
//     (OpenAI's Responses streaming events, as the openai-interface crate models them).
//
// Usage is normalised so that one price list applies to every format: InputTokens are input
// tokens neither read from nor written to a prompt cache. Anthropic reports them that way
// ("Total input tokens in a request is the summation of input_tokens,
// cache_creation_input_tokens, and cache_read_input_tokens", Anthropic's SDK docs); OpenAI's
// prompt_tokens and input_tokens include the cached tokens, which are subtracted here.
//
// # Encoding
//
// The meter reads identity-encoded bodies only: the broker must send the upstream
// `Accept-Encoding: identity` (replacing whatever the agent's client asked for), since
// decompressing to meter would cost the broker a decoder per stream and brotli has no decoder in
// the standard library. A response that is encoded anyway is reported unmetered (ReasonEncoded).
//
// # What the broker does with the result
//
// A Usage with Metered false says why in Reason, a small fixed set fit for a metric label, and
// in Detail, a sentence for a log that never quotes the response. The meter does not decide
// what an unmetered response costs: a response on an unmetered path (ReasonPath, e.g.
// /v1/messages/batches, whose usage is billed out of band) or one that stated no usage is the
// broker's to refuse, count or charge, and it must, or the agent can spend through it.
package meter

import (
	"fmt"
	"mime"
	"net/http"
	"path"
	"strings"
)

// Format is the API whose responses a meter reads.
type Format uint8

// The formats the meter reads. FormatNone is a request the meter does not read usage from.
const (
	FormatNone Format = iota
	AnthropicMessages
	OpenAIChatCompletions
	OpenAIResponses
)

// String names the format as a metric label would.
func (f Format) String() string {
	switch f {
	case AnthropicMessages:
		return "anthropic_messages"
	case OpenAIChatCompletions:
		return "openai_chat_completions"
	case OpenAIResponses:
		return "openai_responses"
	}
	return "none"
}

// FormatOf picks the format from a request's URL path (r.URL.Path, already percent-decoded;
// the query, such as Claude Code's ?beta=true, is not part of it). The path is cleaned first so
// that /v1//messages/ and /v1/./messages, which an upstream may route like /v1/messages, are not
// a way around the meter. Every other path, /v1/messages/count_tokens included, is FormatNone.
func FormatOf(urlPath string) Format {
	switch path.Clean("/" + urlPath) {
	case "/v1/messages":
		return AnthropicMessages
	case "/v1/chat/completions":
		return OpenAIChatCompletions
	case "/v1/responses":
		return OpenAIResponses
	}
	return FormatNone
}

// Reason says why a response is not metered. The values are few and fixed so that they can
// label a metric (kubeclip_broker_unmetered_total{reason}); Usage.Detail has the particulars.
type Reason string

// Why a response is not metered.
const (
	// ReasonPath: the request's path is not one the meter reads (FormatNone).
	ReasonPath Reason = "path"
	// ReasonEncoded: the response has a Content-Encoding other than identity.
	ReasonEncoded Reason = "encoded"
	// ReasonContentType: the response is neither text/event-stream nor application/json.
	ReasonContentType Reason = "content_type"
	// ReasonMalformed: an event's data or the body is not valid JSON, or states a usage key
	// twice.
	ReasonMalformed Reason = "malformed"
	// ReasonBadValue: a usage count is not an integer between 0 and 2^53.
	ReasonBadValue Reason = "bad_value"
	// ReasonInconsistent: the counts contradict each other (more cached tokens than input).
	ReasonInconsistent Reason = "inconsistent"
	// ReasonTruncated: the body ended before its JSON was complete, or a stream ended before
	// any event that stated usage.
	ReasonTruncated Reason = "truncated"
	// ReasonNoUsage: the response ended properly but stated no usage (an error body, or a chat
	// completion streamed without stream_options.include_usage).
	ReasonNoUsage Reason = "no_usage"
)

// Usage is what a response stated about itself.
type Usage struct {
	Format Format
	// Stream is true for a text/event-stream response.
	Stream bool
	// Model is the model the upstream says answered; empty when it stated none or one that is
	// not 1 to 128 printable ASCII characters (the value may become a metric label).
	Model string
	// InputTokens are input tokens neither read from nor written to a prompt cache.
	InputTokens int64
	// OutputTokens include reasoning (thinking) tokens.
	OutputTokens int64
	// CacheReadTokens are input tokens read from a prompt cache.
	CacheReadTokens int64
	// CacheWriteTokens are input tokens written to a prompt cache (Anthropic only).
	CacheWriteTokens int64
	// Metered is true when the response stated usage and nothing in it stopped the meter.
	// When false, Reason and Detail say why, and the counts are those stated before the meter
	// stopped: a floor, possibly zero.
	Metered bool
	// Complete is true when the response reached its end: the JSON body's last byte, or the
	// stream's final event (message_stop, data: [DONE], response.completed/incomplete/failed).
	// A metered stream that is not complete was cut short; its counts are the last stated.
	Complete bool
	Reason   Reason
	// Detail is a sentence for a log: where the meter stopped and why. It names JSON paths
	// and byte offsets and never quotes the response.
	Detail string
}

// TotalTokens is every token the response states, cached or not.
func (u Usage) TotalTokens() int64 {
	return u.InputTokens + u.OutputTokens + u.CacheReadTokens + u.CacheWriteTokens
}

// maxModelLen bounds Usage.Model: model ids are short, and the value may become a label.
const maxModelLen = 128

// maxCount bounds a usage count: 2^53 is the largest integer every JSON implementation
// represents exactly, and it keeps the sum of four counts far from overflowing int64.
const maxCount = 1 << 53

// Meter meters one response. Write it every byte of the response body, in order; read
// Result at the end. A Meter is not safe for concurrent use (Body serialises its calls).
type Meter struct {
	format Format
	stream bool
	schema *schema

	// fault stops the meter: nothing more is read once it is set.
	fault  Reason
	detail string

	// What complete documents (the body, or each event's data) stated; the last value stated
	// for a field wins.
	count    [numCounts]int64
	stated   [numCounts]bool
	model    [maxModelLen]byte
	modelLen int
	complete bool

	offset int64 // body bytes written so far
	events int64 // events dispatched so far
	sse    sseReader
	doc    scanner
}

// New returns the meter for one response to a request of the given format. header is the
// response's header; its Content-Type and Content-Encoding decide how the body is read.
func New(format Format, header http.Header) *Meter {
	m := &Meter{format: format}
	if format == FormatNone {
		m.stop(ReasonPath, "the request's path is not a metered endpoint")
		return m
	}
	for _, v := range header.Values("Content-Encoding") {
		for _, enc := range strings.Split(v, ",") {
			if enc = strings.TrimSpace(enc); enc != "" && !strings.EqualFold(enc, "identity") {
				m.stop(ReasonEncoded, "the response has Content-Encoding "+quoteToken(enc)+"; the broker must ask the upstream for identity")
				return m
			}
		}
	}
	media, _, err := mime.ParseMediaType(header.Get("Content-Type"))
	switch {
	case err != nil:
		m.stop(ReasonContentType, "the response has no parsable Content-Type")
		return m
	case media == "text/event-stream":
		m.stream = true
	case media == "application/json":
	default:
		m.stop(ReasonContentType, "the response's Content-Type is "+quoteToken(media)+", neither text/event-stream nor application/json")
		return m
	}
	m.schema = schemaFor(format, m.stream)
	m.doc.reset(m.schema)
	return m
}

// ForResponse is New for a response the broker's http.Transport returned, reading the format
// from resp.Request's path (FormatNone when the response has no request).
func ForResponse(resp *http.Response) *Meter {
	f := FormatNone
	if resp.Request != nil && resp.Request.URL != nil {
		f = FormatOf(resp.Request.URL.Path)
	}
	return New(f, resp.Header)
}

// quoteToken quotes a header token for Detail, bounded: header values come from the upstream.
func quoteToken(s string) string {
	if len(s) > 40 {
		s = s[:40] + "…"
	}
	return fmt.Sprintf("%q", s)
}

// Write reads p as the next bytes of the response body. It never modifies p and always
// returns len(p), nil, so that a tee into it can never break or alter what reaches the agent.
func (m *Meter) Write(p []byte) (int, error) {
	if m.fault == "" {
		if m.stream {
			m.writeSSE(p)
		} else {
			m.writeBody(p)
		}
	}
	m.offset += int64(len(p))
	return len(p), nil
}

// writeBody feeds a JSON body to the scanner. The body is one document, merged by Result
// once it is complete, so that a body found malformed anywhere states nothing.
func (m *Meter) writeBody(p []byte) {
	m.doc.feed(p)
	if m.doc.failed() {
		m.stop(ReasonMalformed, m.doc.describeError("the body"))
	}
}

// stop records why the meter stopped reading; the first reason stands.
func (m *Meter) stop(r Reason, detail string) {
	if m.fault == "" {
		m.fault, m.detail = r, detail
	}
}

// endDocument merges what a complete document (the body, or one event's data) stated.
func (m *Meter) endDocument() {
	d := &m.doc
	for i := range m.schema.paths {
		p := &m.schema.paths[i]
		if p.leaf && d.caps[i].bad != "" {
			where := "the body"
			if m.stream {
				where = fmt.Sprintf("event %d", m.events)
			}
			m.stop(ReasonBadValue, fmt.Sprintf("%s: %s is %s", where, p.path, d.caps[i].bad))
			return
		}
	}
	// Schema order, so that of two paths filling one field the later path wins.
	for i := range m.schema.paths {
		p, c := &m.schema.paths[i], &d.caps[i]
		if !p.leaf || !c.set {
			continue
		}
		switch {
		case p.field < numCounts:
			m.count[p.field], m.stated[p.field] = c.n, true
		case p.field == fieldModel:
			if s := c.str[:c.strLen]; !c.long && validModel(s) {
				m.modelLen = copy(m.model[:], s)
			}
		case p.field == fieldType:
			if !c.long && m.schema.terminal[string(c.str[:c.strLen])] {
				m.complete = true
			}
		}
	}
}

// validModel accepts 1 to maxModelLen printable ASCII characters without spaces.
func validModel(s []byte) bool {
	if len(s) == 0 || len(s) > maxModelLen {
		return false
	}
	for _, c := range s {
		if c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// Result is the response's usage as far as the meter has read. Call it once the body has ended
// (or been abandoned); calling it earlier is harmless and changes nothing.
func (m *Meter) Result() Usage {
	if !m.stream && m.fault == "" && m.doc.complete() {
		// Merge the body into a copy, so that Result changes nothing: more bytes may follow.
		body := *m
		body.endDocument()
		body.complete = body.fault == ""
		return body.result()
	}
	return m.result()
}

func (m *Meter) result() Usage {
	u := Usage{Format: m.format, Stream: m.stream, Model: string(m.model[:m.modelLen])}
	anyStated := false
	for _, s := range m.stated {
		anyStated = anyStated || s
	}
	u.Complete = m.complete

	in, cacheRead := m.count[fieldInput], m.count[fieldCacheRead]
	if m.schema != nil && m.schema.inputIncludesCache {
		in -= cacheRead
	}
	if in >= 0 {
		u.InputTokens = in
	}
	u.OutputTokens = m.count[fieldOutput]
	u.CacheReadTokens = cacheRead
	u.CacheWriteTokens = m.count[fieldCacheWrite]

	switch {
	case m.fault != "":
		u.Reason, u.Detail = m.fault, m.detail
	case !m.stream && !m.doc.started && !m.complete:
		u.Reason, u.Detail = ReasonNoUsage, "the body is empty"
	case !m.stream && !u.Complete:
		u.Reason, u.Detail = ReasonTruncated, fmt.Sprintf("the body ended after %d bytes, inside its JSON value", m.offset)
	case !anyStated && !u.Complete:
		u.Reason, u.Detail = ReasonTruncated, fmt.Sprintf("the stream ended after %d bytes and %d events, none of them stating usage", m.offset, m.events)
	case !anyStated:
		u.Reason, u.Detail = ReasonNoUsage, m.noUsageDetail()
	case in < 0:
		u.Reason, u.Detail = ReasonInconsistent, "the cached tokens exceed the input tokens they are part of"
	default:
		u.Metered = true
	}
	return u
}

func (m *Meter) noUsageDetail() string {
	if m.format == OpenAIChatCompletions && m.stream {
		return "the stream stated no usage: the request did not set stream_options.include_usage (see IncludeUsage)"
	}
	if m.stream {
		return fmt.Sprintf("none of the stream's %d events stated usage", m.events)
	}
	return "the body states no usage"
}
