package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Version is what `claude --version` prints, in the real CLI's shape.
const Version = "2.0.0 (Claude Code stub)"

// defaultModel is the model reported when --model is not given.
const defaultModel = "claude-sonnet-4-5"

// apiTimeout bounds each call to Paperclip's API: the bridge itself gives up on a request after
// 30 s (PAPERCLIP_BRIDGE_RESPONSE_TIMEOUT_MS=30000).
const apiTimeout = 30 * time.Second

// usageError is a bad command line or environment (exit code 2).
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func isUsage(err error) bool {
	var u *usageError
	return errors.As(err, &u)
}

// options is what the command line asks for.
type options struct {
	version      bool
	outputFormat string
	verbose      bool
	model        string
	resume       string // session to continue
	prompt       string // positional prompt; stdin when empty
}

// valueFlags are the CLI's flags that take a value; the stub ignores all but --model,
// --resume and --output-format, but must not take their values for the prompt.
var valueFlags = map[string]bool{
	"--output-format": true, "--input-format": true, "--model": true, "--fallback-model": true,
	"--resume": true, "-r": true, "--session-id": true, "--allowedTools": true, "--allowed-tools": true,
	"--disallowedTools": true, "--disallowed-tools": true, "--append-system-prompt": true,
	"--append-system-prompt-file": true, "--system-prompt": true, "--system-prompt-file": true,
	"--mcp-config": true, "--add-dir": true, "--permission-mode": true, "--max-turns": true,
	"--settings": true, "--agents": true, "--setting-sources": true,
}

func parseArgs(args []string) (options, error) {
	o := options{outputFormat: "text", model: defaultModel}
	var positional []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, value, hasValue := strings.Cut(a, "=")
		if !strings.HasPrefix(a, "-") || a == "-" {
			positional = append(positional, a)
			continue
		}
		if a == "--" {
			positional = append(positional, args[i+1:]...)
			break
		}
		if valueFlags[name] && !hasValue {
			if i+1 == len(args) {
				return o, &usageError{fmt.Sprintf("option %s needs a value", name)}
			}
			i++
			value = args[i]
		}
		switch name {
		case "--version", "-v":
			o.version = true
		case "--verbose":
			o.verbose = true
		case "--output-format":
			o.outputFormat = value
		case "--model":
			o.model = value
		case "--resume", "-r":
			o.resume = value
		}
	}
	o.prompt = strings.Join(positional, " ")
	if o.version {
		return o, nil
	}
	if o.outputFormat != "stream-json" {
		return o, &usageError{fmt.Sprintf("--output-format %q: the stub only writes stream-json", o.outputFormat)}
	}
	// The real CLI refuses this combination with the same message.
	if !o.verbose {
		return o, &usageError{"When using --print, --output-format=stream-json requires --verbose"}
	}
	return o, nil
}

// config is what the environment asks for.
type config struct {
	interval time.Duration
	apiURL   string // Paperclip's API (the in-sandbox bridge); empty: no API calls
	apiKey   string
	taskID   string
	envDump  bool  // KUBECLIP_STUB_ENV_DUMP
	state    bool  // KUBECLIP_STUB_STATE
	filler   int64 // KUBECLIP_STUB_FILLER_BYTES
	links    bool  // KUBECLIP_STUB_LINKS
	paxFlood int64 // KUBECLIP_STUB_PAX_FLOOD
	model    bool  // KUBECLIP_STUB_MODEL_CALL
	search   *needle
}

// maxFiller bounds KUBECLIP_STUB_FILLER_BYTES.
const maxFiller = 1 << 30

// fillerLine is the size of one filler line, newline included (the last may be shorter).
const fillerLine = 64 << 10

