package paperclip

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// server is one running Paperclip instance (hack/paperclip/paperclip.sh): `paperclipai
// test-drive` with a fresh data dir, its company and its CEO agent, in local_trusted mode (its
// API needs no credentials from loopback).
type server struct {
	root   string
	script string
	state  string

	URL       string
	CompanyID string
	AgentID   string
	LogPath   string

	client *http.Client
	// serverEnv is added to the server's environment at start (paperclip.sh's
	// KUBECLIP_PAPERCLIP_SERVER_ENV).
	serverEnv string
}

// serverMarker is a key only the server's environment has, which the operator allows into pods
// (operatorEnvAdditions): the environment reports that carry it are of Paperclip's probes, the
// executes the host sends with its server's whole environment.
const serverMarker = "KUBECLIP_E2E_SERVER_MARKER"

// operatorEnvAdditions is the plugin's executeEnv of every test (configurePlugin): the default
// allowlist, plus the stub's variables (set in the agent's adapterConfig.env) and serverMarker.
var operatorEnvAdditions = map[string]any{"allow": []string{"KUBECLIP_STUB_*", serverMarker}}

// serverSecrets are Paperclip's own server secrets, given known values at start so that the
// tests can look for them where they must never be (anything the plugin sends to kubeclip).
var serverSecrets = map[string]string{
	"PAPERCLIP_AGENT_JWT_SECRET":           "kubeclip-test-jwt-secret-5f1c0e7a",
	"PAPERCLIP_TOOL_ACTION_SIGNING_SECRET": "kubeclip-test-signing-secret-9b2d4c6e",
	"BETTER_AUTH_SECRET":                   "kubeclip-test-better-auth-3a8e1f20",
}

// startServer installs Paperclip (cached after the first time), starts an instance, installs the
// plugin from this checkout into it, and stops it when the test ends. Its server log joins the
// workers' logs when the test fails.
func startServer(t *testing.T) *server {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	state, err := os.MkdirTemp("", "kubeclip-paperclip-")
	if err != nil {
		t.Fatal(err)
	}
	s := &server{root: root, script: filepath.Join(root, "hack", "paperclip", "paperclip.sh"), state: state, client: &http.Client{Timeout: 30 * time.Second}}
	var pairs []string
	for k, v := range serverSecrets {
		pairs = append(pairs, k+"="+v)
	}
	pairs = append(pairs, serverMarker+"=1")
	s.serverEnv = strings.Join(pairs, " ")
	ctx := t.Context()
	start := time.Now()
	if _, err := s.sh(ctx, "install"); err != nil {
		t.Fatalf("installing Paperclip: %v", err)
	}
	installed := time.Since(start)
	out, err := s.sh(ctx, "start")
	t.Cleanup(func() {
		if t.Failed() {
			keep := filepath.Join(env.LogDir, "paperclip-server.log")
			if data, err := os.ReadFile(s.LogPath); err == nil {
				_ = os.WriteFile(keep, data, 0o644)
				t.Logf("Paperclip's server log: %s", keep)
			}
		}
		stopCtx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := s.sh(stopCtx, "stop"); err != nil {
			t.Errorf("stopping Paperclip: %v", err)
		}
		_ = os.RemoveAll(state)
	})
	if err != nil {
		t.Fatalf("starting Paperclip: %v", err)
	}
	vars := parseEnv(out)
	s.URL, s.CompanyID, s.AgentID, s.LogPath = vars["PAPERCLIP_URL"], vars["PAPERCLIP_COMPANY_ID"], vars["PAPERCLIP_AGENT_ID"], vars["PAPERCLIP_LOG"]
	if !strings.HasPrefix(s.URL, "http://127.0.0.1:") || s.CompanyID == "" || s.AgentID == "" || s.LogPath == "" {
		t.Fatalf("paperclip.sh start printed no URL, company, agent or log:\n%s", out)
	}
	started := time.Since(start) - installed
	if _, err := s.sh(ctx, "plugin-install", filepath.Join(root, "plugins", "paperclip")); err != nil {
		t.Fatalf("installing the plugin into Paperclip: %v", err)
	}
	t.Logf("Paperclip %s: install %s, start %s, plugin install %s", s.URL, installed.Round(time.Second), started.Round(time.Second),
		(time.Since(start) - installed - started).Round(time.Second))
	return s
}

