// Package streamjson turns the output of `claude --output-format stream-json` into a run result.
//
// It is a port of Paperclip's claude-local parser (parseClaudeStreamJson plus the parts of
// toAdapterResult that can be derived from the stream alone), made incremental: the run-watcher
// calls Parser.Feed for every log line as it streams and Parser.ResultWithExitCode once the
// container has stopped. The result is the contract's events.AgentResult, the `agent` object of
// a run's `result` event (and of a recorded exec's). Memory is bounded no matter how long the run is: the parser keeps the final result
// event's few interesting fields, a capped tail of the assistant text and a handful of flags.
//
// Deviations from the TypeScript original, all deliberate:
//
//   - Text markers (login prompt, model not found, quota, transient upstream) are matched line by
//     line against the terminal result's text and error messages and against raw (non-JSON) lines,
//     which in a Job's combined log are the CLI's own stderr. They are never matched against
//     assistant prose or tool output inside JSON events: upstream learned that scanning the whole
//     transcript flags runs whose agent merely talked about logins or rate limits.
//   - The markers' regexps run on at most 1 MiB of a transcript's raw lines (markers.go): the
//     output is the agent's, and a regexp costs the worker far more per byte than the pod.
//   - claude_auth_required is only reported for a run that failed or produced no result event, for
//     the same reason.
//   - Assistant text blocks are not de-duplicated by (message id, block index) as the older
//     claude-k8s adapter did: recent CLIs split one message across several events that each start
//     at index 0, so that key drops real text. Replayed log lines are the log follower's problem.
//   - The summary keeps the last MaxSummaryBytes bytes (default 64 KiB); a cut summary starts with
//     "…".
package streamjson

