package natsauth_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// TestStatusUserCannot: the operator's read-only status user (`kubeclip status`) makes no
// consumer that outlives its scan, deletes none, and hears nothing but its own inbox.
func TestStatusUserCannot(t *testing.T) {
	srv := authServer(t)
	in := install(t, srv)
	ctx := t.Context()
	c := connect(t, srv, "status")

	// A durable on the lease bucket, by the named endpoint (refused by permission) or the
	// ephemeral-only one its scan uses (refused by the server): none made.
	leases := "KV_" + lease.Bucket
	cfg := jetstream.ConsumerConfig{Durable: "status-durable", FilterSubject: "$KV." + lease.Bucket + ".>", AckPolicy: jetstream.AckNonePolicy}
	shortCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := c.js.CreateConsumer(shortCtx, leases, cfg); err == nil {
		t.Error("the status user created a durable consumer on the lease bucket")
	}
	req, err := json.Marshal(map[string]any{"stream_name": leases, "config": cfg})
	if err != nil {
		t.Fatal(err)
	}
	msg, err := c.Request("$JS.API.CONSUMER.CREATE."+leases, req, 5*time.Second)
	if err != nil {
		t.Fatalf("the ephemeral-only endpoint did not answer the status user: %v", err)
	}
	if !strings.Contains(string(msg.Data), `"error"`) {
		t.Errorf("the ephemeral-only endpoint took a durable: %s", msg.Data)
	}
	if _, err := in.worker.js.Consumer(ctx, leases, cfg.Durable); err == nil {
		t.Error("the lease bucket holds the status user's durable consumer")
	}

	// Another user's inbox, exec traffic, everything: the subscription is refused and hears
	// nothing, though a worker publishes there.
	for _, subject := range []string{inboxes["cli"] + ".>", inboxes["paperclip"] + ".>", inboxes["kubeclip"] + ".>", inboxes["exec-worker"] + ".>", "_INBOX.>", in.subjects.Prefix() + ".exec.>", ">"} {
		sub, err := c.SubscribeSync(subject)
		if err != nil {
			t.Fatal(err)
		}
		c.refused(t, "status subscribing", subject)
		if err := in.worker.Publish(inboxes["cli"]+".x", []byte("an answer")); err != nil {
			t.Fatal(err)
		}
		if m, err := sub.NextMsg(200 * time.Millisecond); err == nil {
			t.Errorf("status read %s on %s", m.Subject, subject)
		}
	}
	if _, err := in.worker.js.Consumer(ctx, in.subjects.LeaseStream(), events.TenantWorkerConsumer); err != nil {
		t.Errorf("the tenant-worker's consumer: %v", err)
	}
	in.intact(t)
}