// sh runs paperclip.sh with args against this instance and returns its stdout; its stderr is in
// the error.
func (s *server) sh(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", append([]string{s.script}, args...)...)
	cmd.Env = append(os.Environ(), "KUBECLIP_PAPERCLIP_STATE="+s.state, "KUBECLIP_PAPERCLIP_SERVER_ENV="+s.serverEnv)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("paperclip.sh %s: %w\n%s", strings.Join(args, " "), err, lastLines(stderr.String(), 40))
	}
	return stdout.String(), nil
}

// apiError is a response with an unexpected status.
type apiError struct {
	Status int
	Body   string
}

func (e *apiError) Error() string { return fmt.Sprintf("HTTP %d: %s", e.Status, cut(e.Body, 500)) }

// call sends a JSON request to Paperclip's API (path under /api) and decodes a 2xx answer into
// out (when not nil); another status is an *apiError.
func (s *server) call(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.URL+"/api"+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("%s %s: %w", method, path, &apiError{Status: resp.StatusCode, Body: string(data)})
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decoding %s: %w", method, path, cut(string(data), 300), err)
	}
	return nil
}

// must is call that fails the test on error.
func (s *server) must(t *testing.T, method, path string, body, out any) {
	t.Helper()
	if err := s.call(t.Context(), method, path, body, out); err != nil {
		t.Fatal(err)
	}
}

// pluginKey is the plugin's id in its manifest (plugins/paperclip/src/manifest.ts).
const pluginKey = "kubeclip.paperclip-sandbox-provider"

// configurePlugin saves the plugin's settings for the company, as an instance admin does (the
// operator's: kubeclip's connection lives only there); Paperclip delivers them to the worker.
func (s *server) configurePlugin(t *testing.T, settings map[string]any) {
	t.Helper()
	if _, ok := settings["executeEnv"]; !ok {
		settings = maps.Clone(settings)
		settings["executeEnv"] = operatorEnvAdditions
	}
	s.must(t, http.MethodPost, "/plugins/"+pluginKey+"/config", map[string]any{"companyId": s.CompanyID, "configJson": settings}, nil)
}

// environment is a Paperclip execution environment.
type environment struct {
	ID     string         `json:"id"`
	Driver string         `json:"driver"`
	Config map[string]any `json:"config"`
}

// createEnvironment creates a sandbox environment of the plugin's provider with config (the
// "provider" key is added).
func (s *server) createEnvironment(t *testing.T, name string, config map[string]any) environment {
	t.Helper()
	cfg := map[string]any{"provider": "kubernetes"}
	for k, v := range config {
		cfg[k] = v
	}
	var e environment
	s.must(t, http.MethodPost, "/companies/"+s.CompanyID+"/environments", map[string]any{"name": name, "driver": "sandbox", "config": cfg}, &e)
	return e
}

// useEnvironment makes envID the agent's default environment, with the claude_local adapter's
// CLI engine (its default, ACP, needs claude-agent-acp, which the sandbox image does not have).
func (s *server) useEnvironment(t *testing.T, envID string) {
	t.Helper()
	var agent struct {
		AdapterType   string         `json:"adapterType"`
		AdapterConfig map[string]any `json:"adapterConfig"`
	}
	s.must(t, http.MethodGet, "/agents/"+s.AgentID, nil, &agent)
	if agent.AdapterType != "claude_local" {
		t.Fatalf("test-drive's agent has adapter %q, want claude_local", agent.AdapterType)
	}
	agent.AdapterConfig["engine"] = "cli"
	// Every run's agent reports its environment, and so does the image's sh wrapper for each
	// shell (tests/images/claude-stub/envdump.go): names and hashes, never values.
	setEnv(agent.AdapterConfig, map[string]string{stubEnvDump: "1"})
	s.must(t, http.MethodPatch, "/agents/"+s.AgentID, map[string]any{"defaultEnvironmentId": envID, "adapterConfig": agent.AdapterConfig}, nil)
}

