// Package natsauth_test is the hostile-client suite: a nats-server loaded with the shipped
// users and permissions (deploy/kustomize/base/nats-auth.conf, as a deployment loads it), the
// workers' real code on their own users, and Paperclip's and the CLI's users trying every way a
// client could make the server or a worker act for it: reply subjects aimed at streams, buckets
// and other companies' runs, consumer deletion, reads of the workers' buckets, the other
// client's inbox; and what the workers' and the read-only status user may not do. Each attempt
// must be refused or harmless, checked on the stream or record.
package natsauth_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/api"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// natsAuthConf is the users and permissions file kubeclip ships.
const natsAuthConf = "../../" + natstest.ShippedAuthConf

// inboxes are the inbox prefixes each user connects with (pkg/inbox).
var inboxes = map[string]string{"kubeclip": inbox.WorkersPrefix, "exec-worker": inbox.ExecWorkerPrefix, "broker": inbox.BrokerPrefix, "paperclip": inbox.PaperclipPrefix, "cli": inbox.CLIPrefix, "status": inbox.StatusPrefix}

// authServer runs a JetStream server with the shipped users and permissions, passwords from the
// environment as in a deployment.
func authServer(t *testing.T) *server.Server { return natstest.StartWithAuth(t, natsAuthConf) }

// conn is one user's connection and the permission errors the server sent it.
type conn struct {
	*nats.Conn
	js jetstream.JetStream

	mu         sync.Mutex
	violations []string
}

// connect connects as user with its password and its own inbox prefix, as kubeclip's clients do.
func connect(t *testing.T, srv *server.Server, user string) *conn {
	t.Helper()
	c := &conn{}
	nc, err := nats.Connect(srv.ClientURL(), nats.Name("natsauth-"+user),
		natstest.User(user),
		nats.CustomInboxPrefix(inboxes[user]),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.violations = append(c.violations, err.Error())
		}))
	if err != nil {
		t.Fatalf("connecting as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	c.Conn = nc
	if c.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return c
}

// refused waits until the server reported a permission violation naming subject.
func (c *conn) refused(t *testing.T, what, subject string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		for _, v := range c.violations {
			if strings.Contains(v, `"`+subject+`"`) {
				c.mu.Unlock()
				return
			}
		}
		c.mu.Unlock()
		_ = c.Flush()
		time.Sleep(10 * time.Millisecond)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t.Errorf("%s: %q was not refused (violations seen: %q)", what, subject, c.violations)
}

// installation is the streams, buckets and services the workers set up, with a lease record and
// a run event of company victim.
type installation struct {
	subjects events.Subjects
	worker   *conn
	victim   events.RunRef
}

func install(t *testing.T, srv *server.Server) *installation {
	t.Helper()
	ctx := t.Context()
	in := &installation{worker: connect(t, srv, "kubeclip"), victim: events.RunRef{CompanyID: "victim", RunID: "r1"}}
	js := in.worker.js
	// As every worker does at start-up, with its own user (internal/app.Common.JetStream).
	if err := events.EnsureStreams(ctx, js, events.Options{Prefix: in.subjects.Prefix()}); err != nil {
		t.Fatalf("the workers' user creating the streams: %v", err)
	}
	if err := lease.EnsureBuckets(ctx, js, lease.BucketOptions{}); err != nil {
		t.Fatalf("the workers' user creating the buckets: %v", err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, in.subjects.LeaseStream(), events.TenantWorkerConsumerConfig(in.subjects)); err != nil {
		t.Fatalf("the tenant-worker creating its consumer: %v", err)
	}
	log := zerolog.New(zerolog.NewTestWriter(t))
	serve := api.ServeOptions{Subjects: in.subjects, Replies: inbox.MustRule(inbox.DefaultClientPrefixes()...), Logger: log}
	if _, err := api.ServeValidate(in.worker.Conn, serve, policy.DefaultOperator()); err != nil {
		t.Fatal(err)
	}
	if _, err := api.ServePing(in.worker.Conn, serve, api.PingReply{Worker: "tenant-worker"}); err != nil {
		t.Fatal(err)
	}
	if _, err := api.ServeQueues(ctx, in.worker.Conn, serve, js); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, in.victim.Key(), []byte(`{"state":"running"}`)); err != nil {
		t.Fatalf("the workers' user writing a lease record: %v", err)
	}
	if _, err := js.Publish(ctx, in.runSubject("created"), []byte(`{"kind":"created"}`)); err != nil {
		t.Fatalf("the workers' user publishing a run event: %v", err)
	}
	return in
}

func (in *installation) runSubject(kind string) string {
	return in.subjects.Prefix() + ".run." + in.victim.CompanyID + "." + in.victim.RunID + "." + kind
}

// intact checks that the victim's lease record, the run stream's messages and the tenant-worker's
// consumer are as install left them.
func (in *installation) intact(t *testing.T) {
	t.Helper()
	ctx := t.Context()
	js := in.worker.js
	kv, err := js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		t.Fatalf("lease bucket: %v", err)
	}
	e, err := kv.Get(ctx, in.victim.Key())
	if err != nil || string(e.Value()) != `{"state":"running"}` {
		t.Errorf("the victim's lease record: %v, %v", value(e), err)
	} else if e.Revision() != 1 {
		t.Errorf("the victim's lease record was written again (revision %d)", e.Revision())
	}
	runs, err := js.Stream(ctx, in.subjects.RunStream())
	if err != nil {
		t.Fatalf("run stream: %v", err)
	}
	info, err := runs.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 1 || info.State.FirstSeq != 1 {
		t.Errorf("run stream holds %d messages from seq %d, want the victim's one event", info.State.Msgs, info.State.FirstSeq)
	}
	for _, name := range []string{in.subjects.LeaseStream(), events.WorkStream, "KV_" + lease.TenantBucket} {
		if _, err := js.Stream(ctx, name); err != nil {
			t.Errorf("stream %s: %v", name, err)
		}
	}
	if _, err := js.Consumer(ctx, in.subjects.LeaseStream(), events.TenantWorkerConsumer); err != nil {
		t.Errorf("the tenant-worker's consumer: %v", err)
	}
}

func value(e jetstream.KeyValueEntry) string {
	if e == nil {
		return "<none>"
	}
	return string(e.Value())
}

// answered waits for an answer on c's inbox to subject: the services handle requests in order,
// so every request c sent before was handled by then.
func answered(t *testing.T, c *conn, subject string) {
	t.Helper()
	if _, err := c.Request(subject, []byte(`{"config":{}}`), 5*time.Second); err != nil {
		t.Fatalf("%s: no answer into the inbox: %v", subject, err)
	}
}