func loadConfig(getenv func(string) string) (config, error) {
	c := config{interval: time.Second}
	if v := getenv("CLAUDE_STUB_INTERVAL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return c, &usageError{fmt.Sprintf("CLAUDE_STUB_INTERVAL=%q: want a Go duration >= 0", v)}
		}
		c.interval = d
	}
	if url, key := getenv("PAPERCLIP_API_URL"), getenv("PAPERCLIP_API_KEY"); url != "" && key != "" {
		c.apiURL, c.apiKey = strings.TrimRight(url, "/"), key
		c.taskID = getenv("PAPERCLIP_TASK_ID")
	}
	c.envDump = getenv(envDumpVar) != ""
	c.state = getenv(stateVar) != ""
	if v := getenv("KUBECLIP_STUB_FILLER_BYTES"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > maxFiller {
			return c, &usageError{fmt.Sprintf("KUBECLIP_STUB_FILLER_BYTES=%q: want a byte count from 0 to %d", v, maxFiller)}
		}
		c.filler = n
	}
	c.links = getenv(linksVar) != ""
	if v := getenv(paxFloodVar); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > maxFlood {
			return c, &usageError{fmt.Sprintf("%s=%q: want a byte count from 0 to %d", paxFloodVar, v, int64(maxFlood))}
		}
		c.paxFlood = n
	}
	c.model = getenv(modelCallVar) != ""
	if v := getenv(secretSearchVar); v != "" {
		nd, err := parseNeedle(v)
		if err != nil {
			return c, err
		}
		c.search = &nd
	}
	return c, nil
}

// run is the whole command: it returns a usageError for bad arguments, another error for a
// failed run (after its error result line), nil for a successful one.
func run(ctx context.Context, args, environ []string, stdin io.Reader, stdout, stderr io.Writer) error {
	getenv := func(name string) string { return lookup(environ, name) }
	if len(args) > 0 && args[0] == "setup-token" {
		return setupToken(stdin, stdout)
	}
	opts, err := parseArgs(args)
	if err != nil {
		return err
	}
	if opts.version {
		_, err := fmt.Fprintln(stdout, Version)
		return err
	}
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	prompt := opts.prompt
	if prompt == "" {
		b, err := io.ReadAll(stdin)
		if err != nil {
			return fmt.Errorf("reading the prompt from stdin: %w", err)
		}
		prompt = string(b)
	}
	s := &session{
		out:      stdout,
		interval: cfg.interval,
		id:       opts.resume,
		resumed:  opts.resume != "",
		model:    opts.model,
		start:    time.Now(),
		client:   &http.Client{Timeout: apiTimeout},
	}
	if s.id == "" {
		s.id = randomUUID()
	}
	return s.run(ctx, cfg, prompt, environ, stderr)
}

// session writes one run's stream.
type session struct {
	out      io.Writer
	interval time.Duration
	id       string
	resumed  bool // the command line named the session (--resume)
	model    string
	start    time.Time
	client   *http.Client
	turns    int // assistant messages so far
}