// stubEnvDump turns on the stub's environment reports (tests/images/claude-stub).
const stubEnvDump = "KUBECLIP_STUB_ENV_DUMP"

// setAgentEnv sets (or, for an empty value, removes) variables of the agent's adapterConfig.env,
// which the claude_local adapter passes into the agent command's environment.
func (s *server) setAgentEnv(t *testing.T, vars map[string]string) {
	t.Helper()
	var agent struct {
		AdapterConfig map[string]any `json:"adapterConfig"`
	}
	s.must(t, http.MethodGet, "/agents/"+s.AgentID, nil, &agent)
	setEnv(agent.AdapterConfig, vars)
	s.must(t, http.MethodPatch, "/agents/"+s.AgentID, map[string]any{"adapterConfig": agent.AdapterConfig}, nil)
}

// setEnv sets vars in an adapterConfig's env as Paperclip's plain bindings (empty: removed).
func setEnv(adapterConfig map[string]any, vars map[string]string) {
	env, _ := adapterConfig["env"].(map[string]any)
	if env == nil {
		env = map[string]any{}
	}
	for k, v := range vars {
		if v == "" {
			delete(env, k)
		} else {
			env[k] = map[string]any{"type": "plain", "value": v}
		}
	}
	adapterConfig["env"] = env
}

// runRecord is Paperclip's heartbeat run record, the fields the tests read.
type runRecord struct {
	ID               string     `json:"id"`
	Status           string     `json:"status"`
	InvocationSource string     `json:"invocationSource"`
	Error            *string    `json:"error"`
	ErrorCode        *string    `json:"errorCode"`
	ExitCode         *int       `json:"exitCode"`
	StartedAt        *time.Time `json:"startedAt"`
	FinishedAt       *time.Time `json:"finishedAt"`
	SessionIDAfter   *string    `json:"sessionIdAfter"`
	Usage            *struct {
		InputTokens        int64   `json:"inputTokens"`
		OutputTokens       int64   `json:"outputTokens"`
		CachedInputTokens  int64   `json:"cachedInputTokens"`
		CostUSD            float64 `json:"costUsd"`
		Model              string  `json:"model"`
		PersistedSessionID string  `json:"persistedSessionId"`
	} `json:"usageJson"`
	Result *struct {
		Result       string  `json:"result"`
		SessionID    string  `json:"session_id"`
		Subtype      string  `json:"subtype"`
		IsError      bool    `json:"is_error"`
		TotalCostUSD float64 `json:"total_cost_usd"`
	} `json:"resultJson"`
	ContextSnapshot struct {
		IssueID string `json:"issueId"`
	} `json:"contextSnapshot"`
}

func (r runRecord) terminal() bool {
	switch r.Status {
	case "queued", "running", "":
		return false
	}
	return true
}

func (s *server) run(t *testing.T, id string) runRecord {
	t.Helper()
	var r runRecord
	s.must(t, http.MethodGet, "/heartbeat-runs/"+id, nil, &r)
	return r
}

