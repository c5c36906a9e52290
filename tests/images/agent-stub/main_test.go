package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestRunWritesStreamJSON(t *testing.T) {
	env := map[string]string{
		"STUB_LINES":         "4",
		"STUB_BURST":         "2",
		"STUB_INTERVAL":      "1ms",
		"STUB_STDERR":        "warming up",
		"STUB_SESSION_ID":    "sess-1",
		"STUB_MODEL":         "claude-test",
		"STUB_COST_USD":      "0.5",
		"STUB_INPUT_TOKENS":  "11",
		"STUB_OUTPUT_TOKENS": "22",
		"STUB_CACHED_TOKENS": "33",
		"STUB_IS_ERROR":      "true",
	}
	cfg, err := loadConfig(func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if err := run(t.Context(), cfg, &stdout, &stderr); err != nil {
		t.Fatal(err)
	}
	if got := stderr.String(); got != "warming up\n" {
		t.Errorf("stderr = %q", got)
	}

	var got []map[string]any
	sc := bufio.NewScanner(&stdout)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q is not JSON: %v", sc.Text(), err)
		}
		got = append(got, m)
	}
	if len(got) != 6 {
		t.Fatalf("got %d lines, want init + 4 assistant + result", len(got))
	}
	if diff := cmp.Diff(map[string]any{"type": "system", "subtype": "init", "session_id": "sess-1", "model": "claude-test"}, got[0]); diff != "" {
		t.Errorf("init (-want +got):\n%s", diff)
	}
	for i := 1; i <= 4; i++ {
		want := map[string]any{"type": "assistant", "session_id": "sess-1", "message": map[string]any{
			"id":      "msg_" + string(rune('0'+i)),
			"content": []any{map[string]any{"type": "text", "text": "stub line " + string(rune('0'+i))}},
		}}
		if diff := cmp.Diff(want, got[i]); diff != "" {
			t.Errorf("assistant line %d (-want +got):\n%s", i, diff)
		}
	}
	result := got[5]
	delete(result, "duration_ms")
	wantResult := map[string]any{
		"type": "result", "subtype": "error_during_execution", "is_error": true, "num_turns": 1.0,
		"session_id": "sess-1", "result": "stub finished after 4 lines", "total_cost_usd": 0.5,
		"usage": map[string]any{"input_tokens": 11.0, "cache_creation_input_tokens": 0.0, "cache_read_input_tokens": 33.0, "output_tokens": 22.0},
		"modelUsage": map[string]any{"claude-test": map[string]any{
			"inputTokens": 11.0, "outputTokens": 22.0, "cacheReadInputTokens": 33.0, "cacheCreationInputTokens": 0.0,
		}},
	}
	if diff := cmp.Diff(wantResult, result); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}
}

func TestLoadConfig(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		check   func(t *testing.T, c config)
		wantErr string
	}{
		{name: "defaults", env: nil, check: func(t *testing.T, c config) {
			if c.lines != 3 || c.burst != 1 || !c.result || c.model != "claude-sonnet-4-5" || c.costUSD != 0.0123 || c.exitCode != 0 {
				t.Errorf("defaults = %+v", c)
			}
			if len(c.sessionID) != 36 {
				t.Errorf("session id %q is not a UUID", c.sessionID)
			}
		}},
		{name: "no result", env: map[string]string{"STUB_RESULT": "false", "STUB_EXIT_CODE": "3"}, check: func(t *testing.T, c config) {
			if c.result || c.exitCode != 3 {
				t.Errorf("config = %+v", c)
			}
		}},
		{name: "bad lines", env: map[string]string{"STUB_LINES": "-1"}, wantErr: "STUB_LINES"},
		{name: "bad interval", env: map[string]string{"STUB_INTERVAL": "soon"}, wantErr: "STUB_INTERVAL"},
		{name: "bad exit code", env: map[string]string{"STUB_EXIT_CODE": "300"}, wantErr: "STUB_EXIT_CODE"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(func(k string) string { return tc.env[k] })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one naming %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, c)
		})
	}
}

func TestRunWithoutResultLine(t *testing.T) {
	cfg, err := loadConfig(func(k string) string {
		return map[string]string{"STUB_LINES": "0", "STUB_RESULT": "false"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	var stdout bytes.Buffer
	if err := run(t.Context(), cfg, &stdout, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(stdout.String(), "\n"); n != 1 {
		t.Errorf("got %d lines, want only the init line:\n%s", n, stdout.String())
	}
}
