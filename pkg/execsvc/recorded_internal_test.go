package execsvc

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// replicatedConflicts is a bucket whose Update conflicts come back as a replicated (R>1)
// bucket's do: code 10164, which nats.go maps to ErrKeyRevisionMismatch only (not ErrKeyExists).
type replicatedConflicts struct{ jetstream.KeyValue }

func (kv replicatedConflicts) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	n, err := kv.KeyValue.Update(ctx, key, value, rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		apiErr := &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant, Description: "wrong last sequence"}
		return n, fmt.Errorf("%w: %w", apiErr, jetstream.ErrKeyRevisionMismatch)
	}
	return n, err
}

// TestAdvanceAfterATakeover: a session that advances a recorded exec at a revision another
// session wrote past learns that the recording was taken over, on a single-replica bucket and
// on a replicated one alike.
func TestAdvanceAfterATakeover(t *testing.T) {
	_, _, js := natstest.Start(t)
	kv, err := js.CreateOrUpdateKeyValue(t.Context(), RecordedBucketConfig(1, 0))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		kv   jetstream.KeyValue
	}{{"one replica", kv}, {"replicated", replicatedConflicts{kv}}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			r := recordedExecs{kv: tc.kv}
			ref, execID := events.Ref("acme", "r1"), "x-"+tc.name[:3]
			noted, err := r.put(ctx, ref, execID, "claude", "_INBOX.a")
			if err != nil {
				t.Fatal(err)
			}
			entry, rev, _, err := r.get(ctx, ref, execID)
			if err != nil {
				t.Fatal(err)
			}
			// The session starts from what the start wrote, without this read (startRecording).
			if noted.rev != rev || noted.entry != entry {
				t.Fatalf("put noted %+v at revision %d; the bucket holds %+v at %d", noted.entry, noted.rev, entry, rev)
			}
			if _, err := r.advance(ctx, ref, execID, recordedExec{Command: "claude", Inbox: "_INBOX.b", From: 1, To: 1}, rev); err != nil {
				t.Fatalf("the new session's advance: %v", err)
			}
			_, err = r.advance(ctx, ref, execID, recordedExec{Command: "claude", Inbox: "_INBOX.a", From: 1, To: 1}, rev)
			if !errors.Is(err, errRecordingTakenOver) {
				t.Errorf("the old session's advance = %v, want errRecordingTakenOver", err)
			}
		})
	}
}