import (
	"bytes"
	"encoding/json"
	"math"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// DefaultMaxSummaryBytes bounds AgentResult.Summary and the assistant text kept to build it. 64 KiB is
// the size of one log event: enough for any human-facing summary, small enough for a result event.
const DefaultMaxSummaryBytes = 64 << 10

// Error codes reported in AgentResult.ErrorCode. The first group are Paperclip's claude_local codes,
// the last two come from the claude-k8s adapter and only apply when no result event was seen.
const (
	ErrorAuthRequired              = "claude_auth_required"
	ErrorModelNotFound             = "model_not_found"
	ErrorMaxTurnsExhausted         = "max_turns_exhausted"
	ErrorPoisonedPreviousMessageID = "claude_poisoned_previous_message_id"
	ErrorProviderQuota             = "provider_quota"
	ErrorTransientUpstream         = "claude_transient_upstream"
	ErrorRefusal                   = "claude_refusal"
	ErrorLLMAPI                    = "llm_api_error"
	ErrorTruncated                 = "claude_truncated"
)

// Parser accumulates a stream-json transcript line by line. The zero value is ready to use with
// the default summary bound. A Parser is not safe for concurrent use.
type Parser struct {
	// MaxSummaryBytes bounds the kept assistant text and the summary; 0 means
	// DefaultMaxSummaryBytes.
	MaxSummaryBytes int

	sessionID string
	model     string

	texts     tailBuffer // assistant text blocks joined by "\n\n"
	final     *finalResult
	llmEmpty  bool // assistant event with stop_reason null and 0 output tokens, no result yet
	truncated bool // assistant event with output tokens > 0, no result yet

	// markers seen on raw (non-JSON) lines, usually the CLI's stderr, and the bytes of those
	// lines their regexps ran on (maxMarkerMatched).
	raw        markers
	rawMatched int
}

// markers records which text patterns were seen.
type markers struct {
	login, modelNotFound, quota, transient bool
}

// scan matches line against the markers not seen yet. Each regexp run adds len(line) to
// *matched; none runs once it is past maxMarkerMatched (nil: no bound).
func (m *markers) scan(line string, matched *int) {
	folded := foldCase(line)
	for _, k := range []struct {
		seen *bool
		m    marker
	}{{&m.login, authRequired}, {&m.modelNotFound, modelNotFound}, {&m.quota, providerQuota}, {&m.transient, transientUpstream}} {
		if *k.seen || !k.m.mayMatch(folded) {
			continue
		}
		if matched != nil {
			if *matched >= maxMarkerMatched {
				return
			}
			*matched += len(line)
		}
		*k.seen = k.m.re.MatchString(line)
	}
}

func (m markers) or(o markers) markers {
	return markers{
		login:         m.login || o.login,
		modelNotFound: m.modelNotFound || o.modelNotFound,
		quota:         m.quota || o.quota,
		transient:     m.transient || o.transient,
	}
}

// finalResult keeps what the classifier needs from the last `result` event.
type finalResult struct {
	subtype      string
	isError      bool
	text         string // result text, capped
	model        string
	costUSD      *float64
	usage        events.AgentUsage
	stopReasons  []string // stop_reason, stopReason, error_code, errorCode (lower-cased, trimmed)
	poisoned     bool
	unknownSess  bool
	imageError   bool
	terminalMark markers // markers in the result text and error messages
}

// event is the subset of a stream-json line the parser reads. Fields stay raw so the
// loose typing of the original (asString, asNumber, parseObject) can be reproduced exactly.
type event struct {
	Type      json.RawMessage `json:"type"`
	Subtype   json.RawMessage `json:"subtype"`
	SessionID json.RawMessage `json:"session_id"`
	Model     json.RawMessage `json:"model"`
	Message   json.RawMessage `json:"message"`

	IsError      json.RawMessage   `json:"is_error"`
	Result       json.RawMessage   `json:"result"`
	TotalCostUSD json.RawMessage   `json:"total_cost_usd"`
	Usage        json.RawMessage   `json:"usage"`
	ModelUsage   json.RawMessage   `json:"modelUsage"`
	StopReason   json.RawMessage   `json:"stop_reason"`
	StopReason2  json.RawMessage   `json:"stopReason"`
	ErrorCode    json.RawMessage   `json:"error_code"`
	ErrorCode2   json.RawMessage   `json:"errorCode"`
	Errors       []json.RawMessage `json:"errors"`
}

type assistantMessage struct {
	Content      []json.RawMessage `json:"content"`
	StopReason   json.RawMessage   `json:"stop_reason"`
	OutputTokens json.RawMessage   `json:"output_tokens"`
	Usage        json.RawMessage   `json:"usage"`
}

// Feed consumes one line of the agent's output (without its Kubernetes timestamp). Lines must be
// whole: the watcher feeds the line it read from the log stream, before the log batcher splits
// long lines. Blank lines are ignored; lines that are not a JSON object are scanned for
// failure markers.
func (p *Parser) Feed(line []byte) {
	line = bytes.TrimSpace(line)
	if len(line) == 0 {
		return
	}
	var ev event
	if line[0] != '{' || json.Unmarshal(line, &ev) != nil {
		p.raw.scan(capString(string(line), maxMarkerLine), &p.rawMatched)
		return
	}
	switch asString(ev.Type) {
	case "system":
		if asString(ev.Subtype) == "init" {
			p.setSession(ev.SessionID)
			if m := asString(ev.Model); m != "" {
				p.model = m
			}
		}
	case "assistant":
		p.setSession(ev.SessionID)
		p.feedAssistant(ev.Message)
	case "result":
		p.setSession(ev.SessionID)
		p.final = p.newFinal(&ev)
		p.llmEmpty, p.truncated = false, false
	}
}

func (p *Parser) setSession(raw json.RawMessage) {
	if s := asString(raw); s != "" {
		p.sessionID = s
	}
}

func (p *Parser) feedAssistant(raw json.RawMessage) {
	var msg assistantMessage
	if !isObject(raw) || json.Unmarshal(raw, &msg) != nil {
		return
	}
	// claude-k8s: output_tokens may sit on the message or under message.usage; -1 when absent.
	outputTokens := -1.0
	if n, ok := number(msg.OutputTokens); ok {
		outputTokens = n
	} else if n, ok := number(objectField(msg.Usage, "output_tokens")); ok {
		outputTokens = n
	}
	if isNull(msg.StopReason) && outputTokens == 0 {
		p.llmEmpty = true
	}
	if outputTokens > 0 {
		p.truncated = true
	}
	for _, entry := range msg.Content {
		var block struct {
			Type json.RawMessage `json:"type"`
			Text json.RawMessage `json:"text"`
		}
		if !isObject(entry) || json.Unmarshal(entry, &block) != nil {
			continue
		}
		if asString(block.Type) != "text" {
			continue
		}
		if text := asString(block.Text); text != "" {
			p.texts.add(text, p.maxSummary())
		}
	}
}

func (p *Parser) newFinal(ev *event) *finalResult {
	f := &finalResult{
		subtype: asString(ev.Subtype),
		isError: asBool(ev.IsError),
		text:    tail(asString(ev.Result), p.maxSummary()),
		model:   asString(ev.Model),
	}
	if n, ok := number(ev.TotalCostUSD); ok {
		f.costUSD = &n
	}
	if totals, ok := modelUsageTotals(ev.ModelUsage); ok {
		f.usage = totals
	} else {
		f.usage = events.AgentUsage{
			InputTokens:       toInt(asNumber(objectField(ev.Usage, "input_tokens"))),
			CachedInputTokens: toInt(asNumber(objectField(ev.Usage, "cache_read_input_tokens"))),
			OutputTokens:      toInt(asNumber(objectField(ev.Usage, "output_tokens"))),
		}
	}
	for _, r := range []json.RawMessage{ev.StopReason, ev.StopReason2, ev.ErrorCode, ev.ErrorCode2} {
		f.stopReasons = append(f.stopReasons, strings.ToLower(strings.TrimSpace(asString(r))))
	}
	messages := append([]string{strings.TrimSpace(f.text)}, errorMessages(ev.Errors)...)
	for _, msg := range messages {
		if msg == "" {
			continue
		}
		for _, line := range strings.Split(msg, "\n") {
			f.terminalMark.scan(strings.TrimSpace(line), nil)
		}
		f.poisoned = f.poisoned || poisonedRE.MatchString(msg)
		f.unknownSess = f.unknownSess || unknownSessionRE.MatchString(msg)
		f.imageError = f.imageError || imageErrorRE.MatchString(msg)
	}
	return f
}

// ResultWithExitCode classifies the transcript fed so far for an agent that exited with
// exitCode, using Paperclip's rule: a run failed unless its result event is a non-error
// success, and only if the exit code is non-zero or the result says is_error.
func (p *Parser) ResultWithExitCode(exitCode int) *events.AgentResult {
	r := &events.AgentResult{SessionID: p.sessionID, Model: p.model}
	f := p.final
	if f == nil {
		// A stream without a result event did not complete: it is a failure whatever the exit
		// code, so only the raw lines (the CLI's stderr) can say why.
		r.Summary = strings.TrimSpace(p.texts.String())
		switch {
		case p.raw.login:
			r.ErrorCode = ErrorAuthRequired
		case p.raw.modelNotFound:
			r.ErrorCode = ErrorModelNotFound
		case p.raw.quota:
			r.ErrorCode = ErrorProviderQuota
		case p.raw.transient:
			r.ErrorCode = ErrorTransientUpstream
		case p.llmEmpty:
			r.ErrorCode = ErrorLLMAPI
		case p.truncated:
			r.ErrorCode = ErrorTruncated
		}
		r.IsError = true
		return r
	}

	if r.Model == "" {
		r.Model = f.model
	}
	usage := f.usage
	r.Usage = &usage
	r.CostUSD = f.costUSD
	if f.text != "" {
		r.Summary = strings.TrimSpace(f.text)
	} else {
		r.Summary = strings.TrimSpace(p.texts.String())
	}

	succeeded := f.subtype == "success" && !f.isError
	failed := !succeeded && (exitCode != 0 || f.isError)
	mark := f.terminalMark.or(p.raw)
	maxTurns := f.isMaxTurns()
	deterministic := maxTurns || f.unknownSess || f.poisoned || f.imageError
	login := failed && mark.login
	quota := failed && !login && !deterministic && mark.quota
	transient := failed && !login && !quota && !deterministic && mark.transient

	switch {
	case login:
		r.ErrorCode = ErrorAuthRequired
	case failed && mark.modelNotFound:
		r.ErrorCode = ErrorModelNotFound
	case failed && maxTurns:
		r.ErrorCode = ErrorMaxTurnsExhausted
	case failed && f.poisoned:
		r.ErrorCode = ErrorPoisonedPreviousMessageID
	case quota:
		r.ErrorCode = ErrorProviderQuota
	case transient:
		r.ErrorCode = ErrorTransientUpstream
	case f.isRefusal():
		r.ErrorCode = ErrorRefusal
	}
	if f.poisoned {
		// Validate-before-persist: a poisoned session must never be resumed.
		r.SessionID = ""
	}
	r.IsError = failed
	return r
}

func (p *Parser) maxSummary() int {
	if p.MaxSummaryBytes > 0 {
		return p.MaxSummaryBytes
	}
	return DefaultMaxSummaryBytes
}

func (f *finalResult) isMaxTurns() bool {
	if strings.ToLower(strings.TrimSpace(f.subtype)) == "error_max_turns" {
		return true
	}
	for _, r := range f.stopReasons {
		switch r {
		case "max_turns", "max_turns_exhausted", "turn_limit", "turn_limit_exhausted":
			return true
		}
	}
	return false
}

func (f *finalResult) isRefusal() bool {
	switch strings.ToLower(strings.TrimSpace(f.subtype)) {
	case "model_refusal", "refusal":
		return true
	}
	for _, r := range f.stopReasons {
		if r == "refusal" {
			return true
		}
	}
	return false
}

// modelUsageTotals sums the per-model ledger: input = Σ(inputTokens + cacheCreationInputTokens),
// output = Σ outputTokens, cached = Σ cacheReadInputTokens. ok is false when the ledger has no
// non-empty entry, in which case the result event's top-level usage is used instead.
func modelUsageTotals(raw json.RawMessage) (events.AgentUsage, bool) {
	var byModel map[string]json.RawMessage
	if !isObject(raw) || json.Unmarshal(raw, &byModel) != nil {
		return events.AgentUsage{}, false
	}
	var in, out, cached float64
	saw := false
	for _, v := range byModel {
		var entry map[string]json.RawMessage
		if !isObject(v) || json.Unmarshal(v, &entry) != nil || len(entry) == 0 {
			continue
		}
		saw = true
		in += asNumber(entry["inputTokens"]) + asNumber(entry["cacheCreationInputTokens"])
		out += asNumber(entry["outputTokens"])
		cached += asNumber(entry["cacheReadInputTokens"])
	}
	if !saw {
		return events.AgentUsage{}, false
	}
	return events.AgentUsage{InputTokens: toInt(in), OutputTokens: toInt(out), CachedInputTokens: toInt(cached)}, true
}

// maxErrorMessages and maxMarkerLine bound what a hostile or broken transcript can make us hold.
const (
	maxErrorMessages = 16
	maxMarkerLine    = 4 << 10
	// maxMarkerMatched bounds the raw lines' bytes the marker regexps run on in one transcript
	// (markers.go): about a second of one CPU. A CLI's own stderr is a few KiB.
	maxMarkerMatched = 1 << 20
)

// errorMessages mirrors extractClaudeErrorMessages: strings as they are, objects by their
// message, error or code field, else their JSON.
func errorMessages(raw []json.RawMessage) []string {
	var out []string
	for _, e := range raw {
		if len(out) == maxErrorMessages {
			break
		}
		if s, ok := str(e); ok {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, capString(s, maxMarkerLine))
			}
			continue
		}
		if !isObject(e) {
			continue
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(e, &obj) != nil {
			continue
		}
		msg := asString(obj["message"])
		if msg == "" {
			msg = asString(obj["error"])
		}
		if msg == "" {
			msg = asString(obj["code"])
		}
		if msg == "" {
			msg = string(e)
		}
		out = append(out, capString(msg, maxMarkerLine))
	}
	return out
}

