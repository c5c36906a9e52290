package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/streamjson"
)

// TestMain is also the processes hostile_test.go starts: the stub's flooder (os.Executable is
// this binary) and a fake `sandboxd tar`.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == floodCommand {
		os.Exit(floodMain(os.Args[2:], os.Stderr))
	}
	if os.Getenv(fakeSandboxdVar) != "" {
		os.Exit(fakeSandboxdTar(os.Args[1:]))
	}
	goleak.VerifyTestMain(m)
}

// paperclipArgs are the arguments Paperclip's claude_local adapter passes (contract §3.3, #40).
var paperclipArgs = []string{
	"--print", "--output-format", "stream-json", "--verbose",
	"--allowedTools", "Bash,Read,Edit", "--model", "claude-opus-5",
	"--append-system-prompt-file", "/workspace/.paperclip-runtime/skills/agent-instructions.md",
	"--mcp-config", "/workspace/.paperclip-runtime/mcp-config.json", "--strict-mcp-config",
	"--add-dir", "/workspace/.paperclip-runtime/skills",
}

const prompt = "## Paperclip Wake Payload\nSay hello.\n"

// stubRun runs the stub with env (plus no pauses unless env sets them) and returns its stdout,
// stderr and error.
func stubRun(t *testing.T, args []string, env map[string]string, stdin string) (string, string, error) {
	t.Helper()
	all := map[string]string{"CLAUDE_STUB_INTERVAL": "0"}
	for k, v := range env {
		all[k] = v
	}
	var stdout, stderr bytes.Buffer
	var environ []string
	for k, v := range all {
		environ = append(environ, k+"="+v)
	}
	err := run(t.Context(), args, environ, strings.NewReader(stdin), &stdout, &stderr)
	return stdout.String(), stderr.String(), err
}

// event is the part of a stream-json line the tests check.
type event struct {
	Type      string `json:"type"`
	Subtype   string `json:"subtype"`
	SessionID string `json:"session_id"`
	Model     string `json:"model"`
	IsError   bool   `json:"is_error"`
	Message   struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
	} `json:"message"`
}

// parse decodes every stdout line and feeds it to kubeclip's port of Paperclip's parser.
func parse(t *testing.T, stdout string) ([]event, *streamjson.Parser) {
	t.Helper()
	var events []event
	p := &streamjson.Parser{}
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		var ev event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("stdout line %q is not JSON: %v", sc.Text(), err)
		}
		events = append(events, ev)
		p.Feed(sc.Bytes())
	}
	return events, p
}

func types(events []event) []string {
	var out []string
	for _, ev := range events {
		out = append(out, ev.Type+"/"+ev.Subtype)
	}
	return out
}

func texts(events []event) []string {
	var out []string
	for _, ev := range events {
		for _, c := range ev.Message.Content {
			out = append(out, c.Text)
		}
	}
	return out
}

func TestStreamParsesAsASuccessfulRun(t *testing.T) {
	stdout, stderr, err := stubRun(t, paperclipArgs, nil, prompt)
	if err != nil {
		t.Fatalf("run: %v\nstderr: %s", err, stderr)
	}
	evs, p := parse(t, stdout)
	if diff := cmp.Diff([]string{"system/init", "assistant/", "assistant/", "result/success"}, types(evs)); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if !strings.Contains(evs[1].Message.Content[0].Text, "Received a prompt of 37 bytes") {
		t.Errorf("first assistant text %q does not report the prompt read from stdin", evs[1].Message.Content[0].Text)
	}
	if n := strings.Count(stderr, "\n"); n != 1 || !strings.HasPrefix(stderr, "claude-stub: working") {
		t.Errorf("stderr = %q, want one progress line", stderr)
	}

	// What Paperclip makes of it: a successful run with usage and cost, in the init's session.
	got := p.ResultWithExitCode(0)
	want := &events.AgentResult{
		SessionID: evs[0].SessionID,
		Model:     "claude-opus-5",
		Usage:     &events.AgentUsage{InputTokens: 1020, OutputTokens: 100},
		CostUSD:   ptr(1020*inputPrice + 100*outputPrice),
		Summary:   "The stub read a prompt of 37 bytes and finished.",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("parsed result (-want +got):\n%s", diff)
	}
	if got.SessionID == "" {
		t.Error("no session id")
	}
}

