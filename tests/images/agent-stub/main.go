// Command agent-stub stands in for an agent runtime (Claude Code with --output-format stream-json)
// in the cluster tests. It is installed as /usr/local/bin/paperclip-agent-shim in the image
// kubeclip.local/agent-stub:dev.
//
// Environment variables shape the run:
//
//	STUB_LINES          number of assistant lines (default 3)
//	STUB_INTERVAL       Go duration between lines, or between bursts (default 0)
//	STUB_BURST          lines per burst, printed with no pause inside a burst (default 1)
//	STUB_STDERR         a line written to stderr after the init line
//	STUB_SLEEP          Go duration to sleep before exiting (default 0)
//	STUB_EXIT_CODE      exit code (default 0)
//	STUB_OOM            "true": after the assistant lines, allocate memory until OOM-killed
//	STUB_RESULT         "false": do not print the final result line (default true)
//	STUB_SESSION_ID     session id (default: a random UUID)
//	STUB_MODEL          model name (default claude-sonnet-4-5)
//	STUB_COST_USD       total_cost_usd (default 0.0123)
//	STUB_INPUT_TOKENS   usage.input_tokens (default 1000)
//	STUB_OUTPUT_TOKENS  usage.output_tokens (default 200)
//	STUB_CACHED_TOKENS  usage.cache_read_input_tokens (default 0)
//	STUB_IS_ERROR       "true": the result is an error_during_execution
//	STUB_SUBTYPE        the result's subtype, such as error_max_turns (default: success, or
//	                    error_during_execution with STUB_IS_ERROR); is_error stays as STUB_IS_ERROR
//
// Each stdout line is one JSON object; each burst of lines goes out in a single write. Assistant
// line i (from 1) carries the text "stub line <i>", unique per line. The stub writes no
// file, so it runs with a read-only root filesystem as any UID. It is PID 1 in its container
// (the test image's tini only execs it), so it handles SIGTERM and SIGINT itself and exits with
// 128+signal.
package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

func main() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		sig := <-sigs
		os.Exit(128 + int(sig.(syscall.Signal)))
	}()

	cfg, err := loadConfig(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "agent-stub:", err)
		os.Exit(2)
	}
	if err := run(context.Background(), cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "agent-stub:", err)
		os.Exit(1)
	}
	os.Exit(cfg.exitCode)
}

type config struct {
	lines        int
	interval     time.Duration
	burst        int
	stderr       string
	sleep        time.Duration
	exitCode     int
	oom          bool
	result       bool
	sessionID    string
	model        string
	costUSD      float64
	inputTokens  int64
	outputTokens int64
	cachedTokens int64
	isError      bool
	subtype      string
}

// loadConfig reads the STUB_* variables; an unparsable value is an error naming the variable.
func loadConfig(getenv func(string) string) (config, error) {
	cfg := config{
		lines: 3, burst: 1, result: true, model: "claude-sonnet-4-5", costUSD: 0.0123,
		inputTokens: 1000, outputTokens: 200,
	}
	var errs []error
	parse := func(key string, set func(string) error) {
		if v := getenv(key); v != "" {
			if err := set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", key, v, err))
			}
		}
	}
	nonNegInt := func(dst *int) func(string) error {
		return func(v string) error {
			n, err := strconv.Atoi(v)
			if err == nil && n < 0 {
				err = fmt.Errorf("must be >= 0")
			}
			*dst = n
			return err
		}
	}
	int64Var := func(dst *int64) func(string) error {
		return func(v string) (err error) { *dst, err = strconv.ParseInt(v, 10, 64); return err }
	}
	duration := func(dst *time.Duration) func(string) error {
		return func(v string) (err error) { *dst, err = time.ParseDuration(v); return err }
	}
	boolean := func(dst *bool) func(string) error {
		return func(v string) (err error) { *dst, err = strconv.ParseBool(v); return err }
	}
	parse("STUB_LINES", nonNegInt(&cfg.lines))
	parse("STUB_INTERVAL", duration(&cfg.interval))
	parse("STUB_BURST", nonNegInt(&cfg.burst))
	parse("STUB_SLEEP", duration(&cfg.sleep))
	parse("STUB_EXIT_CODE", func(v string) (err error) { cfg.exitCode, err = strconv.Atoi(v); return err })
	parse("STUB_OOM", boolean(&cfg.oom))
	parse("STUB_RESULT", boolean(&cfg.result))
	parse("STUB_IS_ERROR", boolean(&cfg.isError))
	parse("STUB_SUBTYPE", func(v string) error { cfg.subtype = v; return nil })
	parse("STUB_COST_USD", func(v string) (err error) { cfg.costUSD, err = strconv.ParseFloat(v, 64); return err })
	parse("STUB_INPUT_TOKENS", int64Var(&cfg.inputTokens))
	parse("STUB_OUTPUT_TOKENS", int64Var(&cfg.outputTokens))
	parse("STUB_CACHED_TOKENS", int64Var(&cfg.cachedTokens))
	cfg.stderr = getenv("STUB_STDERR")
	if v := getenv("STUB_MODEL"); v != "" {
		cfg.model = v
	}
	cfg.sessionID = getenv("STUB_SESSION_ID")
	if len(errs) > 0 {
		return cfg, errs[0]
	}
	if cfg.burst == 0 {
		cfg.burst = 1
	}
	if cfg.exitCode < 0 || cfg.exitCode > 255 {
		return cfg, fmt.Errorf("STUB_EXIT_CODE=%d: must be 0..255", cfg.exitCode)
	}
	if cfg.sessionID == "" {
		cfg.sessionID = randomUUID()
	}
	return cfg, nil
}

