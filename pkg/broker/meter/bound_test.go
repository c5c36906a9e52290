package meter_test

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/broker/meter"
)

// part is a run of a body: text repeated n times.
type part struct {
	text string
	n    int
}

// streamParts writes the parts to m in 32 KiB writes from one reused buffer, so that the test
// itself allocates nothing in proportion to the body, and returns the bytes written.
func streamParts(m *meter.Meter, parts []part) int64 {
	buf := make([]byte, 0, 32<<10)
	var total int64
	for _, p := range parts {
		for range p.n {
			for s := p.text; len(s) > 0; {
				k := copy(buf[len(buf):cap(buf)], s)
				buf, s = buf[:len(buf)+k], s[k:]
				if len(buf) == cap(buf) {
					_, _ = m.Write(buf)
					total += int64(len(buf))
					buf = buf[:0]
				}
			}
		}
	}
	_, _ = m.Write(buf)
	return total + int64(len(buf))
}

// TestBoundedMemory streams giant responses through a meter: a 50 MiB event and a 50 MiB JSON
// body, then 8 MiB of each other shape that could make a parser hold on (a comment line, a
// number, a key, nesting, data lines). The meter must allocate nothing in proportion (the
// bound asserted is 1 MiB, against bodies 8 to 50 times that) and still meter what follows the
// giant part. The other shapes are 8 MiB, not 50, only to keep the test's time modest under
// -race (they run at 6 to 20 MiB/s there).
func TestBoundedMemory(t *testing.T) {
	const size, small = 50 << 20, 8 << 20
	filler := `The model wrote this: \"quoted\", a \\ backslash, \u00e9 and \ud83d\ude00. `
	reps := size / len(filler)
	tests := []struct {
		name   string
		format meter.Format
		ct     string
		parts  []part
		want   meter.Usage
	}{
		{
			name: "a 50 MiB event", format: meter.OpenAIResponses, ct: sse,
			parts: []part{
				{"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"model\":\"gpt-5\",\"output\":[{\"type\":\"message\",\"content\":[{\"type\":\"output_text\",\"text\":\"", 1},
				{filler, reps},
				{"\"}]}],\"usage\":{\"input_tokens\":100,\"input_tokens_details\":{\"cached_tokens\":40},\"output_tokens\":200000}}}\n\n", 1},
			},
			want: meter.Usage{Format: meter.OpenAIResponses, Stream: true, Model: "gpt-5", InputTokens: 60, CacheReadTokens: 40, OutputTokens: 200000, Metered: true, Complete: true},
		},
		{
			name: "a 50 MiB JSON body", format: meter.AnthropicMessages, ct: json,
			parts: []part{
				{`{"model":"claude-opus-4-1","content":[{"type":"text","text":"`, 1},
				{filler, reps},
				{`"}],"usage":{"input_tokens":5,"output_tokens":190000}}`, 1},
			},
			want: meter.Usage{Format: meter.AnthropicMessages, Model: "claude-opus-4-1", InputTokens: 5, OutputTokens: 190000, Metered: true, Complete: true},
		},
		{
			name: "8 MiB of nesting in a tool input", format: meter.AnthropicMessages, ct: json,
			parts: []part{
				{`{"content":[{"type":"tool_use","input":`, 1},
				{`{"a":[`, small / 8},
				{`]}`, small / 8},
				{`}],"usage":{"input_tokens":5,"output_tokens":7}}`, 1},
			},
			want: meter.Usage{Format: meter.AnthropicMessages, InputTokens: 5, OutputTokens: 7, Metered: true, Complete: true},
		},
		{
			name: "an 8 MiB comment line", format: meter.AnthropicMessages, ct: sse,
			parts: []part{
				{":", 1},
				{"keep-alive ", small / 11},
				{"\n\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n", 1},
			},
			want: meter.Usage{Format: meter.AnthropicMessages, Stream: true, InputTokens: 3, OutputTokens: 1, Metered: true},
		},
		{
			name: "8 MiB of data lines in one event", format: meter.AnthropicMessages, ct: sse,
			parts: []part{
				{"data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":4,\"output_tokens\":1},\"content\":[0", 1},
				{"\ndata: ,1", small / 9},
				{"]}}\n\n", 1},
			},
			want: meter.Usage{Format: meter.AnthropicMessages, Stream: true, InputTokens: 4, OutputTokens: 1, Metered: true},
		},
		{
			name: "an 8 MiB key beside usage", format: meter.AnthropicMessages, ct: json,
			parts: []part{
				{`{"usage":{"`, 1},
				{"k", small},
				{`":1,"output_tokens":3}}`, 1},
			},
			want: meter.Usage{Format: meter.AnthropicMessages, OutputTokens: 3, Metered: true, Complete: true},
		},
		{
			name: "an 8 MiB count", format: meter.AnthropicMessages, ct: json,
			parts: []part{
				{`{"usage":{"output_tokens":1`, 1},
				{"0", small},
				{`}}`, 1},
			},
			want: meter.Usage{Format: meter.AnthropicMessages, Reason: meter.ReasonBadValue, Detail: "the body: usage.output_tokens is larger than 2^53"},
		},
	}
	t.Logf("%-36s %12s %12s %8s %10s %8s", "case", "bytes", "alloc_bytes", "mallocs", "ms", "MiB/s")
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			start := time.Now()
			m := meter.New(tc.format, header(tc.ct))
			n := streamParts(m, tc.parts)
			got := m.Result()
			elapsed := time.Since(start)
			runtime.ReadMemStats(&after)
			var planned int64
			for _, p := range tc.parts {
				planned += int64(len(p.text) * p.n)
			}
			if n != planned || n < small {
				t.Fatalf("wrote %d bytes, want %d (at least %d)", n, planned, small)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("usage (-want +got):\n%s", diff)
			}
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("%-36s %12d %12d %8d %10.0f %8.1f", tc.name, n, alloc, after.Mallocs-before.Mallocs,
				elapsed.Seconds()*1000, float64(n)/(1<<20)/elapsed.Seconds())
			if alloc > 1<<20 {
				t.Errorf("metering %d bytes allocated %d bytes, want at most 1 MiB", n, alloc)
			}
		})
	}
}

