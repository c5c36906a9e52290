package execsvc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// RecordedBucket remembers which execs are recorded: key <RunRef.Key>.<execId>, value the
// command's base name and the inbox of the client that started it. A client's attach does not
// repeat its start's spec, so a replica that takes a recorded exec's stream over learns here
// that it must keep publishing its events, and under which command name; an observer's attach
// (another inbox) publishes nothing.
const RecordedBucket = "KUBECLIP_EXECS"

// recordedTTL outlasts any exec that can still be attached: sandboxd keeps a journal ten
// minutes after exit, and an agent command runs for hours at most.
const recordedTTL = 7 * 24 * time.Hour

// RecordedBucketConfig is the KUBECLIP_EXECS bucket. Only recorded execs (one agent command per
// run) write it.
func RecordedBucketConfig(replicas int) jetstream.KeyValueConfig {
	if replicas <= 0 {
		replicas = 1
	}
	return jetstream.KeyValueConfig{
		Bucket:       RecordedBucket,
		Description:  "kubeclip recorded execs (their events go to the run stream), keyed by run and exec id",
		History:      1,
		TTL:          recordedTTL,
		MaxValueSize: 1 << 10,
		Storage:      jetstream.FileStorage,
		Replicas:     replicas,
	}
}

// recordedExecs reads and writes RecordedBucket.
type recordedExecs struct{ kv jetstream.KeyValue }

type recordedExec struct {
	Command string `json:"command"`
	Inbox   string `json:"inbox"`
}

func recordedKey(ref events.RunRef, execID string) string { return ref.Key() + "." + execID }

// put notes that the exec is recorded for the client at inbox, before its command starts.
func (r recordedExecs) put(ctx context.Context, ref events.RunRef, execID, command, inbox string) error {
	data, _ := json.Marshal(recordedExec{Command: command, Inbox: inbox})
	if _, err := r.kv.Put(ctx, recordedKey(ref, execID), data); err != nil {
		return fmt.Errorf("noting that exec %s is recorded: %w", execID, err)
	}
	return nil
}

// get returns what was noted of a recorded exec; ok is false for an exec that is not recorded.
func (r recordedExecs) get(ctx context.Context, ref events.RunRef, execID string) (rec recordedExec, ok bool, err error) {
	entry, err := r.kv.Get(ctx, recordedKey(ref, execID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return recordedExec{}, false, nil
	}
	if err != nil {
		return recordedExec{}, false, fmt.Errorf("reading whether exec %s is recorded: %w", execID, err)
	}
	if err := json.Unmarshal(entry.Value(), &rec); err != nil || rec.Command == "" {
		return recordedExec{}, false, fmt.Errorf("decoding the record of exec %s: %w", execID, err)
	}
	return rec, true, nil
}
