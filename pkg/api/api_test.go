package api_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/api"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serveOptions answer into the client users' inboxes; the tests' connections use the CLI's.
func serveOptions(t *testing.T) api.ServeOptions {
	return api.ServeOptions{Replies: inbox.MustRule(inbox.DefaultClientPrefixes()...), Logger: zerolog.New(zerolog.NewTestWriter(t))}
}

// client connects as the CLI does, its inbox under its own prefix.
func client(t *testing.T) (*server.Server, *nats.Conn) {
	srv, _, _ := natstest.Start(t)
	nc, err := nats.Connect(srv.ClientURL(), nats.CustomInboxPrefix(inbox.CLIPrefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return srv, nc
}

// TestValidateOverNATS asks the validate service as the Paperclip plugin does and gets
// pkg/policy's verdict, fields named under config as an acquire's failed event names them.
func TestValidateOverNATS(t *testing.T) {
	_, nc := client(t)
	var s events.Subjects
	sub, err := api.ServeValidate(nc, serveOptions(t), policy.DefaultOperator())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	tests := []struct {
		name       string
		request    string
		wantOK     bool
		wantErrors []api.FieldError
	}{
		{name: "valid", request: `{"config":{"backend":"pod","egressAllowCidrs":["203.0.113.0/24"]}}`, wantOK: true},
		{name: "egress into the cluster's networks", request: `{"config":{"egressAllowCidrs":["0.0.0.0/0"],"egressAllowFqdns":["nats.kubeclip.svc.cluster.local"]}}`,
			wantErrors: []api.FieldError{
				{Field: "config.egressAllowCidrs[0]", Message: "0.0.0.0/0 reaches 0.0.0.0/8, a private or reserved range tenants may not open egress to (the operator can allow ranges with --private-egress-cidrs)"},
				{Field: "config.egressAllowFqdns[0]", Message: `"nats.kubeclip.svc.cluster.local" names the cluster's or the host's own DNS, which tenants may not open egress to`},
			}},
		{name: "bad CIDR", request: `{"config":{"egressAllowCidrs":["10.0.0.0/33"]}}`, wantErrors: []api.FieldError{{Field: "config.egressAllowCidrs[0]", Message: `invalid IPv4 CIDR "10.0.0.0/33": prefix length 33 is out of range 0-32`}}},
		{name: "a prefix the operator did not allow", request: `{"config":{"namespacePrefix":"kube-","companySlug":"system"}}`,
			wantErrors: []api.FieldError{{Field: "config.namespacePrefix", Message: `"kube-" is not a namespace prefix this kubeclip installation allows (allowed: paperclip-)`}}},
		{name: "an env key the operator does not hand out", request: `{"config":{"adapterType":"a","adapters":[{"adapterType":"a","runtimeImage":"r/a:1","envKeys":["KUBECLIP_NATS_PASSWORD"]}]}}`,
			wantErrors: []api.FieldError{{Field: "config.adapters[0].envKeys[0]", Message: `"KUBECLIP_NATS_PASSWORD" is not a key of adapter "a" (its own: none)`}}},
		{name: "odd key name", request: `{"config":{"a b":1}}`, wantErrors: []api.FieldError{{Field: `config["a b"]`, Message: "unknown field"}}},
		{name: "no config", request: `{"cfg":{}}`, wantErrors: []api.FieldError{{Field: "config", Message: "the request must be an object with a config object"}}},
		{name: "duplicate key", request: `{"config":{},"config":{"inCluster":true}}`, wantErrors: []api.FieldError{{Field: "config", Message: "duplicate key"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			msg, err := nc.Request(api.ValidateSubject(s), []byte(tc.request), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			var got api.ValidateReply
			if err := json.Unmarshal(msg.Data, &got); err != nil {
				t.Fatalf("decoding %s: %v", msg.Data, err)
			}
			if got.OK != tc.wantOK || (tc.wantOK && got.NormalizedConfig == nil) {
				t.Errorf("ok %v, normalized %v; want ok %v", got.OK, got.NormalizedConfig, tc.wantOK)
			}
			if tc.wantErrors == nil {
				tc.wantErrors = []api.FieldError{}
			}
			if diff := cmp.Diff(tc.wantErrors, got.Errors); diff != "" {
				t.Errorf("errors (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPing(t *testing.T) {
	_, nc := client(t)
	var s events.Subjects
	for _, w := range []string{"dispatcher", "run-watcher"} {
		sub, err := api.ServePing(nc, serveOptions(t), api.PingReply{Worker: w, Replica: w + "-0", Version: "dev"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	inbox := nc.NewRespInbox()
	replies, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest(api.PingSubject(s), inbox, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for range 2 {
		m, err := replies.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var r api.PingReply
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Fatal(err)
		}
		got[r.Worker] = true
	}
	if !got["dispatcher"] || !got["run-watcher"] {
		t.Errorf("ping replies from %v, want both workers", got)
	}
}

// TestValidateReplyFitsOneMessage: a config of many unknown keys, or of one huge one, got a
// reply bigger than a NATS message, which the server refused: the plugin then timed out instead
// of showing what to fix.
func TestValidateReplyFitsOneMessage(t *testing.T) {
	_, nc := client(t)
	var s events.Subjects
	sub, err := api.ServeValidate(nc, serveOptions(t), policy.DefaultOperator())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	var many strings.Builder
	many.WriteString(`{"config":{`)
	for i := range 20000 {
		if i > 0 {
			many.WriteString(",")
		}
		fmt.Fprintf(&many, `"unknown-key-%05d-%s":1`, i, strings.Repeat("x", 20))
	}
	many.WriteString(`}}`)
	huge := `{"config":{"` + strings.Repeat("k", 900<<10) + `":1}}`
	for name, req := range map[string]string{"many keys": many.String(), "one huge key": huge} {
		t.Run(name, func(t *testing.T) {
			msg, err := nc.Request(api.ValidateSubject(s), []byte(req), 10*time.Second)
			if err != nil {
				t.Fatalf("no reply to a %d-byte request: %v", len(req), err)
			}
			var got api.ValidateReply
			if err := json.Unmarshal(msg.Data, &got); err != nil {
				t.Fatal(err)
			}
			if got.OK || len(got.Errors) == 0 || len(got.Errors) > 51 || len(msg.Data) > 256<<10 {
				t.Errorf("reply: ok %v, %d errors, %d bytes", got.OK, len(got.Errors), len(msg.Data))
			}
		})
	}
	t.Run("case-variant field", func(t *testing.T) {
		msg, err := nc.Request(api.ValidateSubject(s), []byte(`{"CONFIG":{}}`), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var got api.ValidateReply
		if err := json.Unmarshal(msg.Data, &got); err != nil {
			t.Fatal(err)
		}
		if got.OK || len(got.Errors) != 1 || got.Errors[0].Field != "CONFIG" {
			t.Errorf("reply %+v, want CONFIG refused", got)
		}
	})
}
