package events_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	natsservertest "github.com/nats-io/nats-server/v2/test"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

func TestEnsureStreamsIsIdempotentAndApplied(t *testing.T) {
	_, _, js := natstest.Start(t)
	ctx := t.Context()
	for i := range 2 {
		if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
			t.Fatalf("EnsureStreams call %d: %v", i+1, err)
		}
	}

	type streamWant struct {
		subjects   []string
		retention  jetstream.RetentionPolicy
		maxAge     time.Duration
		duplicates time.Duration
		maxMsgSize int32
		storage    jetstream.StorageType
		replicas   int
		direct     bool
	}
	wants := map[string]streamWant{
		"PAPERCLIP_LEASES": {[]string{"paperclip.lease.>"}, jetstream.LimitsPolicy, 7 * 24 * time.Hour, 10 * time.Minute, 1 << 20, jetstream.FileStorage, 1, false},
		"PAPERCLIP_RUNS":   {[]string{"paperclip.run.>"}, jetstream.LimitsPolicy, 14 * 24 * time.Hour, 10 * time.Minute, 1 << 20, jetstream.FileStorage, 1, true},
		"KUBECLIP_WORK":    {[]string{"kubeclip.dispatch.>"}, jetstream.WorkQueuePolicy, 24 * time.Hour, 10 * time.Minute, 1 << 20, jetstream.FileStorage, 1, false},
	}
	for name, want := range wants {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		c := info.Config
		got := streamWant{c.Subjects, c.Retention, c.MaxAge, c.Duplicates, c.MaxMsgSize, c.Storage, c.Replicas, c.AllowDirect}
		if diff := cmp.Diff(want, got, cmp.AllowUnexported(streamWant{})); diff != "" {
			t.Errorf("stream %s (-want +got):\n%s", name, diff)
		}
	}

	// A changed setting is applied on the next call.
	if err := events.EnsureStreams(ctx, js, events.Options{RunMaxAge: 30 * 24 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "PAPERCLIP_RUNS")
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().Config.MaxAge; got != 30*24*time.Hour {
		t.Errorf("updated run max age = %s, want 720h", got)
	}
}

