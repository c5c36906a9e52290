package isolation

import (
	"sync"
	"testing"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestOneCompanysFloodCannotDelayAnothersFirstAttempt is issue 26 item 15 end to end: company A
// publishes 10,000 acquires at once (they fail retryably at the tenant-worker: A's admission
// webhook is down), and another company's acquire published right after them is created while
// at least 90 % of A's that waited then still wait for their first attempt. Before, the
// tenant-worker took first attempts in stream order: the other company's acquire waited for all
// of A's (58 s to 1 min 55 s).
func TestOneCompanysFloodCannotDelayAnothersFirstAttempt(t *testing.T) {
	cs := clustertest.Clientset(t)
	failing, other, warm := pt.NewID("co"), pt.NewID("co"), pt.NewID("co")
	for _, c := range []string{failing, other, warm} {
		pt.CleanupTenant(t, cs, c)
	}
	brokenWebhook(t, cs, failing)
	baseline := acquireLatency(t, warm)

	ctx := t.Context()
	pub, err := events.NewPublisher(events.PublisherOptions{JS: env.JS, Subjects: env.Subjects})
	if err != nil {
		t.Fatal(err)
	}
	cons, err := env.JS.Consumer(ctx, env.Subjects.LeaseStream(), events.TenantWorkerConsumer)
	if err != nil {
		t.Fatal(err)
	}
	agent := pt.NewID("agent")
	runs := make(chan struct{}, retryBacklog)
	for range retryBacklog {
		runs <- struct{}{}
	}
	close(runs)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for range runs {
				r := env.NewRun(t, failing, agent)
				if _, err := pub.Publish(ctx, r.Request(pt.StubConfig(nil))); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	purgeAtEnd(t, failing)
	waiting := func() uint64 {
		info, err := cons.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.NumPending + uint64(info.NumAckPending)
	}

	before := waiting()
	if before < retryBacklog/2 {
		t.Fatalf("only %d of the %d acquires still waited once all were published; the test needs a backlog", before, retryBacklog)
	}
	loaded := acquireLatency(t, other)
	after := waiting()
	t.Logf("another company's acquire → created: %s alone, %s behind %d of one company's acquires waiting for their first attempt (%d still waiting when it was created)", baseline, loaded, before, after)
	if after < before*9/10 {
		t.Errorf("another company's acquire was created after %d of the %d acquires waiting before it had their first attempt; want while at least 90%% still waited", before-after, before)
	}
}