func (s *session) run(ctx context.Context, cfg config, prompt string, environ []string, stderr io.Writer) error {
	getenv := func(name string) string { return lookup(environ, name) }
	cwd, _ := os.Getwd()
	if err := s.emit(ctx, &initEvent{
		Type: "system", Subtype: "init", SessionID: s.id, Model: s.model, CWD: cwd,
		Tools: []string{"Bash", "Read", "Edit", "Write"}, MCPServers: []any{},
		PermissionMode: "default", APIKeySource: apiKeySource(getenv), UUID: randomUUID(),
	}); err != nil {
		return err
	}
	if cfg.envDump {
		if err := s.reportEnv(environ); err != nil {
			return err
		}
	}
	if _, err := fmt.Fprintf(stderr, "claude-stub: working on a prompt of %d bytes (session %s)\n", len(prompt), s.id); err != nil {
		return fmt.Errorf("writing stderr: %w", err)
	}
	if cfg.state {
		note, err := keepState(getenv("HOME"), cwd, getenv("PAPERCLIP_RUN_ID"), s.id, s.resumed)
		if err != nil {
			return err
		}
		if _, err := io.WriteString(stderr, note); err != nil {
			return fmt.Errorf("writing stderr: %w", err)
		}
	}
	if err := s.say(ctx, fmt.Sprintf("Received a prompt of %d bytes: %q", len(prompt), firstLine(prompt, 120))); err != nil {
		return err
	}
	if err := s.fill(cfg.filler); err != nil {
		return err
	}
	if cfg.apiURL != "" {
		if err := s.callPaperclip(ctx, cfg); err != nil {
			if emitErr := s.result(ctx, true, err.Error()); emitErr != nil {
				return errors.Join(err, emitErr)
			}
			return err
		}
	}
	var reply *modelReply
	var modelErr error
	if cfg.model {
		r, err := s.askModel(ctx, prompt, getenv)
		if err != nil {
			modelErr = err
		} else {
			reply = &r
		}
	}
	// The search runs after the model call, failed or not: whatever the call left behind is
	// searched too, and a failed call still reports what the pod holds.
	if cfg.search != nil {
		start := time.Now()
		ev := searchPod(*cfg.search, environ, "/", "/proc")
		ev.SearchDurationMS = time.Since(start).Milliseconds()
		if err := s.write(ev); err != nil {
			return err
		}
	}
	if modelErr != nil {
		if emitErr := s.result(ctx, true, modelErr.Error()); emitErr != nil {
			return errors.Join(modelErr, emitErr)
		}
		return modelErr
	}
	if err := s.say(ctx, "Done."); err != nil {
		return err
	}
	if cfg.links {
		if err := leaveLinks(cwd); err != nil {
			return err
		}
	}
	if cfg.paxFlood > 0 {
		if err := leaveFlood(cwd, cfg.paxFlood); err != nil {
			return err
		}
	}
	summary := fmt.Sprintf("The stub read a prompt of %d bytes and finished.", len(prompt))
	if cfg.filler > 0 {
		summary = fmt.Sprintf("The stub read a prompt of %d bytes, printed %d bytes of filler and finished.", len(prompt), cfg.filler)
	}
	if reply != nil {
		summary = fmt.Sprintf("The stub read a prompt of %d bytes, the model (%s) answered %q, and it finished.", len(prompt), reply.ID, reply.Text)
	}
	return s.result(ctx, false, summary)
}

// askModel makes the model call and reports the answer as an assistant line.
func (s *session) askModel(ctx context.Context, prompt string, getenv func(string) string) (modelReply, error) {
	client, err := newModelClient(getenv)
	if err != nil {
		return modelReply{}, err
	}
	defer client.CloseIdleConnections()
	r, err := callModel(ctx, client, getenv, s.model, prompt)
	if err != nil {
		return r, err
	}
	return r, s.say(ctx, fmt.Sprintf("The model (%s) answered: %s", r.ID, r.Text))
}

// reportEnv prints the stub's own environment report, then the sh wrapper's, with no pauses.
func (s *session) reportEnv(environ []string) error {
	if err := s.write(envReport("claude", slices.Clone(environ))); err != nil {
		return err
	}
	reports, err := shellReports(envDir(environ))
	if err != nil {
		return fmt.Errorf("reading the sh wrapper's reports: %w", err)
	}
	for _, r := range reports {
		if err := s.write(r); err != nil {
			return err
		}
	}
	return nil
}

// fillerEvent is one line of filler.
type fillerEvent struct {
	stamped
	Type    string `json:"type"`
	Subtype string `json:"subtype"`
	Seq     int    `json:"seq"`
	Filler  string `json:"filler"`
}

// fillerText is what filler lines are made of: words, as an agent's output is. (A long run of
// letters and digits, such as base64, is another test: Paperclip's log redaction takes time
// quadratic in the length of such a run.)
const fillerText = "The stub prints filler so that a test sees a large output through. "

