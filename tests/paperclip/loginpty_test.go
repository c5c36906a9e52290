package paperclip

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
)

// loginSandboxImageVar names a sandbox image for the login test instead of sandboxImage: one
// whose claude stub has `setup-token` (tests/images/claude-stub), while the cluster's is older.
const loginSandboxImageVar = "KUBECLIP_LOGIN_SANDBOX_IMAGE"

// setupTokenSession is Paperclip's public view of a setup-token login session.
type setupTokenSession struct {
	SessionID string `json:"sessionId"`
	Status    string `json:"status"`
	Failure   *struct {
		Reason  string  `json:"reason"`
		Message *string `json:"message"`
	} `json:"failure"`
}

// TestPaperclipLoginPty drives Claude's in-product setup-token login through Paperclip's API on
// a kubeclip environment, as the board's login panel does: Paperclip acquires a lease (no agent)
// through the plugin, opens a login terminal on it (loginPtyOpen: `claude setup-token` on a
// sandboxd pty in the lease's pod), reads the sign-in URL from the terminal's output, types the
// browser code into it (loginPtyInput), reads the token from the success screen, stores it as
// the company's secret, closes the terminal and releases the lease. The pod's claude is the stub,
// whose token is StubSetupToken(code).
//
// The pods need a sandboxd with terminals (KUBECLIP_SANDBOXD_IMAGE, as for the sync test) and a
// sandbox image whose stub has setup-token (loginSandboxImageVar, or the cluster's once rebuilt).
func TestPaperclipLoginPty(t *testing.T) {
	cs := clustertest.Clientset(t)
	pc := startServer(t)
	pt.CleanupTenant(t, cs, pc.CompanyID)
	pc.configurePlugin(t, map[string]any{"natsUrl": env.NATS.URL()})
	cfg := environmentConfig("pod", false)
	if img := os.Getenv(loginSandboxImageVar); img != "" {
		cfg["adapters"].([]any)[0].(map[string]any)["runtimeImage"] = img
	}
	e := pc.createEnvironment(t, "kubeclip-login", cfg)
	base := "/companies/" + pc.CompanyID + "/setup-token-login-sessions"

	start := time.Now()
	var s setupTokenSession
	pc.must(t, http.MethodPost, base, map[string]any{"environmentId": e.ID, "adapterType": "claude_local"}, &s)
	if s.SessionID == "" {
		t.Fatalf("the start answered no session: %+v", s)
	}
	state := func() setupTokenSession {
		t.Helper()
		var got setupTokenSession
		pc.must(t, http.MethodGet, base+"/"+s.SessionID, nil, &got)
		return got
	}
	terminal := func(st setupTokenSession) bool {
		return st.Status == "failed" || st.Status == "timed_out" || st.Status == "cancelled"
	}

	// The sign-in URL, read by Paperclip from the terminal's output (the pod's first start takes
	// its image pull and scheduling).
	var prompt struct {
		AuthorizationURL string `json:"authorizationUrl"`
	}
	for deadline := time.Now().Add(3 * time.Minute); ; {
		err := pc.call(t.Context(), http.MethodGet, base+"/"+s.SessionID+"/prompt", nil, &prompt)
		if err == nil {
			break
		}
		var ae *apiError
		if !errors.As(err, &ae) || ae.Status != http.StatusNotFound {
			t.Fatalf("reading the prompt: %v", err)
		}
		if st := state(); terminal(st) || time.Now().After(deadline) {
			t.Fatalf("no sign-in prompt after %s: session %s is %q (failure %s)", time.Since(start).Round(time.Second), st.SessionID, st.Status, failureText(st))
		}
		time.Sleep(250 * time.Millisecond)
	}
	prompted := time.Since(start)
	if !strings.HasPrefix(prompt.AuthorizationURL, "https://claude.com/cai/oauth/authorize?client_id=kubeclip-stub&") {
		t.Errorf("the prompt's URL is %q, want the stub's", prompt.AuthorizationURL)
	}

	const code = "kubeclip-browser-code-4711"
	pc.must(t, http.MethodPost, base+"/"+s.SessionID+"/code", map[string]any{"browserCode": code}, nil)
	var st setupTokenSession
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(250 * time.Millisecond) {
		st = state()
		if st.Status == "authenticated" {
			break
		}
		if terminal(st) || time.Now().After(deadline) {
			t.Fatalf("after the code the session is %q (failure %s), want authenticated", st.Status, failureText(st))
		}
	}
	t.Logf("setup-token login on kubeclip: prompt after %s, authenticated %s after it", prompted.Round(time.Millisecond), (time.Since(start) - prompted).Round(time.Millisecond))

	// The token went into the company's secret, not anywhere it can be read back here.
	var stored struct {
		SecretID      string `json:"secretId"`
		LatestVersion int    `json:"latestVersion"`
	}
	pc.must(t, http.MethodGet, "/companies/"+pc.CompanyID+"/claude-oauth-token-status", nil, &stored)
	if stored.SecretID == "" || stored.LatestVersion < 1 {
		t.Errorf("claude-oauth-token-status = %+v, want a stored secret", stored)
	}

	// The plugin's side: one terminal, ended by the command's own exit 0, the lease released;
	// neither the code nor the token in Paperclip's log (the plugin's lines included).
	var ended []map[string]any
	for deadline := time.Now().Add(30 * time.Second); len(ended) == 0 && time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		ended = pluginLines(t, pc, "login terminal ended")
	}
	if len(ended) != 1 || num(ended[0]["exitCode"]) != 0 || ended[0]["loginCommandKey"] != "claude" {
		t.Errorf("plugin log 'login terminal ended': %v, want one, loginCommandKey claude, exitCode 0", ended)
	}
	data, err := os.ReadFile(pc.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(code))
	token := "sk-ant-oat01-kubeclipstub" + hex.EncodeToString(sum[:16])
	for _, secret := range []string{code, token, token[:24], token[24:]} {
		if strings.Contains(string(data), secret) {
			t.Errorf("Paperclip's log holds %q (the browser code or the token)", secret)
		}
	}
}

// failureText is a session's failure, for messages.
func failureText(s setupTokenSession) string {
	if s.Failure == nil {
		return "none"
	}
	msg := ""
	if s.Failure.Message != nil {
		msg = ": " + *s.Failure.Message
	}
	return s.Failure.Reason + msg
}

// pluginLines are the plugin's log lines with message msg, whatever their run.
func pluginLines(t *testing.T, pc *server, msg string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(pc.LogPath)
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
		out = append(out, rec)
	}
	return out
}