// Markers, from Paperclip's claude-local parse.ts. The four matched on every raw line go
// through a marker (markers.go): a line holding none of its words is not run through the regex.
var (
	authRequired      = marker{authRequiredRE, []string{"log", "auth"}}
	modelNotFound     = marker{modelNotFoundRE, []string{"model"}}
	providerQuota     = marker{providerQuotaRE, []string{"limit", "usage", "quota"}}
	transientUpstream = marker{transientUpstreamRE, []string{"rate", "many", "429", "overload", "unavailable", "503", "529", "demand", "again", "throttl", "quota", "usage", "limit"}}

	authRequiredRE = regexp.MustCompile(`(?i)(?:not\s+logged\s+in|please\s+log\s+in|please\s+run\s+` +
		"`?claude\\s+login`?" + `|please\s+run\s+/login|login\s+required|requires\s+login|unauthorized|authentication\s+required|invalid\s+authentication\s+credentials|failed\s+to\s+authenticate|oauth\s+session\s+expired)`)
	modelNotFoundRE     = regexp.MustCompile(`(?i)(?:model[\s_-]*(?:not[\s_-]*found|does not exist|unknown|invalid)|unknown[\s_-]*model)`)
	providerQuotaRE     = regexp.MustCompile(`(?i)(?:you(?:'|’)ve\s+hit\s+your\s+session\s+limit|session\s+limit\s+(?:reached|exceeded)|out\s+of\s+extra\s+usage|extra\s+usage\b|claude\s+usage\s+limit\s+reached|5[-\s]?hour\s+limit\s+reached|weekly\s+limit\s+reached|usage\s+limit\s+reached|usage\s+cap\s+reached|servicequotaexceededexception)`)
	transientUpstreamRE = regexp.MustCompile(`(?i)(?:rate[-\s]?limit(?:ed)?|rate_limit_error|too\s+many\s+requests|\b429\b|overloaded(?:_error)?|server\s+overloaded|service\s+unavailable|\b503\b|\b529\b|high\s+demand|try\s+again\s+later|temporarily\s+unavailable|throttl(?:ed|ing)|throttlingexception|servicequotaexceededexception|out\s+of\s+extra\s+usage|extra\s+usage\b|claude\s+usage\s+limit\s+reached|5[-\s]?hour\s+limit\s+reached|weekly\s+limit\s+reached|usage\s+limit\s+reached|usage\s+cap\s+reached)`)
	poisonedRE          = regexp.MustCompile("(?i)diagnostics\\.previous_message_id.*starts with `msg_`")
	unknownSessionRE    = regexp.MustCompile(`(?i)no conversation found with session id|unknown session|session .* not found|not a valid UUID|--resume requires a valid session|is not a UUID|does not match any session title`)
	imageErrorRE        = regexp.MustCompile(`(?i)could not process image`)
)