// fill prints about n bytes of filler lines, fillerLine bytes each, with no pauses.
func (s *session) fill(n int64) error {
	pad := strings.Repeat(fillerText, fillerLine/len(fillerText)+1)
	for seq := 0; n > 0; seq++ {
		ev := &fillerEvent{Type: "system", Subtype: "kubeclip_filler", Seq: seq}
		ev.stamp(time.Now())
		empty, err := json.Marshal(ev)
		if err != nil {
			return fmt.Errorf("encoding a filler line: %w", err)
		}
		size := int(min(n, fillerLine))
		ev.Filler = pad[:max(0, size-len(empty)-1)]
		b, err := json.Marshal(ev)
		if err != nil {
			return fmt.Errorf("encoding a filler line: %w", err)
		}
		if _, err := s.out.Write(append(b, '\n')); err != nil {
			return fmt.Errorf("writing stdout: %w", err)
		}
		n -= int64(len(b) + 1)
	}
	return nil
}

// callPaperclip makes the calls an agent makes through Paperclip's bridge and reports each as
// assistant text.
func (s *session) callPaperclip(ctx context.Context, cfg config) error {
	var me struct {
		ID   string `json:"id"`
		Name string `json:"name"`
	}
	status, body, err := s.call(ctx, cfg, http.MethodGet, "/api/agents/me", nil)
	if err != nil {
		return err
	}
	_ = json.Unmarshal(body, &me) // the reply is reported whatever its shape
	if err := s.say(ctx, fmt.Sprintf("GET /api/agents/me: %d, agent %q (%s)", status, me.Name, me.ID)); err != nil {
		return err
	}
	if cfg.taskID == "" {
		return nil
	}
	p := "/api/issues/" + url.PathEscape(cfg.taskID)
	status, _, err = s.call(ctx, cfg, http.MethodPatch, p, []byte(`{"status":"done"}`))
	if err != nil {
		return err
	}
	return s.say(ctx, fmt.Sprintf(`PATCH %s {"status":"done"}: %d`, p, status))
}

// call sends one request to Paperclip's API; a transport error or a non-2xx status is an error.
func (s *session) call(ctx context.Context, cfg config, method, path string, body []byte) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, cfg.apiURL+path, rd)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+cfg.apiKey)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	reply, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("%s %s: reading the reply: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp.StatusCode, reply, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, firstLine(string(reply), 200))
	}
	return resp.StatusCode, reply, nil
}

// say emits an assistant message with one text block.
func (s *session) say(ctx context.Context, text string) error {
	s.turns++
	return s.emit(ctx, &assistantEvent{
		Type:      "assistant",
		SessionID: s.id,
		Message: message{
			ID: fmt.Sprintf("msg_stub_%02d", s.turns), Type: "message", Role: "assistant", Model: s.model,
			Content: []content{{Type: "text", Text: text}},
			Usage:   usage{InputTokens: 10, OutputTokens: int64(len(text)/4 + 1)},
		},
		ParentToolUseID: nil,
	})
}

// Token prices of the stub's pretend model, in USD per token (Sonnet's list prices).
const (
	inputPrice  = 3.0 / 1e6
	outputPrice = 15.0 / 1e6
)

func (s *session) result(ctx context.Context, isError bool, text string) error {
	in, out := int64(1000+10*s.turns), int64(50*s.turns)
	cost := float64(in)*inputPrice + float64(out)*outputPrice
	subtype := "success"
	if isError {
		subtype = "error_during_execution"
	}
	elapsed := time.Since(s.start).Milliseconds()
	return s.emit(ctx, &resultEvent{
		Type: "result", Subtype: subtype, IsError: isError,
		DurationMS: elapsed, DurationAPIMS: elapsed, NumTurns: s.turns,
		Result: text, SessionID: s.id, TotalCostUSD: cost,
		Usage: usage{InputTokens: in, OutputTokens: out},
		ModelUsage: map[string]modelUsage{s.model: {
			InputTokens: in, OutputTokens: out, CostUSD: cost,
		}},
		PermissionDenials: []any{},
		UUID:              randomUUID(),
	})
}

