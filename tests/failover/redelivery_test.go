package failover

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestNakDelayOnWorkerConsumersIsNotStretchedByBackOff pins what the consume loop relies on
// for deferred and retried work (a busy agent's acquire, deferred every --agent-busy-retry of
// 1 s; a failed handler, retried after 1, 2, 4 … s): a NakWithDelay(d) on a consumer with the
// workers' settings (events.DispatcherConsumerConfig: AckWait 30 s, BackOff 30 s, 1, 2, 4 min)
// brings the message back after d, on every delivery.
//
// It uses its own stream on the suite's server, so no worker consumes it.
func TestNakDelayOnWorkerConsumersIsNotStretchedByBackOff(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	name := strings.ToUpper(strings.ReplaceAll(pt.NewID("NAKTEST"), "-", "_"))
	subject := "failover.naktest." + name
	if _, err := env.JS.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.JS.DeleteStream(context.WithoutCancel(ctx), name) })
	cfg := events.DispatcherConsumerConfig()
	cfg.FilterSubject = subject
	cons, err := env.JS.CreateOrUpdateConsumer(ctx, name, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.JS.Publish(ctx, subject, []byte("deferred work")); err != nil {
		t.Fatal(err)
	}

	const delay = time.Second
	// 45 s: long enough to see where a stretched redelivery lands (AckWait and BackOff[1] give
	// 31 s), so the failure says by how much.
	const patience = 45 * time.Second
	var nakAt time.Time
	for delivery := 1; delivery <= 3; delivery++ {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(patience))
		if err != nil {
			t.Fatal(err)
		}
		var msg jetstream.Msg
		for m := range batch.Messages() {
			msg = m
		}
		if msg == nil {
			t.Fatalf("delivery %d: nothing within %s of NakWithDelay(%s)", delivery, patience, delay)
		}
		if delivery > 1 {
			got := time.Since(nakAt)
			t.Logf("delivery %d came %s after NakWithDelay(%s)", delivery, got.Round(10*time.Millisecond), delay)
			if got > delay+3*time.Second {
				t.Errorf("BUG: delivery %d came %s after NakWithDelay(%s): the server stretches a Nak delay on a consumer with "+
					"BackOff to delay + BackOff[n-1] - AckWait, so deferred and retried work waits 30 s, 90 s, 210 s … instead",
					delivery, got.Round(time.Second), delay)
			}
		}
		if err := msg.NakWithDelay(delay); err != nil {
			t.Fatal(err)
		}
		nakAt = time.Now()
	}
}