func TestResumeKeepsTheSession(t *testing.T) {
	args := append([]string{"--resume", "6f1c2a9e-3b7d-4f0e-9a51-2d8c4e7b1a03"}, paperclipArgs...)
	stdout, _, err := stubRun(t, args, nil, prompt)
	if err != nil {
		t.Fatal(err)
	}
	events, p := parse(t, stdout)
	for _, ev := range events {
		if ev.SessionID != "6f1c2a9e-3b7d-4f0e-9a51-2d8c4e7b1a03" {
			t.Errorf("%s line in session %q", ev.Type, ev.SessionID)
		}
	}
	if got := p.ResultWithExitCode(0).SessionID; got != "6f1c2a9e-3b7d-4f0e-9a51-2d8c4e7b1a03" {
		t.Errorf("parsed session %q", got)
	}
}

// bridge is a fake of Paperclip's API as the in-sandbox bridge serves it.
type bridge struct {
	mu       sync.Mutex
	requests []string // method path auth body
	status   int      // for every request; 0: 200
}

func (b *bridge) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	b.mu.Lock()
	b.requests = append(b.requests, strings.Join([]string{r.Method, r.URL.EscapedPath(), r.Header.Get("Authorization"), r.Header.Get("Content-Type"), string(body)}, " "))
	status := b.status
	b.mu.Unlock()
	if status != 0 {
		http.Error(w, `{"error":"Agent authentication required"}`, status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/api/agents/me":
		_, _ = io.WriteString(w, `{"id":"ag-1","name":"CEO","role":"ceo"}`)
	case r.Method == http.MethodPatch && strings.HasPrefix(r.URL.Path, "/api/issues/"):
		_, _ = io.WriteString(w, `{"id":"is-1","status":"done"}`)
	default:
		http.NotFound(w, r)
	}
}

func (b *bridge) got() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.requests...)
}

func TestPaperclipBridgeCalls(t *testing.T) {
	tests := []struct {
		name      string
		taskID    string
		wantReqs  []string
		wantTexts []string
	}{
		{
			name: "heartbeat without a task only asks who it is",
			wantReqs: []string{
				"GET /api/agents/me Bearer pcb_token  ",
			},
			wantTexts: []string{`GET /api/agents/me: 200, agent "CEO" (ag-1)`},
		},
		{
			name:   "issue run closes its issue",
			taskID: "0b1c/2",
			wantReqs: []string{
				"GET /api/agents/me Bearer pcb_token  ",
				`PATCH /api/issues/0b1c%2F2 Bearer pcb_token application/json {"status":"done"}`,
			},
			wantTexts: []string{
				`GET /api/agents/me: 200, agent "CEO" (ag-1)`,
				`PATCH /api/issues/0b1c%2F2 {"status":"done"}: 200`,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := &bridge{}
			srv := httptest.NewServer(b)
			defer srv.Close()
			stdout, stderr, err := stubRun(t, paperclipArgs, map[string]string{
				"PAPERCLIP_API_URL": srv.URL + "/",
				"PAPERCLIP_API_KEY": "pcb_token",
				"PAPERCLIP_TASK_ID": tc.taskID,
			}, prompt)
			if err != nil {
				t.Fatalf("run: %v\nstderr: %s", err, stderr)
			}
			if diff := cmp.Diff(tc.wantReqs, b.got()); diff != "" {
				t.Errorf("requests (-want +got):\n%s", diff)
			}
			events, p := parse(t, stdout)
			all := texts(events)
			if len(all) != len(tc.wantTexts)+2 {
				t.Fatalf("assistant texts %q, want the prompt line, %d API lines and Done.", all, len(tc.wantTexts))
			}
			if diff := cmp.Diff(tc.wantTexts, all[1:len(all)-1]); diff != "" {
				t.Errorf("API lines (-want +got):\n%s", diff)
			}
			if res := p.ResultWithExitCode(0); res.IsError {
				t.Errorf("parsed result is an error: %+v", res)
			}
		})
	}
}