// waitRun waits until run id is no longer queued or running.
func (s *server) waitRun(t *testing.T, id string, timeout time.Duration) runRecord {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		r := s.run(t, id)
		if r.terminal() {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s still %s after %s", id, r.Status, timeout)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// waitIdle waits until none of the company's runs is queued or running (a finished run can
// schedule a follow-up; the next test's run must not queue behind it).
func (s *server) waitIdle(t *testing.T, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var runs []runRecord
		s.must(t, http.MethodGet, "/companies/"+s.CompanyID+"/heartbeat-runs?limit=50", nil, &runs)
		busy := ""
		for _, r := range runs {
			if !r.terminal() {
				busy = r.ID + " " + r.Status
			}
		}
		if busy == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s after %s", busy, timeout)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// invoke starts a heartbeat run of the agent through the API.
func (s *server) invoke(t *testing.T) string {
	t.Helper()
	var r runRecord
	s.must(t, http.MethodPost, "/agents/"+s.AgentID+"/heartbeat/invoke", map[string]any{}, &r)
	if r.ID == "" {
		t.Fatal("heartbeat/invoke answered no run id")
	}
	return r.ID
}

// logEntry is one chunk of a run's log as Paperclip stored it.
type logEntry struct {
	TS     time.Time `json:"ts"`
	Stream string    `json:"stream"`
	Chunk  string    `json:"chunk"`
	Seq    int       `json:"seq"`
}

// runLog returns the run's log so far (nothing before its first chunk: the route is 404 then).
func (s *server) runLog(t *testing.T, id string) []logEntry {
	t.Helper()
	var l struct {
		Content string `json:"content"`
	}
	if err := s.call(t.Context(), http.MethodGet, "/heartbeat-runs/"+id+"/log", nil, &l); err != nil {
		var ae *apiError
		if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
			return nil
		}
		t.Fatal(err)
	}
	// The server reads the log file while the run appends to it: a last line without its newline
	// may be cut mid-way. Such a fragment is the next read's.
	content := l.Content
	if i := strings.LastIndexByte(content, '\n'); i < len(content)-1 && !json.Valid([]byte(content[i+1:])) {
		content = content[:i+1]
	}
	var out []logEntry
	sc := bufio.NewScanner(strings.NewReader(content))
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var e logEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("run %s log line %q: %v", id, cut(sc.Text(), 200), err)
		}
		out = append(out, e)
	}
	return out
}

// leaseRecord is Paperclip's environment lease, the fields the tests read.
type leaseRecord struct {
	ID              string     `json:"id"`
	Status          string     `json:"status"`
	HeartbeatRunID  string     `json:"heartbeatRunId"`
	ProviderLeaseID string     `json:"providerLeaseId"`
	ExpiresAt       *time.Time `json:"expiresAt"`
	ReleasedAt      *time.Time `json:"releasedAt"`
	CleanupStatus   *string    `json:"cleanupStatus"`
	Metadata        struct {
		RemoteCwd string `json:"remoteCwd"`
		Kubeclip  struct {
			RunID        string `json:"runId"`
			CompanyID    string `json:"companyId"`
			Namespace    string `json:"namespace"`
			WorkloadName string `json:"workloadName"`
			Backend      string `json:"backend"`
		} `json:"kubeclip"`
		// Termination is the provider's receipt, as Paperclip recorded it.
		Termination *struct {
			State           string `json:"state"`
			ProviderLeaseID string `json:"providerLeaseId"`
			RunID           string `json:"runId"`
		} `json:"remoteExecutionTermination"`
	} `json:"metadata"`
}

// leaseOf waits until the run's lease in envID is no longer active and returns it.
func (s *server) leaseOf(t *testing.T, envID, runID string, timeout time.Duration) leaseRecord {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var leases []leaseRecord
		s.must(t, http.MethodGet, "/environments/"+envID+"/leases", nil, &leases)
		for _, l := range leases {
			if l.HeartbeatRunID == runID && l.Status != "active" && l.Status != "pending" {
				return l
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s: no ended lease in environment %s after %s: %+v", runID, envID, timeout, leases)
		}
		time.Sleep(300 * time.Millisecond)
	}
}

// pluginLog returns the plugin's log records with message msg whose runId is runID, from
// Paperclip's server log (Paperclip logs each with the record's fields as JSON).
func (s *server) pluginLog(t *testing.T, msg, runID string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(s.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	marker := "[plugin] " + msg + " {"
	var out []map[string]any
	for _, line := range strings.Split(ansi.ReplaceAllString(string(data), ""), "\n") {
		i := strings.Index(line, marker)
		if i < 0 {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line[i+len(marker)-1:]), &rec); err != nil {
			t.Fatalf("plugin log line %q: %v", cut(line, 300), err)
		}
		if rec["runId"] == runID {
			out = append(out, rec)
		}
	}
	return out
}

var ansi = regexp.MustCompile(`\x1b\[[0-9;]*m`)

func parseEnv(text string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			out[k] = v
		}
	}
	return out
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func cut(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// repoRoot is the directory of go.mod above the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		up := filepath.Dir(dir)
		if up == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = up
	}
}
