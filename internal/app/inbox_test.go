package app_test

import (
	"strings"
	"testing"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
)

// TestClientInboxPrefixes: the workers answer into the client users' inboxes, by default
// Paperclip's and the CLI's; a prefix that is not a client inbox is refused, naming the setting.
func TestClientInboxPrefixes(t *testing.T) {
	for _, tc := range []struct {
		env       string
		wantErr   string
		allows    string
		notAllows string
	}{
		{env: "", allows: "_INBOX_paperclip.a", notAllows: "_INBOX.a"},
		{env: "", allows: "_INBOX_cli.a", notAllows: "$KV.KUBECLIP_LEASES.a"},
		{env: "_INBOX_ops, _INBOX_cli", allows: "_INBOX_ops.a", notAllows: "_INBOX_paperclip.a"},
		{env: "_INBOX_kubeclip", wantErr: "--client-inbox-prefixes (KUBECLIP_CLIENT_INBOX_PREFIXES)"},
		{env: "$JS.API", wantErr: "--client-inbox-prefixes (KUBECLIP_CLIENT_INBOX_PREFIXES)"},
		{env: " , ", wantErr: "--client-inbox-prefixes (KUBECLIP_CLIENT_INBOX_PREFIXES): no client inbox prefix"},
	} {
		t.Run(tc.env, func(t *testing.T) {
			env := map[string]string{}
			if tc.env != "" {
				env["KUBECLIP_CLIENT_INBOX_PREFIXES"] = tc.env
			}
			var c app.Common
			fs := config.New("test", func(k string) (string, bool) { v, ok := env[k]; return v, ok })
			c.Bind(fs)
			if err := fs.Parse(nil); err != nil {
				t.Fatal(err)
			}
			err := c.Validate(fs)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Validate: %v, want an error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r := c.Replies(); !r.Allows(tc.allows) || r.Allows(tc.notAllows) {
				t.Errorf("rule allows %s: %v, %s: %v", tc.allows, r.Allows(tc.allows), tc.notAllows, r.Allows(tc.notAllows))
			}
		})
	}
}
