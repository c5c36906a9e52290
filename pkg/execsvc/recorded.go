package execsvc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/cas"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// RecordedBucket remembers which execs are recorded: key <RunRef.Key>.<execId>, value the
// command's base name, the inbox of the client that started it and how far its recording got
// (the journal seqs of the last event published or being published, what the events before it
// cost, and the budget that stopped it, if one did). A client's attach does not
// repeat its start's spec, so a replica that takes a recorded exec's stream over learns here
// that it must keep publishing its events, and under which command name; an observer's attach
// (another inbox) publishes nothing.
//
// An entry lives as long as its exec's recording: it is written before the command starts and
// purged once the exec's final event is stored (recording.complete), so the bucket holds the
// recorded execs in progress, not every exec of the TTL (294,337 ended execs filled it and
// refused every company's starts, issue 26). What the TTL still collects: the entry of an exec
// whose final event no session published (its client went away before the exit and never
// attached again).
const RecordedBucket = "KUBECLIP_EXECS"

// recordedTTL outlasts any exec that can still be attached: sandboxd keeps a journal ten
// minutes after exit, and an agent command runs for hours at most.
const recordedTTL = 7 * 24 * time.Hour

// RecordedBucketConfig is the KUBECLIP_EXECS bucket, its share of a store of storeBytes (0: the
// default). Only recorded execs (one agent command per run) write it.
func RecordedBucketConfig(replicas int, storeBytes int64) jetstream.KeyValueConfig {
	if replicas <= 0 {
		replicas = 1
	}
	return jetstream.KeyValueConfig{
		Bucket:       RecordedBucket,
		Description:  "kubeclip recorded execs (their events go to the run stream), keyed by run and exec id",
		History:      1,
		TTL:          recordedTTL,
		MaxValueSize: 1 << 10,
		// History 1 keeps one value per exec: about 300 bytes with headers, so its share of
		// the default store (65 MiB) holds every exec of some 200,000 runs in the TTL.
		MaxBytes: events.StoreLimit(storeBytes, events.StoreExecs),
		Storage:  jetstream.FileStorage,
		Replicas: replicas,
	}
}

// recordedExecs reads and writes RecordedBucket.
type recordedExecs struct {
	kv jetstream.KeyValue
	st events.StreamPurger // the bucket's stream: drop purges an entry
	// failures is told the entry writes that failed and were let through, and those that
	// went in (fail open: Service.start, recording.announce).
	failures *events.StoreFailures
}

type recordedExec struct {
	Command string `json:"command"`
	Inbox   string `json:"inbox"`
	// From and To are the journal seqs of the last event published or being published (0: none
	// yet). Stopped is the events.BudgetKind that stopped recording at seq From.
	From uint64 `json:"from,omitempty"`
	To   uint64 `json:"to,omitempty"`
	// Used is what the exec's events cost its budget before that event.
	Used    int64  `json:"used,omitempty"`
	Stopped string `json:"stopped,omitempty"`
}

func recordedKey(ref events.RunRef, execID string) string { return ref.Key() + "." + execID }

// put notes that the exec is recorded for the client at inbox, before its command starts, and
// returns what it wrote: the session starts its recording from it without reading it back.
func (r recordedExecs) put(ctx context.Context, ref events.RunRef, execID, command, inbox string) (notedExec, error) {
	entry := recordedExec{Command: command, Inbox: inbox}
	data, _ := json.Marshal(entry)
	rev, err := r.kv.Put(ctx, recordedKey(ref, execID), data)
	if err != nil {
		return notedExec{}, fmt.Errorf("noting that exec %s is recorded: %w", execID, err)
	}
	return notedExec{entry: entry, rev: rev}, nil
}

// notedExec is an exec's entry as a request wrote or read it, at its revision.
type notedExec struct {
	entry recordedExec
	rev   uint64
}

// get returns what was noted of a recorded exec and its revision; ok is false for an exec that
// is not recorded.
func (r recordedExecs) get(ctx context.Context, ref events.RunRef, execID string) (rec recordedExec, rev uint64, ok bool, err error) {
	entry, err := r.kv.Get(ctx, recordedKey(ref, execID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return recordedExec{}, 0, false, nil
	}
	if err != nil {
		return recordedExec{}, 0, false, fmt.Errorf("reading whether exec %s is recorded: %w", execID, err)
	}
	if err := json.Unmarshal(entry.Value(), &rec); err != nil || rec.Command == "" {
		return recordedExec{}, 0, false, fmt.Errorf("decoding the record of exec %s: %w", execID, err)
	}
	return rec, entry.Revision(), true, nil
}

// drop removes the exec's entry: its recording is complete (the final event is stored).
// Purged, not deleted: a delete leaves a marker as large as the entry, and a full bucket refuses
// it (events.PurgeKeys). Dropping an entry that is gone already (a redelivered exit, a session
// that took the stream over) is no error.
func (r recordedExecs) drop(ctx context.Context, ref events.RunRef, execID string) error {
	return events.PurgeKeys(ctx, r.st, RecordedBucket, recordedKey(ref, execID))
}

// advance replaces the exec's entry at revision rev with next and returns the new revision.
// errRecordingTakenOver: another session wrote it since.
func (r recordedExecs) advance(ctx context.Context, ref events.RunRef, execID string, next recordedExec, rev uint64) (uint64, error) {
	data, _ := json.Marshal(next)
	rev, err := r.kv.Update(ctx, recordedKey(ref, execID), data, rev)
	if cas.IsConflict(err) {
		return 0, errRecordingTakenOver
	}
	if err != nil {
		return 0, fmt.Errorf("noting the recording of exec %s: %w", execID, err)
	}
	return rev, nil
}
