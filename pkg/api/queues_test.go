package api_test

import (
	"encoding/json"
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
	if _, err := api.ServeQueues(js.Conn(), serveOptions(t), js); err != nil {
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
