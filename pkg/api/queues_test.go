package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/api"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// TestQueuesAnswersWhereTheOldestRequestStands: the queues service answers, for each queue
// worker's consumer, the sequence and time of the oldest request it has not acknowledged (never
// the request), absent for a consumer that does not exist; into a client's or the status user's
// inbox only (issue 26, item 11).
func TestQueuesAnswersWhereTheOldestRequestStands(t *testing.T) {
	srv, _, js := natstest.Start(t)
	ctx := t.Context()
	var s events.Subjects
	if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := events.EnsureConsumer(ctx, js, s.LeaseStream(), events.TenantWorkerConsumerConfig(s)); err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(ctx, s.Prefix()+".lease.acme.acquire", []byte(`{"runId":"r1","config":{"defaultEnv":{"K":"secret"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.ServeQueues(ctx, js.Conn(), serveOptions(t), js); err != nil {
		t.Fatal(err)
	}

	for _, prefix := range []string{inbox.StatusPrefix, inbox.CLIPrefix} {
		nc, err := nats.Connect(srv.ClientURL(), nats.CustomInboxPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		m, err := nc.Request(api.QueuesSubject(s), nil, 5*time.Second)
		if err != nil {
			t.Fatalf("asking with inbox %s: %v", prefix, err)
		}
		var r api.QueuesReply
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Fatalf("decoding %s: %v", m.Data, err)
		}
		if got, want := len(r.Oldest), len(api.QueueConsumers(s)); got != want {
			t.Fatalf("%d consumers answered, want %d", got, want)
		}
		for _, o := range r.Oldest {
			switch {
			case o.Stream == s.LeaseStream() && o.Consumer == events.TenantWorkerConsumer:
				if o.Seq != ack.Sequence || o.At == nil || o.Absent || o.Error != "" {
					t.Errorf("the tenant-worker's consumer: %+v, want its request at %d", o, ack.Sequence)
				}
			case !o.Absent:
				t.Errorf("%s/%s: %+v, want absent", o.Stream, o.Consumer, o)
			}
		}
		if strings.Contains(string(m.Data), "secret") {
			t.Errorf("the answer carries the request: %s", m.Data)
		}
	}

	// Any other reply subject: no answer.
	other, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	if _, err := other.Request(api.QueuesSubject(s), nil, 500*time.Millisecond); err == nil {
		t.Error("answered into _INBOX")
	}
}

// TestQueuesEndsWithItsContext: the queues service's reads are bounded by the context it was
// served with, so when that ends it stops answering rather than answer reads that fail at once:
// a request then meets no responders (or another worker of the queue group).
func TestQueuesEndsWithItsContext(t *testing.T) {
	srv, _, js := natstest.Start(t)
	ctx, cancel := context.WithCancel(t.Context())
	if _, err := api.ServeQueues(ctx, js.Conn(), serveOptions(t), js); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.ClientURL(), nats.CustomInboxPrefix(inbox.CLIPrefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	subject := api.QueuesSubject(events.Subjects{})
	if _, err := nc.Request(subject, nil, 5*time.Second); err != nil {
		t.Fatalf("before the context ends: %v", err)
	}
	cancel()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		_, err := nc.Request(subject, nil, time.Second)
		if errors.Is(err, nats.ErrNoResponders) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the context ended: %v, want %v", err, nats.ErrNoResponders)
		}
	}
}
