package pipelinetest

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// StubImage is the agent stub the cluster harness builds and imports.
const StubImage = "kubeclip.local/agent-stub:dev"

// NewID returns a fresh id usable as company, agent and run id.
func NewID(prefix string) string {
	return prefix + "-" + strings.ToLower(ulid.Make().String())
}

// StubConfig is a Job-backend provider config whose adapter runs the agent stub with env (the
// STUB_* variables, see tests/images/agent-stub); mutate edits it before it is encoded.
func StubConfig(env map[string]string, mutate ...func(map[string]any)) json.RawMessage {
	if env == nil {
		env = map[string]string{}
	}
	cfg := map[string]any{
		"backend":                "job",
		"podActivityDeadlineSec": 120,
		"adapters": []any{map[string]any{
			"adapterType":  "claude_local",
			"runtimeImage": StubImage,
			"envKeys":      []string{"ANTHROPIC_API_KEY"},
			"allowFqdns":   []string{"api.anthropic.com"},
			"defaultEnv":   env,
		}},
		"defaultResources": map[string]any{
			"requests": map[string]string{"cpu": "100m", "memory": "128Mi"},
			"limits":   map[string]string{"cpu": "500m", "memory": "256Mi"},
		},
	}
	for _, m := range mutate {
		m(cfg)
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		panic(err)
	}
	return data
}

// StubLines extracts the stub's assistant line texts ("stub line N") from the log events, in
// the order they were published.
func StubLines(logs []events.RunLogEvent) []string {
	var out []string
	for _, ev := range logs {
		for _, l := range ev.Lines {
			var msg struct {
				Type    string `json:"type"`
				Message struct {
					Content []struct {
						Text string `json:"text"`
					} `json:"content"`
				} `json:"message"`
			}
			if json.Unmarshal([]byte(l.Text), &msg) == nil && msg.Type == "assistant" && len(msg.Message.Content) > 0 {
				out = append(out, msg.Message.Content[0].Text)
			}
		}
	}
	return out
}

// WantStubLines is what StubLines returns for a stub run with STUB_LINES=n.
func WantStubLines(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("stub line %d", i+1)
	}
	return out
}

// CleanupTenant deletes the company's tenant namespace when the test ends.
func CleanupTenant(t *testing.T, cs kubernetes.Interface, companyID string) {
	t.Cleanup(func() {
		ns := NamespaceOf(t, companyID)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	})
}

// NamespaceOf is the tenant namespace of companyID under the default provider config.
func NamespaceOf(t *testing.T, companyID string) string {
	ns, err := policy.TenantNamespace(policy.DefaultConfig(), companyID)
	if err != nil {
		t.Fatalf("tenant namespace of %s: %v", companyID, err)
	}
	return ns
}

// Eventually polls cond until it holds or timeout passes.
func Eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