// TestEnsureStreamsUpdatesOnlyWhatChanged: a worker's start-up leaves an unchanged stream alone
// (nats-server applies even an unchanged update to its store, racing consumer creation), and
// still applies a changed setting. The server announces each update it applies as an advisory.
func TestEnsureStreamsUpdatesOnlyWhatChanged(t *testing.T) {
	_, nc, js := natstest.Start(t)
	ctx := t.Context()
	updates, err := nc.SubscribeSync("$JS.EVENT.ADVISORY.STREAM.UPDATED.>")
	if err != nil {
		t.Fatal(err)
	}
	updated := func() []string {
		t.Helper()
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		var names []string
		for {
			m, err := updates.NextMsg(200 * time.Millisecond)
			if err != nil {
				return names
			}
			names = append(names, strings.TrimPrefix(m.Subject, "$JS.EVENT.ADVISORY.STREAM.UPDATED."))
		}
	}
	for i := range 3 {
		if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
			t.Fatalf("EnsureStreams call %d: %v", i+1, err)
		}
	}
	if got := updated(); len(got) != 0 {
		t.Errorf("unchanged streams were updated: %v", got)
	}
	if err := events.EnsureStreams(ctx, js, events.Options{RunMaxAge: 30 * 24 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	if got := updated(); !cmp.Equal(got, []string{"PAPERCLIP_RUNS"}) {
		t.Errorf("updated %v, want only PAPERCLIP_RUNS", got)
	}
}

func TestEnsureStreamsWithPrefix(t *testing.T) {
	_, _, js := natstest.Start(t)
	ctx := t.Context()
	if err := events.EnsureStreams(ctx, js, events.Options{Prefix: "acme", Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, "ACME_RUNS")
	if err != nil {
		t.Fatal(err)
	}
	if c := st.CachedInfo().Config; c.Subjects[0] != "acme.run.>" || c.Storage != jetstream.MemoryStorage {
		t.Errorf("ACME_RUNS config: %+v", c)
	}
}

func TestOptionsValidate(t *testing.T) {
	tests := []struct {
		name    string
		opts    events.Options
		wantErr string
	}{
		{name: "defaults", opts: events.Options{}},
		{name: "bad prefix", opts: events.Options{Prefix: "a.b"}, wantErr: "subject prefix"},
		{name: "replicas", opts: events.Options{Replicas: 7}, wantErr: "replicas"},
		{name: "negative age", opts: events.Options{RunMaxAge: -time.Hour}, wantErr: "run max age must be positive"},
		{name: "window longer than work age", opts: events.Options{WorkMaxAge: time.Minute}, wantErr: "must not exceed the work max age"},
		{name: "tiny messages", opts: events.Options{MaxMsgSize: 1024}, wantErr: "max message size"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.opts.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Validate = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestRunRefKey(t *testing.T) {
	tests := []struct {
		company, run, want string
	}{
		{"7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13", "3f0e9a4c-8a61-4a1e-9d0b-6f3b2c1d0e9f", "7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13.3f0e9a4c-8a61-4a1e-9d0b-6f3b2c1d0e9f"},
		{"acme", "run_1=ok", "acme.run_1=ok"},
		{"acme", "run:1", "acme._b64_cnVuOjE"},
		{"société", "r1", "_b64_c29jacOpdMOp.r1"},
		{"acme", "_b64_x", "acme._b64_X2I2NF94"}, // an id that looks encoded is encoded too, so keys never collide
	}
	for _, tc := range tests {
		ref := events.Ref(tc.company, tc.run)
		if got := ref.Key(); got != tc.want {
			t.Errorf("Ref(%q, %q).Key() = %q, want %q", tc.company, tc.run, got, tc.want)
		}
		if back, ok := events.ParseRunKey(tc.want); !ok || back != ref {
			t.Errorf("ParseRunKey(%q) = %+v, %v; want %+v", tc.want, back, ok, ref)
		}
	}
	// Issue 8.3: two companies' runs with the same id are two keys and two message ids.
	a, b := events.Ref("company-a", "run-1"), events.Ref("company-b", "run-1")
	if a.Key() == b.Key() || a.MsgID("acquire") == b.MsgID("acquire") {
		t.Errorf("runs of two companies share a key or message id: %q, %q", a.Key(), a.MsgID("acquire"))
	}
	for _, key := range []string{"nodot", "a.b.c", "._b64_!!", "a."} {
		if ref, ok := events.ParseRunKey(key); ok {
			t.Errorf("ParseRunKey(%q) = %+v, want not ok", key, ref)
		}
	}
}

func TestStreamsRejectOversizedMessages(t *testing.T) {
	_, _, js := natstest.Start(t)
	if err := events.EnsureStreams(t.Context(), js, events.Options{MaxMsgSize: 64 << 10}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(t.Context(), "paperclip.lease.c1.acquire", make([]byte, 64<<10+1)); err == nil {
		t.Error("the lease stream stored a message over its MaxMsgSize")
	}
	if _, err := js.Publish(t.Context(), "paperclip.lease.c1.acquire", make([]byte, 1024)); err != nil {
		t.Errorf("a small message was refused: %v", err)
	}
}

// TestStreamsAreSizedFromTheStore: every stream has a byte limit, its share of the operator's
// store. A full run stream still stores a new result (the oldest events go: DiscardOld), a full
// work queue refuses a new dispatch (DiscardNew: a request is never dropped unhandled), so one
// company's output can never make the store refuse every company's writes.
func TestStreamsAreSizedFromTheStore(t *testing.T) {
	_, _, js := natstest.Start(t)
	ctx := t.Context()
	const store = 16 << 20
	opts := events.Options{StoreBytes: store}
	if err := events.EnsureStreams(ctx, js, opts); err != nil {
		t.Fatal(err)
	}
	// The tenant-worker's retry stream, sized the same way by its own owner.
	if _, err := js.CreateOrUpdateStream(ctx, events.RetryStreamConfig(1, store)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		share   int64
		discard jetstream.DiscardPolicy
	}{
		{"PAPERCLIP_RUNS", store / 1000 * 600, jetstream.DiscardOld},
		{"PAPERCLIP_LEASES", store / 1000 * 30, jetstream.DiscardOld},
		{"KUBECLIP_WORK", store / 1000 * 30, jetstream.DiscardNew},
		{"KUBECLIP_RETRY", store / 1000 * 30, jetstream.DiscardNew},
	} {
		st, err := js.Stream(ctx, tc.name)
		if err != nil {
			t.Fatal(err)
		}
		if c := st.CachedInfo().Config; c.MaxBytes != tc.share || c.Discard != tc.discard {
			t.Errorf("%s: max bytes %d, discard %v; want %d, %v", tc.name, c.MaxBytes, c.Discard, tc.share, tc.discard)
		}
	}

	// Fill the run stream past its limit with one company's events.
	pub, err := events.NewPublisher(events.PublisherOptions{JS: js})
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 60<<10)
	runs, _ := js.Stream(ctx, "PAPERCLIP_RUNS")
	limit := runs.CachedInfo().Config.MaxBytes
	for i := 0; ; i++ {
		ev := events.RunLogEvent{RunID: "r-flood", CompanyID: "c-flood", Seq: uint64(i + 1), Pod: "p", Container: "agent", Lines: []events.LogLine{{TS: "2026-08-24T10:30:00.000000001Z", Text: big}}}
		if _, err := pub.Publish(ctx, ev); err != nil {
			t.Fatalf("log event %d: %v", i+1, err)
		}
		if int64(i)*int64(len(big)) > 2*limit {
			break
		}
	}
	info, err := runs.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if int64(info.State.Bytes) > limit {
		t.Errorf("the run stream holds %d bytes, over its %d limit", info.State.Bytes, limit)
	}
	ok := true
	if _, err := pub.Publish(ctx, events.RunResultEvent{RunID: "r-other", CompanyID: "c-other", Outcome: events.OutcomeSucceeded}); err != nil {
		ok = false
		t.Errorf("a result after the flood was refused: %v", err)
	}
	if ok {
		if _, err := runs.GetLastMsgForSubject(ctx, "paperclip.run.c-other.r-other.result"); err != nil {
			t.Errorf("the result is not in the full stream: %v", err)
		}
	}

	// A full work queue refuses new dispatches instead of dropping one nobody handled.
	work, _ := js.Stream(ctx, "KUBECLIP_WORK")
	wlimit := work.CachedInfo().Config.MaxBytes
	var refused error
	for i := 0; refused == nil && int64(i)*int64(len(big)) <= 2*wlimit; i++ {
		_, refused = js.Publish(ctx, fmt.Sprintf("kubeclip.dispatch.c-flood.r-%d", i), []byte(big))
	}
	if refused == nil {
		t.Error("the work queue took twice its byte limit")
	}
}

// TestStreamsFitTheShippedStore: with the shipped nats.conf's store (max_file_store 8GB,
// max_memory_store 64MB) the default streams and the budget bucket are created; a server with a
// smaller store refuses them, which is why --store-bytes must be the server's.
func TestStreamsFitTheShippedStore(t *testing.T) {
	for _, tc := range []struct {
		name     string
		maxStore int64
		wantErr  bool
	}{
		{"shipped 8GB", 8 << 30, false},
		{"a 1 GiB server with the default --store-bytes", 1 << 30, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := natsservertest.DefaultTestOptions
			opts.Port = -1
			opts.JetStream = true
			opts.StoreDir = t.TempDir()
			opts.JetStreamMaxStore = tc.maxStore
			opts.JetStreamMaxMemory = 64 << 20
			srv := natsservertest.RunServer(&opts)
			t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
			_, js := natstest.Connect(t, srv)
			err := events.EnsureStreams(t.Context(), js, events.Options{})
			if err == nil {
				_, err = js.CreateOrUpdateKeyValue(t.Context(), events.BudgetBucketConfig(1, 0, 0))
			}
			if (err != nil) != tc.wantErr {
				t.Errorf("creating the streams and the budget bucket: %v, want an error: %v", err, tc.wantErr)
			}
		})
	}
}

// TestEnsureStreamsReturnsAConfigErrorAtOnce: EnsureStreams waits for a cluster that is still
// forming, but an answer no wait can change (3 replicas on a server that is not clustered) is
// returned at once, naming the stream, not after the retry bound.
func TestEnsureStreamsReturnsAConfigErrorAtOnce(t *testing.T) {
	_, _, js := natstest.Start(t)
	err := events.EnsureStreams(t.Context(), js, events.Options{Prefix: "paperclip", Replicas: 3})
	if err == nil || !strings.Contains(err.Error(), "PAPERCLIP_LEASES") {
		t.Fatalf("EnsureStreams = %v, want an error naming PAPERCLIP_LEASES", err)
	}
	var api *jetstream.APIError
	if !errors.As(err, &api) || api.ErrorCode != 10074 || strings.Contains(err.Error(), "attempts") {
		t.Errorf("EnsureStreams = %v, want the server's first answer (10074, replicas > 1 not supported)", err)
	}
}
