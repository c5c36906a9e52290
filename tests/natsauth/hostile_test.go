package natsauth_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kubeclip/kubeclip/pkg/api"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// clients are the users a company's traffic can come from.
var clients = []string{"paperclip", "cli"}

// TestReplyDeputies: a client asks a worker's service with a reply subject aimed at what the
// worker may write (issue 15, item 3): a failed event into another company's run, a lease record,
// a stream purge or delete. Nothing is written.
func TestReplyDeputies(t *testing.T) {
	srv := authServer(t)
	in := install(t, srv)
	replies := []string{
		in.runSubject("failed"),
		"$KV." + lease.Bucket + "." + in.victim.Key(),
		"$JS.API.STREAM.PURGE." + in.subjects.RunStream(),
		"$JS.API.STREAM.PURGE.KV_" + lease.Bucket,
		"$JS.API.STREAM.DELETE." + in.subjects.RunStream(),
		"$JS.API.CONSUMER.DELETE." + in.subjects.LeaseStream() + ".tenant-worker",
	}
	for _, user := range clients {
		t.Run(user, func(t *testing.T) {
			c := connect(t, srv, user)
			for _, service := range []string{api.ValidateSubject(in.subjects), api.PingSubject(in.subjects), api.QueuesSubject(in.subjects)} {
				for _, reply := range replies {
					if err := c.PublishRequest(service, reply, []byte(`{"config":{}}`)); err != nil {
						t.Fatal(err)
					}
				}
				answered(t, c, service)
			}
			in.intact(t)
		})
	}
}