func TestPaperclipAPIFailureFailsTheRun(t *testing.T) {
	b := &bridge{status: http.StatusUnauthorized}
	srv := httptest.NewServer(b)
	defer srv.Close()
	stdout, _, err := stubRun(t, paperclipArgs, map[string]string{
		"PAPERCLIP_API_URL": srv.URL,
		"PAPERCLIP_API_KEY": "pcb_token",
		"PAPERCLIP_TASK_ID": "is-1",
	}, prompt)
	if err == nil {
		t.Fatal("run succeeded against an API that answers 401")
	}
	var stderr bytes.Buffer
	if code := exitCode(err, &stderr); code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	if !strings.Contains(stderr.String(), "GET /api/agents/me: 401 Unauthorized") {
		t.Errorf("stderr %q does not name the failed call", stderr.String())
	}
	if got := b.got(); len(got) != 1 {
		t.Errorf("requests after the failure: %q, want only the first", got)
	}
	events, p := parse(t, stdout)
	if last := events[len(events)-1]; last.Type != "result" || !last.IsError {
		t.Errorf("last line %+v, want an error result", last)
	}
	if res := p.ResultWithExitCode(1); !res.IsError {
		t.Errorf("parsed result %+v, want an error", res)
	}
}

func TestVersion(t *testing.T) {
	stdout, _, err := stubRun(t, []string{"--version"}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if stdout != Version+"\n" {
		t.Errorf("stdout %q, want %q", stdout, Version+"\n")
	}
}

func TestBadArgumentsExit2(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
	}{
		{"text output", []string{"--print", "hello"}, nil, "only writes stream-json"},
		{"stream-json without --verbose", []string{"-p", "--output-format", "stream-json"}, nil, "requires --verbose"},
		{"flag without its value", []string{"--output-format"}, nil, "needs a value"},
		{"bad interval", paperclipArgs, map[string]string{"CLAUDE_STUB_INTERVAL": "soon"}, "CLAUDE_STUB_INTERVAL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			stdout, _, err := stubRun(t, tc.args, tc.env, prompt)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
			if code := exitCode(err, io.Discard); code != 2 {
				t.Errorf("exit code %d, want 2", code)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
		})
	}
}

// timedWriter records each write and when it happened.
type timedWriter struct {
	mu     sync.Mutex
	times  []time.Time
	writes []string
}

func (w *timedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.times = append(w.times, time.Now())
	w.writes = append(w.writes, string(p))
	return len(p), nil
}

func TestLinesArePaced(t *testing.T) {
	const interval = 20 * time.Millisecond
	var out timedWriter
	environ := []string{"CLAUDE_STUB_INTERVAL=" + interval.String()}
	if err := run(t.Context(), paperclipArgs, environ, strings.NewReader(prompt), &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if len(out.times) != 4 {
		t.Fatalf("%d writes, want one per line (4)", len(out.times))
	}
	// Each line is its own write, at least one interval after the one before, and says when it
	// was written: after the write before it, not after its own (the stamp has milliseconds).
	for i := 1; i < len(out.times); i++ {
		if gap := out.times[i].Sub(out.times[i-1]); gap < interval {
			t.Errorf("line %d came %s after line %d, want >= %s", i+1, gap, i, interval)
		}
	}
	for i, w := range out.writes {
		var ev struct {
			Timestamp string `json:"timestamp"`
		}
		if err := json.Unmarshal([]byte(w), &ev); err != nil {
			t.Fatalf("line %d: %v", i+1, err)
		}
		ts, err := time.Parse(time.RFC3339Nano, ev.Timestamp)
		if err != nil {
			t.Fatalf("line %d: timestamp %q: %v", i+1, ev.Timestamp, err)
		}
		if ts.After(out.times[i]) || i > 0 && ts.Before(out.times[i-1].Truncate(time.Millisecond)) {
			t.Errorf("line %d stamped %s, written at %s (the line before at %s)", i+1, ts, out.times[i], out.times[max(i-1, 0)])
		}
	}
}

func ptr[T any](v T) *T { return &v }
