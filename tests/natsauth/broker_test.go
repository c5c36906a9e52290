package natsauth_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/brokersvc"
	"github.com/kubeclip/kubeclip/pkg/broker/mintclient"
	"github.com/kubeclip/kubeclip/pkg/broker/mintproto"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// worker is a broker part run until the test ends.
type worker interface {
	Run(ctx context.Context) error
	Ready() <-chan struct{}
}

func runWorker(t *testing.T, what string, w worker) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%s: %v", what, err)
		}
	})
	select {
	case <-w.Ready():
	case err := <-done:
		t.Fatalf("%s ended before it was ready (a permission the broker user lacks?): %v", what, err)
	case <-time.After(10 * time.Second):
		t.Fatalf("%s not ready after 10 s", what)
	}
}

// TestBrokerUser runs the credential broker's NATS parts on the shipped broker user: it creates
// its bucket, watches it, answers its key and mints for Paperclip's plugin (through the CLIENTS
// account) into the plugin's inbox and for the dispatcher (user kubeclip) into the workers' mint
// inbox, and releases a lease's grants from its durable consumer on the run stream. The broker
// user may do nothing else (no run event, no lease record, no exec subject, no stream of
// kubeclip's, no answer into the CLI's or the workers' own inbox), the CLI may not mint or ask
// the key, nobody but the broker may receive a key or mint request (so nobody else can hand out
// a key to seal to), and neither the workers' user nor the clients read the grants.
func TestBrokerUser(t *testing.T) {
	srv := authServer(t)
	in := install(t, srv)
	ctx := t.Context()
	b := connect(t, srv, "broker")
	log := zerolog.New(zerolog.NewTestWriter(t))

	kv, err := events.EnsureBucket(ctx, b.js, broker.BucketOptions{StoreBytes: 1 << 30}.Config())
	if err != nil {
		t.Fatalf("the broker user creating its bucket: %v", err)
	}
	key := make([]byte, broker.SealingKeyLen)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	sealer, err := broker.NewSealer(key)
	if err != nil {
		t.Fatal(err)
	}
	store, err := broker.NewStore(broker.StoreOptions{KV: kv, Sealer: sealer, GrantsPerCompany: 10})
	if err != nil {
		t.Fatal(err)
	}
	cache, err := broker.NewCache(broker.CacheOptions{KV: kv, Sealer: sealer, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, "the grant cache", cache)
	releaser, err := brokersvc.NewReleaser(brokersvc.ReleaserOptions{JetStream: b.js, Subjects: in.subjects, Store: store, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, "the releaser", releaser)
	mint, err := brokersvc.NewMint(brokersvc.MintOptions{
		NATS: b.Conn, Subjects: in.subjects, Store: store, Log: log,
		Bindings: map[string]broker.Binding{"ANTHROPIC_API_KEY": {Hosts: []string{"api.anthropic.com"}, Headers: []broker.Header{broker.HeaderXAPIKey}}},
		Key:      sealer.MintKey(),
		Replies:  inbox.MustRule(append(inbox.DefaultClientPrefixes(), inbox.WorkersMintPrefix)...),
	})
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, "the mint service", mint)

	// The plugin mints, from its own account, and hears back in its inbox.
	subject, err := mintproto.NewSubjects(in.subjects).Mint(in.victim.CompanyID, in.victim.RunID)
	if err != nil {
		t.Fatal(err)
	}
	paperclip := connect(t, srv, "paperclip")
	pluginMints, err := mintclient.New(mintclient.Options{NATS: paperclip.Conn, Subjects: in.subjects, InboxPrefix: inbox.PaperclipPrefix})
	if err != nil {
		t.Fatal(err)
	}
	brokerKey, err := pluginMints.Key(ctx)
	if err != nil {
		t.Fatalf("the plugin asking the broker's key: %v", err)
	}
	if !brokerKey.Equal(sealer.MintKey().PublicKey()) {
		t.Fatal("the key the plugin heard is not the broker's")
	}
	ref := mintclient.Lease{CompanyID: in.victim.CompanyID, RunID: in.victim.RunID, LeaseID: "lease-1"}
	reply, err := pluginMints.Mint(ctx, brokerKey, ref, "ANTHROPIC_API_KEY", "sk-ant-real-value")
	if err != nil {
		t.Fatalf("the plugin's mint: %v", err)
	}
	// The dispatcher mints too (a run Secret's placeholder), from the workers' account, and
	// hears back in the workers' mint inbox.
	dispatcherMints, err := mintclient.New(mintclient.Options{NATS: in.worker.Conn, Subjects: in.subjects})
	if err != nil {
		t.Fatal(err)
	}
	env, err := dispatcherMints.Placeholders(ctx, mintclient.Lease{CompanyID: in.victim.CompanyID, RunID: in.victim.RunID, LeaseID: "lease-2"}, []string{"ANTHROPIC_API_KEY"}, map[string]string{"ANTHROPIC_API_KEY": "sk-ant-real-value"})
	if err != nil {
		t.Fatalf("the dispatcher's mint: %v", err)
	}
	if _, err := broker.ParsePlaceholder(env["ANTHROPIC_API_KEY"]); err != nil {
		t.Fatalf("the dispatcher's mint gave no placeholder: %v", err)
	}
	pod := netip.MustParseAddr("10.0.0.7")
	// The run-watcher reports the run's pod (here straight through the broker's store): its
	// grants resolve from there only.
	if _, err := store.BindRun(ctx, in.victim.CompanyID, in.victim.RunID, pod); err != nil {
		t.Fatal(err)
	}
	resolves := func() bool {
		_, err := cache.Resolve(reply.Placeholder, "api.anthropic.com", broker.HeaderXAPIKey, pod)
		return err == nil
	}
	eventually(t, "the minted placeholder to resolve", resolves)

	// The CLI may not mint or ask the key; an answer the broker would send into its inbox, or
	// into the workers' own inbox, is refused too.
	cli := connect(t, srv, "cli")
	keySubject := mintproto.NewSubjects(in.subjects).Key()
	for _, subj := range []string{subject, keySubject} {
		if err := cli.Publish(subj, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		cli.refused(t, "cli minting", subj)
	}
	for _, subj := range []string{inbox.CLIPrefix + ".x", inbox.WorkersPrefix + ".x"} {
		if err := b.Publish(subj, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		b.refused(t, "broker answering another inbox", subj)
	}
	// Nobody but the broker receives key requests (whoever answered one could have values
	// sealed to its own key) or mint requests.
	for _, c := range []struct {
		who  *conn
		subj string
	}{{paperclip, keySubject}, {in.worker, keySubject}, {in.worker, subject}, {cli, inbox.WorkersMintPrefix + ".>"}} {
		if _, err := c.who.SubscribeSync(c.subj); err != nil {
			t.Fatal(err)
		}
		c.who.refused(t, "subscribing to the broker's requests or the workers' mint answers", c.subj)
	}

	// What the broker user may not do.
	for _, subj := range []string{
		in.runSubject("result"),                            // a run event
		"$KV." + lease.Bucket + "." + in.victim.Key(),      // a lease record
		"$JS.API.STREAM.INFO.KV_" + lease.Bucket,           // the lease bucket
		"$JS.API.STREAM.CREATE." + in.subjects.RunStream(), // kubeclip's streams
		"$JS.API.STREAM.PURGE.KV_" + broker.Bucket,         // even its own bucket's purge
		"$JS.API.CONSUMER.DELETE." + in.subjects.RunStream() + ".broker-release",
		"$JS.API.CONSUMER.CREATE." + in.subjects.RunStream() + ".other",
		"paperclip.exec.victim.r1.start",
	} {
		if err := b.Publish(subj, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		b.refused(t, "broker publishing", subj)
	}
	if _, err := b.SubscribeSync("paperclip.exec.>"); err != nil {
		t.Fatal(err)
	}
	b.refused(t, "broker subscribing to exec requests", "paperclip.exec.>")

	// Nobody else reads the grants.
	for _, c := range []struct {
		who  *conn
		subj string
	}{
		{in.worker, "$JS.API.DIRECT.GET.KV_" + broker.Bucket + ".$KV." + broker.Bucket + ".>"},
		{in.worker, "$JS.API.CONSUMER.CREATE.KV_" + broker.Bucket},
		{in.worker, "$KV." + broker.Bucket + ".x"},
		{paperclip, "$JS.API.STREAM.INFO.KV_" + broker.Bucket},
		{cli, "$JS.API.STREAM.INFO.KV_" + broker.Bucket},
	} {
		if err := c.who.Publish(c.subj, nil); err != nil {
			t.Fatal(err)
		}
		c.who.refused(t, "reading the grants", c.subj)
	}
	if _, err := paperclip.SubscribeSync(subject); err != nil {
		t.Fatal(err)
	}
	paperclip.refused(t, "the plugin listening to mint requests", subject)
	in.intact(t)

	// The one run event it publishes: a run's usage, through the house's publisher, whose
	// JetStream ack comes to its own inbox. Not on a longer subject, and no other kind.
	pub, err := events.NewPublisher(events.PublisherOptions{JS: b.js, Subjects: in.subjects})
	if err != nil {
		t.Fatal(err)
	}
	usage := events.RunUsageEvent{RunID: in.victim.RunID, CompanyID: in.victim.CompanyID, Meter: "01K3M", Seq: 1, Usage: []events.ModelUsage{
		{Key: "ANTHROPIC_API_KEY", Host: "api.anthropic.com", Format: events.UsageFormatAnthropicMessages, Calls: 1, InputTokens: 25, OutputTokens: 17},
	}}
	ack, err := pub.Publish(ctx, usage)
	if err != nil {
		t.Fatalf("the broker user publishing a usage event: %v", err)
	}
	if ack.Stream != in.subjects.RunStream() || ack.Duplicate {
		t.Errorf("the usage event's ack: %+v, want stored in %s", ack, in.subjects.RunStream())
	}
	for _, subj := range []string{in.runSubject("usage") + ".x", in.runSubject("log"), in.runSubject("exec"), in.runSubject("created")} {
		if err := b.Publish(subj, []byte("{}")); err != nil {
			t.Fatal(err)
		}
		b.refused(t, "broker publishing", subj)
	}

	// The lease ends: the dispatcher's released event releases its grants.
	ev, _ := json.Marshal(events.RunReleasedEvent{RunID: in.victim.RunID, CompanyID: in.victim.CompanyID, ProviderLeaseID: "lease-1", State: events.ReleaseStopped})
	if _, err := in.worker.js.Publish(ctx, in.runSubject("released"), ev); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the placeholder to stop resolving after the release", func() bool { return !resolves() })
}

// TestBrokerOnlyMintsForThePluginAndDispatcher pins who may ask the broker (the plugin, and
// the workers' user for the dispatcher's run Secrets: not the CLI, whose CLI_PUBLISH is
// CLIENT_PUBLISH without the broker's subjects, TestCLIPublishesWhatPaperclipDoesAndLeaseRecords),
// who receives the requests (the broker alone), and who the workers' mint inbox is between (the
// broker answers, the workers' user listens).
func TestBrokerOnlyMintsForThePluginAndDispatcher(t *testing.T) {
	natstest.SetAuthPasswords(t)
	opts, err := server.ProcessConfigFile(natsAuthConf)
	if err != nil {
		t.Fatal(err)
	}
	mintInbox := inbox.WorkersMintPrefix + ".>"
	for _, u := range opts.Users {
		allow, sub := u.Permissions.Publish.Allow, u.Permissions.Subscribe.Allow
		for _, subj := range []string{"paperclip.broker.*.*.mint", "paperclip.broker.key"} {
			if got := slices.Contains(allow, subj); got != (u.Username == "paperclip" || u.Username == "kubeclip") {
				t.Errorf("user %s may publish %s: %v, want only paperclip and kubeclip", u.Username, subj, got)
			}
			if got := slices.Contains(sub, subj); got != (u.Username == "broker") {
				t.Errorf("user %s subscribes to %s: %v, want only broker", u.Username, subj, got)
			}
		}
		if got := slices.Contains(allow, mintInbox); got != (u.Username == "broker") {
			t.Errorf("user %s may publish into %s: %v, want only broker", u.Username, mintInbox, got)
		}
		if got := slices.Contains(sub, mintInbox); got != (u.Username == "kubeclip") {
			t.Errorf("user %s subscribes to %s: %v, want only kubeclip", u.Username, mintInbox, got)
		}
	}
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBrokerBudgetCounters: the broker user makes KUBECLIP_BUDGETS as the other workers do and
// counts each company's spend under broker.> (brokersvc.Budgets: a read, then compare-and-set
// writes); it may not touch the other workers' counters (exec, log, lease) nor purge the bucket.
// The status user reads the counters through its ephemeral scan (cmd/kubeclip
// TestStatusAsTheStatusUser), and may write none.
func TestBrokerBudgetCounters(t *testing.T) {
	srv := authServer(t)
	install(t, srv)
	ctx := t.Context()
	b := connect(t, srv, "broker")
	kv, err := events.EnsureBucket(ctx, b.js, events.BudgetBucketConfig(1, 0, 0))
	if err != nil {
		t.Fatalf("the broker user making %s: %v", events.BudgetBucket, err)
	}
	var failed atomic.Int64
	budgets, err := brokersvc.NewBudgets(brokersvc.BudgetOptions{KV: kv, TokensPerDay: 1000,
		StoreFailures: events.NewStoreFailures(zerolog.New(zerolog.NewTestWriter(t)), events.BudgetBucket, func(string) { failed.Add(1) })})
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, "the budgets", budgets)
	if rej := budgets.Admit(ctx, "acme"); rej != nil {
		t.Fatal(rej.Message)
	}
	budgets.Spent("acme", 70)
	key := events.SpendKey("acme", events.SpendDay(time.Now()))
	eventually(t, "acme's spend in its counter", func() bool {
		e, err := kv.Get(ctx, key)
		if err != nil {
			return false
		}
		s, err := events.DecodeSpend(e.Value())
		return err == nil && s == events.Spend{Requests: 1, Tokens: 70}
	})
	if n := failed.Load(); n > 0 {
		t.Errorf("%d of the broker user's reads or writes of its counters failed", n)
	}
	for _, subj := range []string{
		"$KV." + events.BudgetBucket + ".log.company.acme.1",
		"$KV." + events.BudgetBucket + ".exec.run.acme.r1",
		"$KV." + events.BudgetBucket + ".lease.company.acme.1",
		"$JS.API.STREAM.PURGE.KV_" + events.BudgetBucket,
		"$JS.API.DIRECT.GET.KV_" + events.BudgetBucket + ".$KV." + events.BudgetBucket + ".log.company.acme.1",
	} {
		if err := b.Publish(subj, []byte("1")); err != nil {
			t.Fatal(err)
		}
		b.refused(t, "broker publishing", subj)
	}
	status := connect(t, srv, "status")
	if err := status.Publish("$KV."+key, []byte("{}")); err != nil {
		t.Fatal(err)
	}
	status.refused(t, "status writing a spend counter", "$KV."+key)
}