// emit writes one line after the session's pause (none before the first): each line goes out in
// one write as soon as it is made, as the real CLI streams, stamped with the time of the write.
func (s *session) emit(ctx context.Context, ev line) error {
	if _, ok := ev.(*initEvent); !ok {
		if err := sleep(ctx, s.interval); err != nil {
			return err
		}
	}
	return s.write(ev)
}

// write writes one line now, stamped with the time of the write.
func (s *session) write(ev line) error {
	ev.stamp(time.Now())
	b, err := json.Marshal(ev)
	if err != nil {
		return fmt.Errorf("encoding an event: %w", err)
	}
	if _, err := s.out.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("writing stdout: %w", err)
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// apiKeySource says where the real CLI would find its credentials; the stub needs none.
func apiKeySource(getenv func(string) string) string {
	if getenv("ANTHROPIC_API_KEY") != "" {
		return "ANTHROPIC_API_KEY"
	}
	return "none"
}

// firstLine is the first line of s, cut to n bytes.
func firstLine(s string, n int) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

// randomUUID returns a version 4 UUID, the shape of a real Claude Code session id.
func randomUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// The events, in the shape Claude Code writes them (the fields Paperclip's parser reads, and a
// few more so that the lines look like the real ones), plus the stub's own `timestamp`.

// line is one event of the stream.
type line interface{ stamp(time.Time) }

// stamped is the stub's addition to every line: when it was written (RFC 3339, UTC, to the
// millisecond), so that a test can tell how long the line took to reach Paperclip's run log.
// Paperclip's parser, like Claude Code's other readers, ignores fields it does not know.
type stamped struct {
	Timestamp string `json:"timestamp"`
}

func (s *stamped) stamp(t time.Time) { s.Timestamp = t.UTC().Format("2006-01-02T15:04:05.000Z07:00") }

type initEvent struct {
	stamped
	Type           string   `json:"type"`
	Subtype        string   `json:"subtype"`
	SessionID      string   `json:"session_id"`
	Model          string   `json:"model"`
	CWD            string   `json:"cwd"`
	Tools          []string `json:"tools"`
	MCPServers     []any    `json:"mcp_servers"`
	PermissionMode string   `json:"permissionMode"`
	APIKeySource   string   `json:"apiKeySource"`
	UUID           string   `json:"uuid"`
}

type assistantEvent struct {
	stamped
	Type            string  `json:"type"`
	Message         message `json:"message"`
	ParentToolUseID *string `json:"parent_tool_use_id"`
	SessionID       string  `json:"session_id"`
}

type message struct {
	ID         string    `json:"id"`
	Type       string    `json:"type"`
	Role       string    `json:"role"`
	Model      string    `json:"model"`
	Content    []content `json:"content"`
	StopReason *string   `json:"stop_reason"`
	Usage      usage     `json:"usage"`
}

type content struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type resultEvent struct {
	stamped
	Type              string                `json:"type"`
	Subtype           string                `json:"subtype"`
	IsError           bool                  `json:"is_error"`
	DurationMS        int64                 `json:"duration_ms"`
	DurationAPIMS     int64                 `json:"duration_api_ms"`
	NumTurns          int                   `json:"num_turns"`
	Result            string                `json:"result"`
	SessionID         string                `json:"session_id"`
	TotalCostUSD      float64               `json:"total_cost_usd"`
	Usage             usage                 `json:"usage"`
	ModelUsage        map[string]modelUsage `json:"modelUsage"`
	PermissionDenials []any                 `json:"permission_denials"`
	UUID              string                `json:"uuid"`
}

type usage struct {
	InputTokens              int64 `json:"input_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
}

type modelUsage struct {
	InputTokens              int64   `json:"inputTokens"`
	OutputTokens             int64   `json:"outputTokens"`
	CacheReadInputTokens     int64   `json:"cacheReadInputTokens"`
	CacheCreationInputTokens int64   `json:"cacheCreationInputTokens"`
	CostUSD                  float64 `json:"costUSD"`
}
