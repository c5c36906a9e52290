package main

import (
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// fakeAnthropic is a TLS server that answers /v1/messages with a stream, and records the key
// each request carried.
func fakeAnthropic(t *testing.T, text string) (*httptest.Server, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var keys []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("x-api-key"))
		mu.Unlock()
		var body struct {
			Stream bool `json:"stream"`
		}
		if r.URL.Path != "/v1/messages" || r.Method != http.MethodPost || json.NewDecoder(r.Body).Decode(&body) != nil || !body.Stream {
			http.Error(w, `{"type":"error","error":{"type":"invalid_request_error","message":"want a streamed POST /v1/messages"}}`, http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range []string{
			`{"type":"message_start","message":{"id":"msg_fake_1","usage":{"input_tokens":5,"output_tokens":1}}}`,
			`{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`,
			fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%q}}`, text[:3]),
			fmt.Sprintf(`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":%q}}`, text[3:]),
			`{"type":"content_block_stop","index":0}`,
			`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":7}}`,
			`{"type":"message_stop"}`,
		} {
			var typ struct {
				Type string `json:"type"`
			}
			_ = json.Unmarshal([]byte(ev), &typ)
			fmt.Fprintf(w, "event: %s\ndata: %s\n\n", typ.Type, ev)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), keys...)
	}
}

// caFile writes the server's certificate as a PEM file, as NODE_EXTRA_CA_CERTS names one.
func caFile(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestModelCall: the stub calls the model with the key of its environment, trusting
// NODE_EXTRA_CA_CERTS, and the answer reaches an assistant line and the result.
func TestModelCall(t *testing.T) {
	srv, keys := fakeAnthropic(t, "hello from the fake")
	out, stderr, err := stubRun(t, paperclipArgs, map[string]string{
		modelCallVar: "1", "ANTHROPIC_API_KEY": "kcph_placeholder", "ANTHROPIC_BASE_URL": srv.URL,
		"NODE_EXTRA_CA_CERTS": caFile(t, srv),
	}, prompt)
	if err != nil {
		t.Fatalf("stub: %v\n%s", err, stderr)
	}
	if got := keys(); len(got) != 1 || got[0] != "kcph_placeholder" {
		t.Errorf("the upstream saw keys %q, want the environment's one", got)
	}
	if !strings.Contains(out, `"The model (msg_fake_1) answered: hello from the fake"`) {
		t.Errorf("no assistant line with the answer:\n%s", out)
	}
	if !strings.Contains(out, `the model (msg_fake_1) answered \"hello from the fake\", and it finished.`) {
		t.Errorf("the result does not carry the answer:\n%s", out)
	}
}

// TestModelCallFails: without the CA the call fails TLS verification; without a key it is not
// sent; a refusal's status and message end the run. Each is an error result, exit code 1.
func TestModelCallFails(t *testing.T) {
	srv, keys := fakeAnthropic(t, "unused")
	refusing := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"type":"error","error":{"type":"authentication_error","message":"kubeclip broker: unknown placeholder"}}`)
	}))
	defer refusing.Close()
	for _, tc := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"untrusted", map[string]string{"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": srv.URL}, "certificate"},
		{"no key", map[string]string{"ANTHROPIC_BASE_URL": srv.URL, "NODE_EXTRA_CA_CERTS": caFile(t, srv)}, "needs ANTHROPIC_API_KEY"},
		{"bad CA file", map[string]string{"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": srv.URL, "NODE_EXTRA_CA_CERTS": "/nonexistent"}, "NODE_EXTRA_CA_CERTS"},
		{"refused", map[string]string{"ANTHROPIC_API_KEY": "k", "ANTHROPIC_BASE_URL": refusing.URL, "NODE_EXTRA_CA_CERTS": caFile(t, refusing)}, "401 Unauthorized: {\"type\":\"error\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.env[modelCallVar] = "1"
			out, _, err := stubRun(t, paperclipArgs, tc.env, prompt)
			if err == nil || isUsage(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("stub: %v, want a failed run mentioning %q", err, tc.want)
			}
			if !strings.Contains(out, `"subtype":"error_during_execution"`) {
				t.Errorf("no error result line:\n%s", out)
			}
		})
	}
	if got := keys(); len(got) != 0 {
		t.Errorf("the untrusted upstream got %d requests, want none", len(got))
	}
}
