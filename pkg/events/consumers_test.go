package events_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestConsumerConfigs pins every worker consumer setting; the reasons are in consumers.go.
func TestConsumerConfigs(t *testing.T) {
	var s events.Subjects
	common := jetstream.ConsumerConfig{
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxDeliver:    8,
		MaxAckPending: 10000,
		ReplayPolicy:  jetstream.ReplayInstantPolicy,
	}
	tests := []struct {
		name string
		got  jetstream.ConsumerConfig
		want func(c jetstream.ConsumerConfig) jetstream.ConsumerConfig
	}{
		{"tenant-worker", events.TenantWorkerConsumerConfig(s), func(c jetstream.ConsumerConfig) jetstream.ConsumerConfig {
			c.Durable, c.Description, c.FilterSubject = "tenant-worker", "kubeclip tenant-worker: acquire requests", "paperclip.lease.*.acquire"
			return c
		}},
		{"dispatcher", events.DispatcherConsumerConfig(), func(c jetstream.ConsumerConfig) jetstream.ConsumerConfig {
			c.Durable, c.Description, c.FilterSubject = "dispatcher", "kubeclip dispatcher: dispatch requests", "kubeclip.dispatch.>"
			return c
		}},
		{"dispatcher-release", events.DispatcherEndConsumerConfig(s), func(c jetstream.ConsumerConfig) jetstream.ConsumerConfig {
			c.Durable, c.Description = "dispatcher-release", "kubeclip dispatcher: release, destroy and resume requests"
			c.FilterSubjects = []string{"paperclip.lease.*.release", "paperclip.lease.*.destroy", "paperclip.lease.*.resume"}
			return c
		}},
		{"dispatcher-result", events.DispatcherResultConsumerConfig(s), func(c jetstream.ConsumerConfig) jetstream.ConsumerConfig {
			c.Durable, c.Description, c.FilterSubject = "dispatcher-result", "kubeclip dispatcher: run results", "paperclip.run.*.*.result"
			c.DeliverPolicy = jetstream.DeliverNewPolicy
			return c
		}},
		{"broker-release", events.BrokerReleaseConsumerConfig(s), func(c jetstream.ConsumerConfig) jetstream.ConsumerConfig {
			c.Durable, c.Description = "broker-release", "kubeclip credential broker: run pods' addresses and the ends of leases and runs, which bind and release their grants"
			c.FilterSubjects = []string{"paperclip.run.*.*.status", "paperclip.run.*.*.resumed", "paperclip.run.*.*.released", "paperclip.run.*.*.result", "paperclip.run.*.*.suspended", "paperclip.run.*.*.failed"}
			c.DeliverPolicy = jetstream.DeliverNewPolicy
			return c
		}},
		// Retries count their attempts against the same MaxDeliver as first attempts.
		{"tenant-worker-retry", events.RetryConsumerConfig(events.TenantWorkerConsumer), func(c jetstream.ConsumerConfig) jetstream.ConsumerConfig {
			c.Durable, c.Description, c.FilterSubject = "tenant-worker-retry", "kubeclip tenant-worker: retries", "kubeclip.retry.tenant-worker.>"
			return c
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want(common), tc.got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	// The retry budget the docs promise: Consume's backoff over MaxDeliver-1 naks.
	var budget time.Duration
	for attempt := uint64(1); attempt < events.ConsumerMaxDeliver; attempt++ {
		budget += events.DefaultBackoff(attempt)
	}
	if budget != 91*time.Second {
		t.Errorf("retry budget = %s, want 1m31s", budget)
	}
}

// TestConsumerConfigsAreAccepted creates every consumer on a real server, which checks, among
// others, that BackOff fits MaxDeliver and that the work queue accepts the dispatcher.
func TestConsumerConfigsAreAccepted(t *testing.T) {
	_, _, js := natstest.Start(t)
	ctx := t.Context()
	if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, events.RetryStreamConfig(1, 0)); err != nil {
		t.Fatal(err)
	}
	var s events.Subjects
	for stream, cfg := range map[string][]jetstream.ConsumerConfig{
		s.LeaseStream():    {events.TenantWorkerConsumerConfig(s), events.DispatcherEndConsumerConfig(s)},
		events.WorkStream:  {events.DispatcherConsumerConfig()},
		s.RunStream():      {events.DispatcherResultConsumerConfig(s), events.BrokerReleaseConsumerConfig(s)},
		events.RetryStream: {events.RetryConsumerConfig(events.TenantWorkerConsumer)},
	} {
		for _, c := range cfg {
			for range 2 { // idempotent
				cons, err := js.CreateOrUpdateConsumer(ctx, stream, c)
				if err != nil {
					t.Fatalf("creating consumer %s on %s: %v", c.Durable, stream, err)
				}
				got := cons.CachedInfo().Config
				if got.AckWait != c.AckWait || got.MaxDeliver != c.MaxDeliver || !cmp.Equal(got.BackOff, c.BackOff) {
					t.Errorf("consumer %s stored as %+v", c.Durable, got)
				}
			}
		}
	}
}

func TestBackoff(t *testing.T) {
	var got []time.Duration
	for attempt := uint64(1); attempt <= 8; attempt++ {
		got = append(got, events.DefaultBackoff(attempt))
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second, 30 * time.Second}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestNakDelayIsNotStretched pins what Consume relies on for deferred and retried work (a busy
// agent's acquire, deferred every second; a failed handler, retried after 1, 2, 4 … s): a
// NakWithDelay(d) on a worker consumer brings the message back after d on every delivery. A
// consumer BackOff would make the server stretch it to d + BackOff[n-1] - AckWait.
func TestNakDelayIsNotStretched(t *testing.T) {
	_, _, js := natstest.Start(t)
	ctx := t.Context()
	const subject = "naktest.work"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "NAKTEST", Subjects: []string{subject}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	cfg := events.DispatcherConsumerConfig()
	cfg.FilterSubject = subject
	cons, err := js.CreateOrUpdateConsumer(ctx, "NAKTEST", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, subject, []byte("deferred work")); err != nil {
		t.Fatal(err)
	}
	const delay = 300 * time.Millisecond
	var nakAt time.Time
	for delivery := 1; delivery <= 4; delivery++ {
		// A stretched delay would be 30 s or more: wait long enough to see it fail clearly.
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var msg jetstream.Msg
		for m := range batch.Messages() {
			msg = m
		}
		if msg == nil {
			t.Fatalf("delivery %d: nothing within 10s of NakWithDelay(%s)", delivery, delay)
		}
		if delivery > 1 {
			if got := time.Since(nakAt); got > delay+2*time.Second {
				t.Errorf("delivery %d came %s after NakWithDelay(%s)", delivery, got.Round(10*time.Millisecond), delay)
			}
		}
		if err := msg.NakWithDelay(delay); err != nil {
			t.Fatal(err)
		}
		nakAt = time.Now()
	}
}

// TestDrainTimeoutFitsTheGracePeriod pins the workers' drain bound (--shutdown-timeout's
// default): with the NATS connection's drain (10 s) after it, it must fit in the 40 s the
// manifests give a worker pod to stop.
func TestDrainTimeoutFitsTheGracePeriod(t *testing.T) {
	const gracePeriod, natsDrain = 40 * time.Second, 10 * time.Second
	if events.DefaultDrainTimeout != 20*time.Second || events.DefaultDrainTimeout+natsDrain > gracePeriod {
		t.Errorf("DefaultDrainTimeout = %s, want 20s (and with %s of NATS drain within %s)", events.DefaultDrainTimeout, natsDrain, gracePeriod)
	}
}