type initEvent struct {
	Type      string `json:"type"`
	Subtype   string `json:"subtype"`
	SessionID string `json:"session_id"`
	Model     string `json:"model"`
}

type assistantEvent struct {
	Type      string  `json:"type"`
	SessionID string  `json:"session_id"`
	Message   message `json:"message"`
}

type message struct {
	ID      string    `json:"id"`
	Content []content `json:"content"`
}

type content struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type resultEvent struct {
	Type         string                `json:"type"`
	Subtype      string                `json:"subtype"`
	IsError      bool                  `json:"is_error"`
	DurationMS   int64                 `json:"duration_ms"`
	NumTurns     int                   `json:"num_turns"`
	SessionID    string                `json:"session_id"`
	Result       string                `json:"result"`
	TotalCostUSD float64               `json:"total_cost_usd"`
	Usage        usage                 `json:"usage"`
	ModelUsage   map[string]modelUsage `json:"modelUsage"`
}

type usage struct {
	InputTokens              int64 `json:"input_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
	OutputTokens             int64 `json:"output_tokens"`
}

type modelUsage struct {
	InputTokens              int64 `json:"inputTokens"`
	OutputTokens             int64 `json:"outputTokens"`
	CacheReadInputTokens     int64 `json:"cacheReadInputTokens"`
	CacheCreationInputTokens int64 `json:"cacheCreationInputTokens"`
}

// run writes the stream to stdout and stderr. It returns only I/O errors; the exit code is the
// caller's.
func run(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	start := time.Now()
	// Lines are collected and written together: one write per burst, so a burst reaches the log
	// as one chunk and lines never interleave.
	var pending []byte
	emit := func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("encoding event: %w", err)
		}
		pending = append(append(pending, b...), '\n')
		return nil
	}
	flush := func() error {
		if len(pending) == 0 {
			return nil
		}
		_, err := stdout.Write(pending)
		pending = pending[:0]
		if err != nil {
			return fmt.Errorf("writing stdout: %w", err)
		}
		return nil
	}

	if err := emit(initEvent{Type: "system", Subtype: "init", SessionID: cfg.sessionID, Model: cfg.model}); err != nil {
		return err
	}
	if err := flush(); err != nil {
		return err
	}
	if cfg.stderr != "" {
		if _, err := io.WriteString(stderr, cfg.stderr+"\n"); err != nil {
			return fmt.Errorf("writing stderr: %w", err)
		}
	}
	for i := 1; i <= cfg.lines; i++ {
		if i > 1 && (i-1)%cfg.burst == 0 {
			if err := flush(); err != nil {
				return err
			}
			if err := sleep(ctx, cfg.interval); err != nil {
				return err
			}
		}
		if err := emit(assistantEvent{
			Type:      "assistant",
			SessionID: cfg.sessionID,
			Message: message{
				ID:      fmt.Sprintf("msg_%d", i),
				Content: []content{{Type: "text", Text: fmt.Sprintf("stub line %d", i)}},
			},
		}); err != nil {
			return err
		}
	}
	if err := flush(); err != nil {
		return err
	}
	if cfg.oom {
		exhaustMemory()
	}
	if cfg.result {
		subtype := "success"
		if cfg.isError {
			subtype = "error_during_execution"
		}
		if cfg.subtype != "" {
			subtype = cfg.subtype
		}
		if err := emit(resultEvent{
			Type:         "result",
			Subtype:      subtype,
			IsError:      cfg.isError,
			DurationMS:   time.Since(start).Milliseconds(),
			NumTurns:     1,
			SessionID:    cfg.sessionID,
			Result:       fmt.Sprintf("stub finished after %d lines", cfg.lines),
			TotalCostUSD: cfg.costUSD,
			Usage: usage{
				InputTokens:          cfg.inputTokens,
				CacheReadInputTokens: cfg.cachedTokens,
				OutputTokens:         cfg.outputTokens,
			},
			ModelUsage: map[string]modelUsage{cfg.model: {
				InputTokens:          cfg.inputTokens,
				OutputTokens:         cfg.outputTokens,
				CacheReadInputTokens: cfg.cachedTokens,
			}},
		}); err != nil {
			return err
		}
		if err := flush(); err != nil {
			return err
		}
	}
	return sleep(ctx, cfg.sleep)
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

// exhaustMemory allocates and touches memory until the kernel's OOM killer ends the process.
func exhaustMemory() {
	const chunk = 16 << 20
	var hold [][]byte
	for {
		b := make([]byte, chunk)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		hold = append(hold, b)
		runtime.KeepAlive(hold) // keep every chunk reachable: freed memory would not count
	}
}

// randomUUID returns a version 4 UUID, the shape of a real Claude Code session id.
func randomUUID() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
