package execsvc_test

import (
	"strings"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/execclient"
)

// TestEnvPolicy: a client that forwards Paperclip's server environment (as the host's `execute`
// does) gets none of the server's secrets into the command; the keys an agent needs pass.
func TestEnvPolicy(t *testing.T) {
	e := newEnv(t, 1)
	l := e.newLease(newID("co"))
	env := map[string]string{
		"PAPERCLIP_AGENT_JWT_SECRET":           "jwt-value",
		"PAPERCLIP_TOOL_ACTION_SIGNING_SECRET": "signing-value",
		"BETTER_AUTH_SECRET":                   "auth-value",
		"DATABASE_URL":                         "postgres://value",
		"AWS_SECRET_ACCESS_KEY":                "aws-value",
		"PGPASSWORD":                           "pg-value",
		"PAPERCLIP_API_KEY":                    "agent-token",
		"PAPERCLIP_API_URL":                    "http://paperclip",
		"HOME":                                 "/workspace",
	}
	res := e.run(l, execclient.Exec{Command: "env", Env: env})
	out := string(res.Stdout)
	for _, secret := range []string{"jwt-value", "signing-value", "auth-value", "postgres://value", "aws-value", "pg-value"} {
		if strings.Contains(out, secret) {
			t.Errorf("the command's environment holds the server's secret %q", secret)
		}
	}
	for _, kept := range []string{"PAPERCLIP_API_KEY=agent-token", "PAPERCLIP_API_URL=http://paperclip", "HOME=/workspace"} {
		if !strings.Contains(out, kept+"\n") {
			t.Errorf("the command's environment lacks %s", kept)
		}
	}
}
