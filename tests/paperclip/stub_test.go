package paperclip

import (
	"encoding/json"
	"strings"
	"time"
)

// stubLine is one stream-json line the sandbox's stub `claude` printed (tests/images/claude-stub),
// as it reached a log: Paperclip's run log, or kubeclip's recorded exec.
type stubLine struct {
	Type    string
	Subtype string
	// MessageID is an assistant line's message id (msg_stub_01, …).
	MessageID string
	Text      string
	// Printed is when the stub wrote the line (its `timestamp`).
	Printed time.Time
	// Logged is when the log received the chunk that completed the line.
	Logged time.Time
	Raw    string
}

// stubEvent is the part of a stream-json line the tests read.
type stubEvent struct {
	Type      string `json:"type"`
	Subtype   string `json:"subtype"`
	SessionID string `json:"session_id"`
	Timestamp string `json:"timestamp"`
	Message   struct {
		ID      string `json:"id"`
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	} `json:"message"`
	Usage struct {
		InputTokens  int64 `json:"input_tokens"`
		OutputTokens int64 `json:"output_tokens"`
	} `json:"usage"`
	TotalCostUSD float64 `json:"total_cost_usd"`
}

// chunk is a piece of a stream with the time it was received.
type chunk struct {
	at   time.Time
	text string
}

// stubLines finds the stub's stream-json lines in chunks of stdout: each line is timed by the
// chunk that completed it. Paperclip's own lines ("[paperclip] …") and anything that is not a
// stream-json event are skipped.
func stubLines(chunks []chunk) []stubLine {
	var out []stubLine
	var pending strings.Builder
	for _, c := range chunks {
		text := c.text
		for {
			i := strings.IndexByte(text, '\n')
			if i < 0 {
				pending.WriteString(text)
				break
			}
			pending.WriteString(text[:i])
			if l, ok := parseStubLine(pending.String(), c.at); ok {
				out = append(out, l)
			}
			pending.Reset()
			text = text[i+1:]
		}
	}
	return out
}

func parseStubLine(raw string, logged time.Time) (stubLine, bool) {
	var ev stubEvent
	if !strings.HasPrefix(raw, "{") || json.Unmarshal([]byte(raw), &ev) != nil || ev.Type == "" {
		return stubLine{}, false
	}
	l := stubLine{Type: ev.Type, Subtype: ev.Subtype, MessageID: ev.Message.ID, Logged: logged, Raw: raw}
	if len(ev.Message.Content) > 0 {
		l.Text = ev.Message.Content[0].Text
	}
	l.Printed, _ = time.Parse(time.RFC3339Nano, ev.Timestamp)
	return l, true
}

// stdoutChunks are the run log's stdout chunks.
func stdoutChunks(log []logEntry) []chunk {
	var out []chunk
	for _, e := range log {
		if e.Stream == "stdout" {
			out = append(out, chunk{at: e.TS, text: e.Chunk})
		}
	}
	return out
}

// kinds renders lines as type/subtype (assistant lines as their message id), for comparisons.
func kinds(lines []stubLine) []string {
	var out []string
	for _, l := range lines {
		switch {
		case l.MessageID != "":
			out = append(out, l.Type+"/"+l.MessageID)
		case l.Subtype != "":
			out = append(out, l.Type+"/"+l.Subtype)
		default:
			out = append(out, l.Type)
		}
	}
	return out
}

// agentLines drops the stub's own reports (system/kubeclip_env, system/kubeclip_filler): what
// stays is a Claude Code run's stream.
func agentLines(lines []stubLine) []stubLine {
	var out []stubLine
	for _, l := range lines {
		if l.Type == "system" && strings.HasPrefix(l.Subtype, "kubeclip_") {
			continue
		}
		out = append(out, l)
	}
	return out
}

// envReport is one system/kubeclip_env line: a process's environment as names and the SHA-256 of
// each value (tests/images/claude-stub/envdump.go). Source is "claude" (the agent command) or
// "sh" (the image's sh wrapper, in every `sh -c` execute before the agent).
type envReport struct {
	Source string      `json:"source"`
	Keys   []string    `json:"keys"`
	SHA256 [][2]string `json:"sha256"`
}

// envReports are the kubeclip_env lines among lines.
func envReports(lines []stubLine) ([]envReport, error) {
	var out []envReport
	for _, l := range lines {
		if l.Type != "system" || l.Subtype != "kubeclip_env" {
			continue
		}
		var r envReport
		if err := json.Unmarshal([]byte(l.Raw), &r); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}
