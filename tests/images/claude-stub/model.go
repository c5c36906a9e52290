package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"
)

// The model call (KUBECLIP_STUB_MODEL_CALL): one streamed Anthropic Messages request, made as
// the real CLI makes it, so that a test sees an agent's model traffic go through whatever stands
// between the pod and api.anthropic.com (the credential broker, issue 27):
//
//   - to $ANTHROPIC_BASE_URL/v1/messages (default https://api.anthropic.com), by the host's own
//     name: in a brokered pod, /etc/hosts (hostAliases) sends it to the broker;
//   - with the header x-api-key: $ANTHROPIC_API_KEY, whatever the variable holds (a brokered
//     pod's is a placeholder, which the broker swaps for the real key on the way);
//   - trusting the system's roots plus the certificates of $NODE_EXTRA_CA_CERTS, as Node (the
//     real CLI's runtime) trusts them: that is how a brokered pod trusts the installation CA.
//
// The reply's text goes into an assistant line and into the result line's summary, so a test
// can tell that the upstream's answer came back through.

const (
	// modelCallVar turns the model call on (any non-empty value).
	modelCallVar = "KUBECLIP_STUB_MODEL_CALL"
	// defaultAnthropicURL is where the real CLI sends its calls without ANTHROPIC_BASE_URL.
	defaultAnthropicURL = "https://api.anthropic.com"
	// anthropicVersion is the API version header the SDKs send.
	anthropicVersion = "2023-06-01"
	// modelTimeout bounds the whole call, body included.
	modelTimeout = 30 * time.Second
	// maxModelReply bounds what the stub reads of the reply.
	maxModelReply = 1 << 20
)

// modelReply is what the stub kept of the model's answer.
type modelReply struct {
	ID   string
	Text string
}

// newModelClient is an HTTP client that trusts the system's roots and those of
// NODE_EXTRA_CA_CERTS (when set; a file that holds no certificate is an error: a pod told to
// trust a CA must not silently trust only the system's).
func newModelClient(getenv func(string) string) (*http.Client, error) {
	roots, err := x509.SystemCertPool()
	if err != nil || roots == nil {
		roots = x509.NewCertPool()
	}
	if path := getenv("NODE_EXTRA_CA_CERTS"); path != "" {
		pem, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("NODE_EXTRA_CA_CERTS: %w", err)
		}
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("NODE_EXTRA_CA_CERTS: %s holds no PEM certificate", path)
		}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	return &http.Client{Transport: tr, Timeout: modelTimeout}, nil
}

// callModel sends one streamed Messages request about prompt and gathers the streamed text.
// A transport error, a non-2xx status (the broker's refusals among them, in the API's error
// shape) or a stream without message_stop is an error naming what failed, never the key.
func callModel(ctx context.Context, client *http.Client, getenv func(string) string, model, prompt string) (modelReply, error) {
	key := getenv("ANTHROPIC_API_KEY")
	if key == "" {
		return modelReply{}, errors.New("the model call needs ANTHROPIC_API_KEY")
	}
	base := strings.TrimRight(getenv("ANTHROPIC_BASE_URL"), "/")
	if base == "" {
		base = defaultAnthropicURL
	}
	body, err := json.Marshal(map[string]any{
		"model": model, "max_tokens": 256, "stream": true,
		"messages": []map[string]string{{"role": "user", "content": firstLine(prompt, 200)}},
	})
	if err != nil {
		return modelReply{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/messages", bytes.NewReader(body))
	if err != nil {
		return modelReply{}, fmt.Errorf("POST /v1/messages: %w", err)
	}
	req.Header.Set("x-api-key", key)
	req.Header.Set("anthropic-version", anthropicVersion)
	req.Header.Set("content-type", "application/json")
	req.Header.Set("accept", "text/event-stream")
	resp, err := client.Do(req)
	if err != nil {
		return modelReply{}, fmt.Errorf("POST %s/v1/messages: %w", base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return modelReply{}, fmt.Errorf("POST %s/v1/messages: %s: %s", base, resp.Status, firstLine(string(msg), 300))
	}
	return readMessageStream(io.LimitReader(resp.Body, maxModelReply))
}

// readMessageStream reads an Anthropic Messages event stream: the message id from message_start,
// the text of every text_delta, until message_stop.
func readMessageStream(r io.Reader) (modelReply, error) {
	var out modelReply
	var text strings.Builder
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxModelReply)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data:")
		if !ok {
			continue
		}
		var ev struct {
			Type    string `json:"type"`
			Message struct {
				ID string `json:"id"`
			} `json:"message"`
			Delta struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"delta"`
			Error struct {
				Type    string `json:"type"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(strings.TrimSpace(data)), &ev); err != nil {
			return out, fmt.Errorf("the model's stream: a data line that is not JSON: %w", err)
		}
		switch ev.Type {
		case "message_start":
			out.ID = ev.Message.ID
		case "content_block_delta":
			if ev.Delta.Type == "text_delta" {
				text.WriteString(ev.Delta.Text)
			}
		case "error":
			return out, fmt.Errorf("the model's stream: %s: %s", ev.Error.Type, firstLine(ev.Error.Message, 300))
		case "message_stop":
			out.Text = text.String()
			return out, nil
		}
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("reading the model's stream: %w", err)
	}
	return out, errors.New("the model's stream ended without message_stop")
}