// TestJetStreamAckDeputy: JetStream answers a client's request (a publish's ack, a direct or
// message get, any $JS.API call) on the reply subject the client chose, from inside kubeclip's
// account (issue 26, item 5). The clients are in accounts of their own (nats-auth.conf), so the
// server maps every such reply back into the client's account: an answer aimed at another
// company's run subject (failed, created, result), a lease record's $KV subject or a dispatch
// stores nothing, and no JS API request rides on a reply (a purge or delete aimed there acts on
// nothing). Under the single account of issue 15 a DIRECT.GET of the victim's `created`, answered
// onto its `failed`, stored a genuine typed copy.
func TestJetStreamAckDeputy(t *testing.T) {
	srv := authServer(t)
	in := install(t, srv)
	apiReplies := []string{
		"$JS.API.STREAM.PURGE.KV_" + lease.Bucket,
		"$JS.API.STREAM.PURGE." + in.subjects.RunStream(),
		"$JS.API.STREAM.DELETE." + in.subjects.RunStream(),
		"$JS.API.CONSUMER.DELETE." + in.subjects.LeaseStream() + ".tenant-worker",
	}
	// Where a stored answer would do harm: the victim's run answers and result, its lease record,
	// a dispatch of its run.
	storeReplies := []string{
		in.runSubject("failed"), in.runSubject("created"), in.runSubject("result"),
		"$KV." + lease.Bucket + "." + in.victim.Key(),
		"kubeclip.dispatch." + in.victim.CompanyID + "." + in.victim.RunID,
	}
	release := in.subjects.Prefix() + ".lease.attacker.r9.release"
	// Each user's JetStream requests it may send, with a body that makes JetStream answer: the
	// victim's stored `created` (seq 1 of the run stream) and a lease request (seq 1 of the lease
	// stream, which install's worker does not take: a release of no lease).
	getCreated := []byte(`{"seq":1}`)
	requests := map[string][]string{
		"paperclip": {release, "$JS.API.DIRECT.GET." + in.subjects.RunStream(), "$JS.API.STREAM.MSG.GET." + in.subjects.RunStream(), "$JS.API.INFO"},
		"cli":       {release, "$JS.API.DIRECT.GET." + in.subjects.RunStream(), "$JS.API.STREAM.MSG.GET." + in.subjects.RunStream(), "$JS.API.STREAM.INFO.KV_" + lease.Bucket},
		"status":    {"$JS.API.STREAM.INFO." + in.subjects.RunStream(), "$JS.API.CONSUMER.INFO." + in.subjects.LeaseStream() + ".tenant-worker", "$JS.API.STREAM.INFO.KV_" + lease.Bucket},
	}
	if _, err := in.worker.js.Publish(t.Context(), release, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	for _, user := range []string{"paperclip", "cli", "status"} {
		t.Run(user, func(t *testing.T) {
			c := connect(t, srv, user)
			for _, subject := range requests[user] {
				body := getCreated
				switch {
				case subject == release:
					body = []byte(`{}`)
				case strings.Contains(subject, ".INFO"):
					body = nil
				}
				for _, reply := range append(append([]string{}, apiReplies...), storeReplies...) {
					if err := c.PublishRequest(subject, reply, body); err != nil {
						t.Fatal(err)
					}
				}
				// The same request with its inbox is answered after all the above were handled.
				m, err := c.Request(subject, body, 5*time.Second)
				if err != nil {
					t.Fatalf("%s with an inbox: %v", subject, err)
				}
				if strings.Contains(string(m.Data), `"error"`) {
					t.Fatalf("%s with an inbox: %s", subject, m.Data)
				}
			}
			in.intact(t)
			work, err := in.worker.js.Stream(t.Context(), events.WorkStream)
			if err != nil {
				t.Fatal(err)
			}
			if n := work.CachedInfo().State.Msgs; n != 0 {
				t.Errorf("the dispatch stream holds %d messages, want none", n)
			}
		})
	}
}

// TestPushConsumerDeputy: a push consumer delivers the stream's messages to its deliver subject
// with the account's rights. A client creating one aimed at a bucket or the JS API must be
// refused (or deliver nothing there).
func TestPushConsumerDeputy(t *testing.T) {
	srv := authServer(t)
	in := install(t, srv)
	for _, user := range clients {
		t.Run(user, func(t *testing.T) {
			c := connect(t, srv, user)
			js, err := c.JetStream()
			if err != nil {
				t.Fatal(err)
			}
			for _, deliver := range []string{"$KV." + lease.Bucket + "." + in.victim.Key(), "$JS.API.STREAM.PURGE.KV_" + lease.Bucket} {
				ci, err := js.AddConsumer(in.subjects.RunStream(), &nats.ConsumerConfig{DeliverSubject: deliver, AckPolicy: nats.AckNonePolicy}, nats.MaxWait(2*time.Second))
				if err != nil {
					continue
				}
				t.Logf("%s created a push consumer delivering to %s", user, deliver)
				// Wait until it delivered what the stream holds (or could not).
				deadline := time.Now().Add(time.Second)
				for time.Now().Before(deadline) {
					info, err := in.worker.js.Consumer(t.Context(), in.subjects.RunStream(), ci.Name)
					if err == nil && info.CachedInfo().Delivered.Stream >= 1 {
						t.Logf("it delivered up to seq %d", info.CachedInfo().Delivered.Stream)
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			in.intact(t)
		})
	}
}

// TestClientsCannot: what a client's user may not do at all (issue 15, item 12): delete a
// consumer, purge or delete a stream, read the workers' buckets (but the CLI a lease record:
// TestCLIReadsLeaseRecords), read the other client's inbox.
func TestClientsCannot(t *testing.T) {
	srv := authServer(t)
	in := install(t, srv)
	for _, user := range clients {
		t.Run(user, func(t *testing.T) {
			c := connect(t, srv, user)
			for _, subject := range []string{
				"$JS.API.CONSUMER.DELETE." + in.subjects.LeaseStream() + ".tenant-worker",
				"$JS.API.STREAM.PURGE.KV_" + lease.Bucket,
				"$JS.API.STREAM.DELETE." + in.subjects.RunStream(),
				"$JS.API.STREAM.MSG.DELETE." + in.subjects.RunStream(),
				"$JS.API.DIRECT.GET.KV_" + lease.Bucket + ".$KV." + lease.Bucket + "." + in.victim.Key(),
				"$JS.API.DIRECT.GET.KV_" + lease.Bucket,
				"$JS.API.STREAM.MSG.GET.KV_" + lease.Bucket,
				"$JS.API.DIRECT.GET.KV_" + lease.TenantBucket + ".$KV." + lease.TenantBucket + ".victim",
				"$JS.API.CONSUMER.CREATE.KV_" + lease.Bucket + ".x.$KV." + lease.Bucket + ".>",
				"$KV." + lease.Bucket + "." + in.victim.Key(),
				in.runSubject("failed"),
			} {
				if user == "cli" && subject == cliLeaseRecordGet(in) {
					continue // the CLI reads lease records (TestCLIReadsLeaseRecords)
				}
				if _, err := c.Request(subject, []byte(`{"seq":1,"last_by_subj":"$KV.`+lease.Bucket+`.`+in.victim.Key()+`"}`), 500*time.Millisecond); err == nil {
					t.Errorf("%s answered", subject)
				}
				c.refused(t, user+" publishing", subject)
			}
			in.intact(t)

			// The other client's inbox: the subscription is refused and hears nothing.
			other := "cli"
			if user == "cli" {
				other = "paperclip"
			}
			for _, subject := range []string{inboxes[other] + ".>", "_INBOX.>", ">", inboxes["exec-worker"] + ".>"} {
				sub, err := c.SubscribeSync(subject)
				if err != nil {
					t.Fatal(err)
				}
				c.refused(t, user+" subscribing", subject)
				o := connect(t, srv, other)
				if err := in.worker.Publish(o.NewRespInbox(), []byte("exec output")); err != nil {
					t.Fatal(err)
				}
				if m, err := sub.NextMsg(200 * time.Millisecond); err == nil {
					t.Errorf("%s read %s on %s", user, m.Subject, subject)
				}
			}
		})
	}
}

// TestWorkersCannot: the workers' users, and the operator's read-only status user, publish only
// what their code needs. The status user writes nothing: no run, lease, dispatch, retry or KV
// subject, no exec or api request, no consumer deletion, no durable consumer or consumer on any
// stream but its scan's on the lease bucket, no fetch from a worker's consumer, no ack, no reply
// into another user's inbox (TestStatusUserCannot has the rest).
func TestWorkersCannot(t *testing.T) {
	srv := authServer(t)
	in := install(t, srv)
	for user, subjects := range map[string][]string{
		"kubeclip": {
			in.subjects.Prefix() + ".exec.victim.r1.start",
			"$JS.API.STREAM.PURGE." + in.subjects.RunStream(),
			"$JS.API.STREAM.DELETE." + in.subjects.RunStream(),
			"$JS.API.STREAM.DELETE.KV_" + lease.Bucket,
			"_INBOX.x", inboxes["exec-worker"] + ".x",
		},
		"exec-worker": {
			"$JS.API.STREAM.PURGE.>",
			"$JS.API.STREAM.PURGE.KV_" + lease.Bucket,
			"$JS.API.STREAM.DELETE." + in.subjects.RunStream(),
			"$JS.API.CONSUMER.DELETE." + in.subjects.LeaseStream() + ".tenant-worker",
			"$KV." + lease.Bucket + "." + in.victim.Key(),
			in.runSubject("failed"),
			in.subjects.Prefix() + ".lease.victim.r1.release",
			"_INBOX.x", inboxes["kubeclip"] + ".x",
		},
		"status": {
			in.runSubject("failed"),
			in.subjects.Prefix() + ".lease.victim.r1.release",
			in.subjects.Prefix() + ".exec.victim.r1.start",
			in.subjects.Prefix() + ".api.ping",
			"kubeclip.dispatch.victim.r1",
			"kubeclip.retry.tenant-worker.victim",
			"kubeclip.parked.victim.r1",
			"$KV." + lease.Bucket + "." + in.victim.Key(),
			"$KV." + lease.TenantBucket + ".victim",
			"$JS.API.STREAM.PURGE.KV_" + lease.Bucket,
			"$JS.API.STREAM.DELETE." + in.subjects.RunStream(),
			"$JS.API.STREAM.CREATE.KV_" + lease.Bucket,
			"$JS.API.STREAM.UPDATE." + in.subjects.LeaseStream(),
			"$JS.API.STREAM.MSG.DELETE." + in.subjects.LeaseStream(),
			"$JS.API.CONSUMER.DELETE." + in.subjects.LeaseStream() + ".tenant-worker",
			"$JS.API.CONSUMER.DELETE.KV_" + lease.Bucket + ".x",
			"$JS.API.CONSUMER.DURABLE.CREATE.KV_" + lease.Bucket + ".x",
			"$JS.API.CONSUMER.CREATE." + in.subjects.LeaseStream() + ".x." + in.subjects.Prefix() + ".lease.>",
			"$JS.API.CONSUMER.CREATE." + in.subjects.RunStream(),
			"$JS.API.CONSUMER.CREATE.KV_" + lease.TenantBucket + ".x.$KV." + lease.TenantBucket + ".>",
			"$JS.API.CONSUMER.CREATE.KV_" + lease.Bucket + ".x.$KV." + lease.TenantBucket + ".>",
			"$JS.API.CONSUMER.MSG.NEXT." + in.subjects.LeaseStream() + ".tenant-worker",
			"$JS.API.DIRECT.GET.KV_" + lease.TenantBucket + ".$KV." + lease.TenantBucket + ".victim",
			"$JS.API.DIRECT.GET.KV_KUBECLIP_EXECS",
			// The companies' requests and runs (issue 26, item 11): the queues service says
			// where the oldest request stands.
			"$JS.API.DIRECT.GET." + in.subjects.LeaseStream(), "$JS.API.STREAM.MSG.GET." + in.subjects.LeaseStream(),
			"$JS.API.DIRECT.GET." + in.subjects.RunStream(), "$JS.API.STREAM.MSG.GET." + in.subjects.RunStream(),
			"$JS.API.DIRECT.GET." + events.WorkStream, "$JS.API.STREAM.MSG.GET." + events.WorkStream,
			"$JS.API.DIRECT.GET." + events.RetryStream, "$JS.API.STREAM.MSG.GET." + events.RetryStream,
			"$JS.ACK." + in.subjects.LeaseStream() + ".tenant-worker.1.1.1.1.0",
			inboxes["cli"] + ".x", inboxes["paperclip"] + ".x", "_INBOX.x",
		},
	} {
		t.Run(user, func(t *testing.T) {
			c := connect(t, srv, user)
			for _, subject := range subjects {
				if err := c.Publish(subject, []byte(`{}`)); err != nil {
					t.Fatal(err)
				}
				c.refused(t, user+" publishing", subject)
			}
			in.intact(t)
		})
	}
}