// tailBuffer keeps the last max bytes of the assistant text blocks joined by "\n\n".
type tailBuffer struct {
	b   []byte
	cut bool
}

func (t *tailBuffer) add(text string, limit int) {
	if len(t.b) > 0 || t.cut {
		t.b = append(t.b, "\n\n"...)
	}
	t.b = append(t.b, text...)
	if len(t.b) > limit {
		drop := len(t.b) - limit
		for drop < len(t.b) && !utf8.RuneStart(t.b[drop]) {
			drop++
		}
		t.b = append(t.b[:0], t.b[drop:]...)
		t.cut = true
	}
}

func (t *tailBuffer) String() string {
	if t.cut {
		return ellipsis + string(t.b)
	}
	return string(t.b)
}

const ellipsis = "…"

// tail keeps the last limit bytes of s on a rune boundary, marking a cut with "…".
func tail(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	i := len(s) - limit
	for i < len(s) && !utf8.RuneStart(s[i]) {
		i++
	}
	return ellipsis + s[i:]
}

// capString keeps the first limit bytes of s; used for marker matching only.
func capString(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	return s[:limit]
}

// The helpers below reproduce adapter-utils' asString / asNumber / parseObject: a value counts
// only when it has the expected JSON type.

func str(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// asString returns raw when it is a non-empty JSON string, else "".
func asString(raw json.RawMessage) string {
	s, _ := str(raw)
	return s
}

func number(raw json.RawMessage) (float64, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || !(raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9')) {
		return 0, false
	}
	var n float64
	if json.Unmarshal(raw, &n) != nil || math.IsNaN(n) || math.IsInf(n, 0) {
		return 0, false
	}
	return n, true
}

// asNumber returns raw when it is a finite JSON number, else 0.
func asNumber(raw json.RawMessage) float64 {
	n, _ := number(raw)
	return n
}

func asBool(raw json.RawMessage) bool {
	return bytes.Equal(bytes.TrimSpace(raw), []byte("true"))
}

func isObject(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '{'
}

func isNull(raw json.RawMessage) bool {
	return bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

func objectField(raw json.RawMessage, name string) json.RawMessage {
	if !isObject(raw) {
		return nil
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(raw, &obj) != nil {
		return nil
	}
	return obj[name]
}

func toInt(f float64) int64 { return int64(math.Round(f)) }