// TestWriteDoesNotAllocate: past its construction, a meter allocates nothing per write, so a
// broker carrying a thousand streams carries a thousand fixed-size meters and nothing more.
func TestWriteDoesNotAllocate(t *testing.T) {
	tests := []struct {
		name   string
		format meter.Format
		ct     string
		chunk  string
	}{
		{"anthropic delta", meter.AnthropicMessages, sse, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello \\u00e9\"}}\n\n"},
		{"anthropic message_delta", meter.AnthropicMessages, sse, "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":null},\"usage\":{\"input_tokens\":9,\"output_tokens\":12}}\n\n"},
		{"chat chunk with usage", meter.OpenAIChatCompletions, sse, "data: {\"model\":\"gpt-4o\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n"},
		{"responses delta", meter.OpenAIResponses, sse, "event: response.output_text.delta\r\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\r\n\r\n"},
		{"json body text", meter.AnthropicMessages, json, strings.Repeat("x", 100)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := meter.New(tc.format, header(tc.ct))
			b := []byte(tc.chunk)
			if tc.ct == json {
				_, _ = m.Write([]byte(`{"content":[{"text":"`))
			}
			if allocs := testing.AllocsPerRun(200, func() { _, _ = m.Write(b) }); allocs != 0 {
				t.Errorf("Write allocates %.1f times per call, want 0", allocs)
			}
			if got := m.Result(); got.Reason == meter.ReasonMalformed {
				t.Fatalf("the chunks were not valid: %s", got.Detail)
			}
		})
	}
}

// TestMeterSize logs what one meter costs the broker, the figure to multiply by the streams a
// replica carries.
func TestMeterSize(t *testing.T) {
	const n = 1000
	keep := make([]*meter.Meter, 0, n)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range n {
		keep = append(keep, meter.New(meter.AnthropicMessages, header(sse)))
	}
	runtime.ReadMemStats(&after)
	per := (after.TotalAlloc - before.TotalAlloc) / n
	t.Logf("bytes_per_meter=%d meters=%d", per, len(keep))
	if per > 16<<10 {
		t.Errorf("a meter allocates %d bytes, want at most 16 KiB", per)
	}
}
