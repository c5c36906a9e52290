package execsvc_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// TestRepliesOnlyIntoInboxes sends, as a client, exec requests whose reply subjects are
// JetStream API calls the exec-worker's user may make: the answer (an `error`, or the empty
// heartbeat of a quiet command) would be a valid request. The replica drops them unanswered and
// the streams stay whole.
func TestRepliesOnlyIntoInboxes(t *testing.T) {
	e := newEnv(t, 1)
	l := e.newLease(newID("co"))
	runStream := e.subjects.RunStream()
	leaseStream := "KV_" + lease.Bucket
	before := streamMsgs(t, e.js, leaseStream)
	if before == 0 {
		t.Fatalf("stream %s holds no lease record", leaseStream)
	}

	subj, err := execproto.NewSubjects(e.subjects).Request(l.CompanyID, l.RunID, execproto.OpStart)
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		reply string
		start execproto.StartRequest
	}{
		{reply: "$JS.API.STREAM.PURGE." + leaseStream, start: execproto.StartRequest{Command: "printf", Args: []string{"{}"}}},
		{reply: "$JS.API.STREAM.DELETE." + runStream, start: execproto.StartRequest{Command: "sleep", Args: []string{"3"}}},
		// Not an inbox either: a prefix of one, and another user's inbox than the clients'.
		{reply: "_INBOX_cli", start: execproto.StartRequest{Command: "true"}},
		{reply: "_INBOX_kubeclip.x", start: execproto.StartRequest{Command: "true"}},
	} {
		tc.start.ExecID = newID("deputy")
		tc.start.ProviderLeaseID = l.ProviderLeaseID
		data, _ := json.Marshal(tc.start)
		if err := e.clientNC.PublishRequest(subj, tc.reply, data); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	// nats-server (v2.15.3 on) refuses the two replies under $JS. itself (a permissions
	// violation: they never reach the replica); the replica drops the other two. The requests
	// are handled in order, so once it dropped those the first two were refused.
	r := e.replicas[0]
	eventually(t, "the replica dropped the two requests the server passed (or both streams were damaged)", func() bool {
		return r.dropped.Load() >= 2 || leasesPurged(t, e.js, leaseStream) && streamGone(t, e.js, runStream)
	})
	if got := streamMsgs(t, e.js, leaseStream); got != before {
		t.Errorf("stream %s holds %d messages, want %d: a reply purged it", leaseStream, got, before)
	}
	if _, err := e.js.Stream(t.Context(), runStream); err != nil {
		t.Errorf("stream %s: %v: a reply deleted it", runStream, err)
	}
	// The client's own inbox still gets its answers.
	if res := e.run(l, execclient.Exec{Command: "echo", Args: []string{"ok"}}); string(res.Stdout) != "ok\n" {
		t.Errorf("exec through the client's inbox: stdout %q", res.Stdout)
	}
}

func streamMsgs(t *testing.T, js jetstream.JetStream, name string) uint64 {
	t.Helper()
	s, err := js.Stream(t.Context(), name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	info, err := s.Info(t.Context())
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	return info.State.Msgs
}

// leasesPurged reports the lease stream emptied (or gone).
func leasesPurged(t *testing.T, js jetstream.JetStream, name string) bool {
	t.Helper()
	s, err := js.Stream(t.Context(), name)
	if err != nil {
		return true
	}
	info, err := s.Info(t.Context())
	return err == nil && info.State.Msgs == 0
}

// streamGone reports the stream deleted.
func streamGone(t *testing.T, js jetstream.JetStream, name string) bool {
	t.Helper()
	_, err := js.Stream(t.Context(), name)
	return errors.Is(err, jetstream.ErrStreamNotFound)
}
