package streamjson_test

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/streamjson"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func ptr[T any](v T) *T { return &v }

// feedFile feeds a fixture line by line, as the run-watcher does while the log streams.
func feedFile(t *testing.T, name string) *streamjson.Parser {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatalf("reading fixture: %v", err)
	}
	p := &streamjson.Parser{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		p.Feed(sc.Bytes())
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("scanning fixture: %v", err)
	}
	return p
}

func TestParserFixtures(t *testing.T) {
	tests := []struct {
		name     string
		fixture  string
		exitCode *int // nil: ResultWithExitCode(0), the stream alone
		want     *events.AgentResult
	}{
		{
			name:    "success sums modelUsage across models",
			fixture: "success.jsonl",
			want: &events.AgentResult{
				SessionID: "6f1c2a9e-3b7d-4f0e-9a51-2d8c4e7b1a03",
				Model:     "claude-sonnet-4-5-20250929",
				// input = (10+5420) + (812+0); output = 137+64; cached = 5120+0.
				Usage:   &events.AgentUsage{InputTokens: 6242, OutputTokens: 201, CachedInputTokens: 5120},
				CostUSD: ptr(0.0841275),
				Summary: "Fixed the stale fixture in parse_test.go; all tests pass.",
			},
		},
		{
			name:     "success stays success with exit code 0",
			fixture:  "success.jsonl",
			exitCode: ptr(0),
			want: &events.AgentResult{
				SessionID: "6f1c2a9e-3b7d-4f0e-9a51-2d8c4e7b1a03",
				Model:     "claude-sonnet-4-5-20250929",
				Usage:     &events.AgentUsage{InputTokens: 6242, OutputTokens: 201, CachedInputTokens: 5120},
				CostUSD:   ptr(0.0841275),
				Summary:   "Fixed the stale fixture in parse_test.go; all tests pass.",
			},
		},
		{
			name:    "empty modelUsage falls back to usage; string cost is dropped; empty result uses assistant text",
			fixture: "usage_fallback.jsonl",
			want: &events.AgentResult{
				SessionID: "a0000000-0000-4000-8000-000000000001",
				Model:     "claude-opus-4-1-20250805",
				Usage:     &events.AgentUsage{InputTokens: 1200, OutputTokens: 3, CachedInputTokens: 300},
				Summary:   "Done.",
			},
		},
		{
			name:    "max turns without is_error is not a failure on its own",
			fixture: "max_turns.jsonl",
			want: &events.AgentResult{
				SessionID: "b0000000-0000-4000-8000-000000000002",
				Model:     "claude-sonnet-4-5-20250929",
				Usage:     &events.AgentUsage{InputTokens: 100, OutputTokens: 900},
				CostUSD:   ptr(1.25),
				Summary:   "Still working through the migration.",
			},
		},
		{
			name:     "max turns with a non-zero exit is max_turns_exhausted",
			fixture:  "max_turns.jsonl",
			exitCode: ptr(1),
			want: &events.AgentResult{
				SessionID: "b0000000-0000-4000-8000-000000000002",
				Model:     "claude-sonnet-4-5-20250929",
				Usage:     &events.AgentUsage{InputTokens: 100, OutputTokens: 900},
				CostUSD:   ptr(1.25),
				Summary:   "Still working through the migration.",
				IsError:   true,
				ErrorCode: streamjson.ErrorMaxTurnsExhausted,
			},
		},
		{
			name:    "refusal",
			fixture: "refusal.jsonl",
			want: &events.AgentResult{
				SessionID: "c0000000-0000-4000-8000-000000000003",
				Model:     "claude-sonnet-4-5-20250929",
				Usage:     &events.AgentUsage{InputTokens: 20},
				IsError:   true,
				ErrorCode: streamjson.ErrorRefusal,
			},
		},
		{
			name:    "auth required from the result text",
			fixture: "auth_required.jsonl",
			want: &events.AgentResult{
				SessionID: "d0000000-0000-4000-8000-000000000004",
				Model:     "claude-sonnet-4-5-20250929",
				Usage:     &events.AgentUsage{},
				CostUSD:   ptr(0.0),
				Summary:   "Invalid API key · Please run /login",
				IsError:   true,
				ErrorCode: streamjson.ErrorAuthRequired,
			},
		},
		{
			name:    "auth required from a raw stderr line and no result",
			fixture: "stderr_login.jsonl",
			want:    &events.AgentResult{IsError: true, ErrorCode: streamjson.ErrorAuthRequired},
		},
		{
			name:    "poisoned previous_message_id drops the session",
			fixture: "poisoned.jsonl",
			want: &events.AgentResult{
				Model:     "claude-sonnet-4-5-20250929",
				Usage:     &events.AgentUsage{},
				CostUSD:   ptr(0.0),
				Summary:   "API Error: 400 {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"diagnostics.previous_message_id: must be the `id` from a prior /v1/messages response (starts with `msg_`)\"}}",
				IsError:   true,
				ErrorCode: streamjson.ErrorPoisonedPreviousMessageID,
			},
		},
		{
			name:    "provider quota wins over transient upstream",
			fixture: "quota.jsonl",
			want: &events.AgentResult{
				SessionID: "f0000000-0000-4000-8000-000000000006",
				Model:     "claude-opus-4-1-20250805",
				Usage:     &events.AgentUsage{},
				CostUSD:   ptr(0.0),
				Summary:   "Claude AI usage limit reached. Your limit resets at 3pm (UTC).",
				IsError:   true,
				ErrorCode: streamjson.ErrorProviderQuota,
			},
		},
		{
			name:    "transient upstream from the errors array",
			fixture: "transient.jsonl",
			want: &events.AgentResult{
				SessionID: "a1000000-0000-4000-8000-000000000007",
				Model:     "claude-sonnet-4-5-20250929",
				Usage:     &events.AgentUsage{InputTokens: 10},
				IsError:   true,
				ErrorCode: streamjson.ErrorTransientUpstream,
			},
		},
		{
			name:    "model not found from an error object",
			fixture: "model_not_found.jsonl",
			want: &events.AgentResult{
				SessionID: "a2000000-0000-4000-8000-000000000008",
				Model:     "claude-nope-9",
				Usage:     &events.AgentUsage{},
				IsError:   true,
				ErrorCode: streamjson.ErrorModelNotFound,
			},
		},
		{
			name:    "stream cut after assistant output is claude_truncated",
			fixture: "truncated.jsonl",
			want: &events.AgentResult{
				SessionID: "a3000000-0000-4000-8000-000000000009",
				Model:     "claude-sonnet-4-5-20250929",
				Summary:   "Refactoring the reconciler",
				IsError:   true,
				ErrorCode: streamjson.ErrorTruncated,
			},
		},
		{
			name:    "empty LLM response is llm_api_error",
			fixture: "llm_empty.jsonl",
			want: &events.AgentResult{
				SessionID: "a4000000-0000-4000-8000-000000000010",
				Model:     "MiniMax-M2",
				IsError:   true,
				ErrorCode: streamjson.ErrorLLMAPI,
			},
		},
		{
			name:    "last result wins and junk lines are skipped",
			fixture: "last_result_wins.jsonl",
			want: &events.AgentResult{
				SessionID: "a5000000-0000-4000-8000-000000000012",
				Model:     "claude-sonnet-4-5-20250929",
				Usage:     &events.AgentUsage{InputTokens: 7, OutputTokens: 5, CachedInputTokens: 2},
				CostUSD:   ptr(0.02),
				Summary:   "second attempt worked",
			},
		},
		{
			name:     "markers in assistant prose and tool output do not classify a failure",
			fixture:  "prose_markers.jsonl",
			exitCode: ptr(1),
			want: &events.AgentResult{
				SessionID: "a6000000-0000-4000-8000-000000000013",
				Model:     "claude-sonnet-4-5-20250929",
				Usage:     &events.AgentUsage{InputTokens: 3, OutputTokens: 40},
				Summary:   "The API returned 429 (rate limit) and said I am not logged in; retrying with the cached token.",
				IsError:   true,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := feedFile(t, tc.fixture)
			var got *events.AgentResult
			if tc.exitCode == nil {
				got = p.ResultWithExitCode(0)
			} else {
				got = p.ResultWithExitCode(*tc.exitCode)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("result mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParserEmpty(t *testing.T) {
	var p streamjson.Parser
	want := &events.AgentResult{IsError: true}
	if diff := cmp.Diff(want, p.ResultWithExitCode(0)); diff != "" {
		t.Errorf("result of an empty stream (-want +got):\n%s", diff)
	}
}

func TestParserSummaryIsBoundedTail(t *testing.T) {
	p := &streamjson.Parser{MaxSummaryBytes: 1024}
	block := strings.Repeat("é", 100) // 200 bytes, two-byte runes to exercise rune boundaries
	for i := range 1000 {
		p.Feed([]byte(`{"type":"assistant","message":{"content":[{"type":"text","text":"` + block + `"}]}}`))
		if i == 999 {
			p.Feed([]byte(`{"type":"assistant","message":{"content":[{"type":"text","text":"THE END"}]}}`))
		}
	}
	got := p.ResultWithExitCode(0).Summary
	if len(got) > 1024+len("…") {
		t.Errorf("summary is %d bytes, want at most %d", len(got), 1024+len("…"))
	}
	if !strings.HasPrefix(got, "…") || !strings.HasSuffix(got, "THE END") {
		t.Errorf("summary should be the marked tail of the text, got %q…%q", got[:8], got[len(got)-8:])
	}
	if !isValidUTF8(got) {
		t.Errorf("summary was cut inside a rune")
	}

	long := strings.Repeat("x", 5000) + "tail"
	p.Feed([]byte(`{"type":"result","subtype":"success","is_error":false,"result":"` + long + `"}`))
	got = p.ResultWithExitCode(0).Summary
	if len(got) > 1024+len("…") || !strings.HasSuffix(got, "tail") {
		t.Errorf("result summary should be the last 1024 bytes, got %d bytes", len(got))
	}
}

func isValidUTF8(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }
