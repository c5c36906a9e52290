package tenant

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// acquireMsg is an acquire as the worker's consumer delivers it: handle and reportFailure read
// its subject and payload only.
type acquireMsg struct {
	jetstream.Msg
	subject string
	data    []byte
}

func (m acquireMsg) Subject() string { return m.subject }
func (m acquireMsg) Data() []byte    { return m.data }

// TestAcquirePastTheRecordQuotaFails: an acquire of a company that created its quota of lease
// records today fails with a `failed` event, code quota_exceeded, whose message names the quota,
// and leaves no lease record (a company past its quota writes nothing to KUBECLIP_LEASES). It is
// refused before anything touches Kubernetes.
func TestAcquirePastTheRecordQuotaFails(t *testing.T) {
	_, _, js := natstest.Start(t)
	ctx := t.Context()
	if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := lease.EnsureBuckets(ctx, js, lease.BucketOptions{}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	counters, err := events.EnsureBucket(ctx, js, events.BudgetBucketConfig(1, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	quota, err := lease.NewRecordQuota(counters, 1, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := events.NewPublisher(events.PublisherOptions{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	w := &Worker{
		opts: Options{JetStream: js, Now: time.Now}, log: zerolog.New(zerolog.NewTestWriter(t)),
		publisher: pub, records: lease.Records{KV: kv}, quota: quota,
	}
	// The company's one record of the day.
	if _, _, err := w.records.CreateCounted(ctx, lease.Record{RunID: "run-0", CompanyID: "co-a", State: lease.StateRequested}, quota); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(map[string]any{"runId": "run-1", "companyId": "co-a", "environmentId": "env", "agentId": "agent", "config": map[string]any{}})
	m := acquireMsg{subject: "paperclip.lease.co-a.acquire", data: data}
	err = w.handle(ctx, m)
	var te *events.TerminalError
	if !errors.As(err, &te) || te.Code != events.CodeQuotaExceeded {
		t.Fatalf("handle: %v, want a terminal quota_exceeded", err)
	}
	if err := w.reportFailure(ctx, m, te); err != nil {
		t.Fatal(err)
	}
	if _, _, err := w.records.Get(ctx, events.Ref("co-a", "run-1")); !errors.Is(err, lease.ErrNotFound) {
		t.Errorf("the refused acquire has a lease record: %v", err)
	}
	stream, err := js.Stream(ctx, events.Subjects{}.RunStream())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := stream.GetLastMsgForSubject(ctx, "paperclip.run.co-a.run-1.failed")
	if err != nil {
		t.Fatalf("no failed event: %v", err)
	}
	var failed events.RunFailedEvent
	if err := json.Unmarshal(raw.Data, &failed); err != nil {
		t.Fatal(err)
	}
	if failed.Code != events.CodeQuotaExceeded || !strings.Contains(failed.Message, "1 lease records within 24h0m0s, its lease-record quota") {
		t.Errorf("failed event %+v, want quota_exceeded naming the lease-record quota", failed)
	}
}
