package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/api"
	"github.com/kubeclip/kubeclip/pkg/broker/brokersvc"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// TestStatusAsTheCLIUser runs `kubeclip status` as the shipped cli user, which may read the lease
// and run streams' info and nothing else of the workers' (nats-auth.conf): the command still
// answers within its bound, with what it could read, and every row it could not read names what
// failed. A report under this user is partial by design; docs/monitoring.md, `kubeclip status` says which
// permissions a full one needs.
func TestStatusAsTheCLIUser(t *testing.T) {
	in := install(t)
	start := time.Now()
	out, err := in.kubeclip(t.Context(), "cli", "status", "-o", "json", "--timeout", "8s")
	took := time.Since(start)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	var r statusReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("decoding %q: %v", out, err)
	}
	readable := map[string]bool{"PAPERCLIP_LEASES": true, "PAPERCLIP_RUNS": true, "KV_" + lease.Bucket: true}
	for _, s := range r.Streams {
		switch {
		case readable[s.Stream] && (s.Error != "" || s.Absent):
			t.Errorf("stream %s: %+v, want its usage", s.Stream, s)
		case !readable[s.Stream] && !strings.Contains(s.Error, "reading stream "+s.Stream+": "):
			t.Errorf("stream %s: error %q, want one naming it", s.Stream, s.Error)
		}
	}
	for _, c := range r.Consumers {
		if !c.Absent && !strings.Contains(c.Error, "reading consumer "+c.Consumer+" of stream "+c.Stream+": ") {
			t.Errorf("consumer %s/%s: %+v, want absent or an error naming it", c.Stream, c.Consumer, c)
		}
	}
	if !strings.Contains(r.Leases.Error, "reading the lease records (stream KV_KUBECLIP_LEASES): ") {
		t.Errorf("leases: %+v, want an error naming the bucket's stream", r.Leases)
	}
	t.Logf("status as the cli user took %s", took)
}

// TestStatusAsTheStatusUser runs `kubeclip status` as the shipped status user, on its own inbox
// prefix, against an installation whose worker consumers each hold a request and whose lease
// bucket holds records: every section reads fully (no row fails, each consumer's oldest request
// is found, the scan is complete), and no request waits for an answer that never comes, which
// is what a missing permission costs (TestStatusAsTheCLIUser).
func TestStatusAsTheStatusUser(t *testing.T) {
	in := install(t)
	ctx := t.Context()
	s, err := events.NewSubjects("")
	if err != nil {
		t.Fatal(err)
	}
	setUpStatusNATS(t, in.js, s)
	kv, err := in.js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	const records = 300 // more than one scan batch
	for i := range records {
		rec := lease.Record{CompanyID: "acme", RunID: fmt.Sprintf("run-%d", i), State: lease.StateCreated, Namespace: "kubeclip-t-acme", WorkloadName: fmt.Sprintf("pc-run-%d", i), Backend: "job", CreatedAt: time.Now().UTC()}
		if _, created, err := (lease.Records{KV: kv}).Create(ctx, rec); err != nil || !created {
			t.Fatalf("creating %s's record: created %v, %v", rec.RunID, created, err)
		}
	}
	// One request for each worker consumer, on a subject its filters take.
	for _, wc := range api.QueueConsumers(s) {
		c, err := in.js.Consumer(ctx, wc.Stream, wc.Consumer)
		if err != nil {
			t.Fatal(err)
		}
		cfg := c.CachedInfo().Config
		subject := cfg.FilterSubject
		if subject == "" {
			subject = cfg.FilterSubjects[0]
		}
		subject = strings.ReplaceAll(strings.ReplaceAll(subject, "*", "x"), ">", "x")
		if _, err := in.js.Publish(ctx, subject, []byte("{}")); err != nil {
			t.Fatalf("publishing to %s: %v", subject, err)
		}
	}

	// The credential broker, on its own user, makes the budgets bucket and counts acme's calls.
	spendAsTheBroker(t, in.url, "acme", 120, 30)

	start := time.Now()
	out, err := in.kubeclip(ctx, "status", "status", "-o", "json", "--timeout", "8s")
	took := time.Since(start)
	if err != nil {
		t.Fatalf("status: %v\n%s", err, out)
	}
	var r statusReport
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("decoding %q: %v", out, err)
	}
	for _, st := range r.Streams {
		if st.Error != "" {
			t.Errorf("stream %s: %s", st.Stream, st.Error)
		}
	}
	for _, c := range r.Consumers {
		if c.Error != "" || c.Absent || c.OldestPendingSeq == 0 {
			t.Errorf("consumer %s/%s: %+v, want its lag and oldest request", c.Stream, c.Consumer, c)
		}
	}
	if l := r.Leases; l.Error != "" || !l.Complete || l.Scanned != records {
		t.Errorf("leases: error %q, complete %v, scanned %d, want every one of %d records", l.Error, l.Complete, l.Scanned, records)
	}
	if sp := r.Spend; sp.Error != "" || !sp.Complete || len(sp.Companies) != 1 || sp.Companies[0] != (companySpend{Company: "acme", Requests: 2, Tokens: 150}) {
		t.Errorf("spend: %+v, want acme's 2 calls and 150 tokens, complete", sp)
	}
	// A request the user may not make goes unanswered: it waits statusRequestTimeout, or
	// deleteConsumerTimeout for the scan's consumer.
	if took >= deleteConsumerTimeout {
		t.Errorf("status took %s: some request went unanswered", took)
	}
	t.Logf("status as the status user took %s", took)
}

// spendAsTheBroker runs the credential broker's budgets on the shipped broker user: it creates
// KUBECLIP_BUDGETS (as cmd/credential-broker does) and counts one call of company per tokens
// value, written before it returns.
func spendAsTheBroker(t *testing.T, url, company string, tokens ...int64) {
	t.Helper()
	nc, err := nats.Connect(url, natstest.User("broker"), nats.CustomInboxPrefix(inbox.BrokerPrefix))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := events.EnsureBucket(t.Context(), js, events.BudgetBucketConfig(1, 0, 0))
	if err != nil {
		t.Fatalf("the broker user making %s: %v", events.BudgetBucket, err)
	}
	var failed atomic.Int64
	b, err := brokersvc.NewBudgets(brokersvc.BudgetOptions{KV: kv, TokensPerDay: 1 << 40,
		StoreFailures: events.NewStoreFailures(zerolog.New(zerolog.NewTestWriter(t)), events.BudgetBucket, func(string) { failed.Add(1) })})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	for _, n := range tokens {
		if rej := b.Admit(t.Context(), company); rej != nil {
			t.Fatal(rej.Message)
		}
		b.Spent(company, n)
	}
	cancel() // the last flush writes the spend
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := failed.Load(); n > 0 {
		t.Fatalf("the broker user's reads or writes of its counters failed %d times", n)
	}
}
