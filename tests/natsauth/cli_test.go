package natsauth_test

import (
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// cliLeaseRecordGet is the direct get of the victim's lease record, as lease.Records.Get sends it.
func cliLeaseRecordGet(in *installation) string {
	return "$JS.API.DIRECT.GET.KV_" + lease.Bucket + ".$KV." + lease.Bucket + "." + in.victim.Key()
}

// TestCLIReadsLeaseRecords: `kubeclip lease show` reads a lease record with the CLI's user
// (lease.Records, as the workers read it); Paperclip's user cannot. The CLI reads nothing else of
// the bucket (no write, no get by sequence, no consumer), and a get whose reply it aims at the JS
// API acts on nothing.
func TestCLIReadsLeaseRecords(t *testing.T) {
	srv := authServer(t)
	in := install(t, srv)
	ctx := t.Context()

	cli := connect(t, srv, "cli")
	kv, err := cli.js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		t.Fatalf("the CLI opening the lease bucket: %v", err)
	}
	rec, _, err := lease.Records{KV: kv}.Get(ctx, in.victim)
	if err != nil || rec.State != "running" {
		t.Fatalf("the CLI reading the victim's lease record: %+v, %v", rec, err)
	}
	if _, err := kv.Put(ctx, in.victim.Key(), []byte(`{"state":"released"}`)); err == nil {
		t.Error("the CLI wrote a lease record")
	}
	cli.refused(t, "cli writing", "$KV."+lease.Bucket+"."+in.victim.Key())
	for _, reply := range []string{
		"$JS.API.STREAM.PURGE.KV_" + lease.Bucket,
		"$JS.API.STREAM.DELETE." + in.subjects.RunStream(),
		"$JS.API.CONSUMER.DELETE." + in.subjects.LeaseStream() + ".tenant-worker",
	} {
		if err := cli.PublishRequest(cliLeaseRecordGet(in), reply, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Request(cliLeaseRecordGet(in), nil, 5*time.Second); err != nil {
		t.Fatalf("the CLI's get after the deputies: %v", err)
	}
	in.intact(t)

	paperclip := connect(t, srv, "paperclip")
	if _, err := paperclip.js.KeyValue(ctx, lease.Bucket); err == nil {
		t.Error("Paperclip's user opened the lease bucket")
	}
	paperclip.refused(t, "paperclip opening the lease bucket", "$JS.API.STREAM.INFO.KV_"+lease.Bucket)
}

// TestCLIPublishesWhatPaperclipDoesAndLeaseRecords pins nats-auth.conf's CLI_PUBLISH: NATS cannot
// join two lists, so it repeats CLIENT_PUBLISH but the broker's key and mint requests and adds the lease
// records' reads, and the two must not drift apart.
func TestCLIPublishesWhatPaperclipDoesAndLeaseRecords(t *testing.T) {
	natstest.SetAuthPasswords(t)
	opts, err := server.ProcessConfigFile(natsAuthConf)
	if err != nil {
		t.Fatal(err)
	}
	allow := map[string][]string{}
	for _, u := range opts.Users {
		allow[u.Username] = u.Permissions.Publish.Allow
	}
	// The CLI does not mint (only the plugin hands the broker real values).
	paperclip := slices.DeleteFunc(append([]string{}, allow["paperclip"]...), func(s string) bool {
		return s == "paperclip.broker.*.*.mint" || s == "paperclip.broker.key"
	})
	want := append(paperclip,
		"$JS.API.STREAM.INFO.KV_"+lease.Bucket, "$JS.API.DIRECT.GET.KV_"+lease.Bucket+".$KV."+lease.Bucket+".>")
	if diff := cmp.Diff(want, allow["cli"]); diff != "" {
		t.Errorf("the cli user's publish permissions (-want +got):\n%s", diff)
	}
}
