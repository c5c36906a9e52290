package api_test

import (
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kubeclip/kubeclip/pkg/api"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// TestRepliesOnlyIntoInboxes: a requester chooses its reply subject, and the responder publishes
// there with its own permissions. validate and ping answered a reply of another company's run
// subject (a failed event into its run) or a lease record's KV subject (zeroing the record); they
// now drop, and count, every request whose reply is not a client's inbox.
func TestRepliesOnlyIntoInboxes(t *testing.T) {
	_, nc := client(t)
	var s events.Subjects
	o := serveOptions(t)
	drops := &dropCounter{}
	o.Observer = drops
	sub, err := api.ServeValidate(nc, o, policy.DefaultOperator())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	ping, err := api.ServePing(nc, o, api.PingReply{Worker: "tenant-worker"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ping.Unsubscribe() })

	hostile := []string{
		"paperclip.run.other-company.r1.failed",
		"$KV.KUBECLIP_LEASES.other-company_r1",
		"_INBOX.x", "_INBOX_kubeclip.x", "_INBOX_exec.x", "_INBOX_cli", "_INBOX_cli.*",
	}
	// nats-server (v2.15.3 on) refuses a client's reply subject under $JS. itself, a permissions
	// violation: that request never reaches the responders, so they count no drop of it.
	const jsReply = "$JS.API.STREAM.PURGE.KV_KUBECLIP_LEASES"
	watch := make(chan *nats.Msg, 64)
	for _, subject := range append(hostile, "_INBOX_cli.>", jsReply) {
		w, err := nc.ChanSubscribe(subject, watch)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Unsubscribe() })
	}
	for _, subject := range []string{api.ValidateSubject(s), api.PingSubject(s)} {
		for _, reply := range append(hostile, jsReply) {
			if err := nc.PublishRequest(subject, reply, []byte(`{"config":{}}`)); err != nil {
				t.Fatal(err)
			}
		}
		// A request into a client's inbox is answered; the service handles its requests in order,
		// so by then every hostile one above was handled.
		barrier := nc.NewRespInbox()
		if err := nc.PublishRequest(subject, barrier, []byte(`{"config":{}}`)); err != nil {
			t.Fatal(err)
		}
	wait:
		for {
			select {
			case m := <-watch:
				if m.Subject == barrier {
					break wait
				}
				t.Errorf("%s answered into %s", subject, m.Subject)
			case <-time.After(5 * time.Second):
				t.Fatalf("%s: no answer into the inbox %s", subject, barrier)
			}
		}
	}
	if got, want := drops.count(), 2*len(hostile); got != want {
		t.Errorf("%d requests counted dropped, want %d", got, want)
	}
}

type dropCounter struct {
	mu sync.Mutex
	n  int
}

func (d *dropCounter) APIRequestDropped(service, reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if reason == api.DropReplyNotInbox && (service == "validate" || service == "ping") {
		d.n++
	}
}

func (d *dropCounter) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n
}
