package lease

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

// Record is a run's lease as kubeclip keeps it in KUBECLIP_LEASES, keyed by the run's RunRef
// (company and run id: a run id names a run only within its company). The tenant-worker creates
// it when it accepts the acquire, before anything else happens, so every acquire, also one that
// fails, leaves a record: a redelivered or replayed acquire finds it and does nothing twice.
// Its state changes only through the transitions in state.go, with compare-and-set.
type Record struct {
	RunID     string `json:"runId"`
	CompanyID string `json:"companyId"`
	AgentID   string `json:"agentId,omitempty"`
	State     State  `json:"state"`
	// Namespace, WorkloadName, SecretName and Backend are set by the dispatch transition: the
	// workload name is chosen once, so a redelivered dispatch reuses it.
	Namespace    string `json:"namespace,omitempty"`
	WorkloadName string `json:"workloadName,omitempty"`
	SecretName   string `json:"secretName,omitempty"`
	Backend      string `json:"backend,omitempty"`
	// Warm is set by the dispatch transition when the workload is a warm pod the acquire bound
	// (policy.RenderWarmPod): a redelivered dispatch binds that pod again instead of creating
	// one under its name.
	Warm bool `json:"warm,omitempty"`
	// Failure is the code the acquire failed with (state failed).
	Failure events.Code `json:"failure,omitempty"`
	// Ending is the request that ended the lease (release or destroy) once one came, and
	// CancelActiveWork what it asked for.
	Ending           events.LeaseKind `json:"ending,omitempty"`
	CancelActiveWork bool             `json:"cancelActiveWork,omitempty"`
	CreatedAt        time.Time        `json:"createdAt"`
	ExpiresAt        *time.Time       `json:"expiresAt,omitempty"`

	// The fields of a reusable lease, which serves the agent's runs one after another (its
	// providerLeaseId, the WorkloadName, is the host's for all of them). Every one is omitted
	// when zero, so a record of any other lease encodes as it did before they existed.
	//
	// Reusable is fixed when the record is created: the host may resume the lease.
	Reusable bool `json:"reusable,omitempty"`
	// VolumeClaim is its PersistentVolumeClaim (set by the dispatch transition), holding the
	// workspace and the agent's home; it outlives the lease's pods.
	VolumeClaim string `json:"volumeClaim,omitempty"`
	// Generation numbers its pods: 0 the first, one more for each resume that made a new pod
	// (of a suspended lease). Suspend and resume act on one generation's pod.
	Generation int `json:"generation,omitempty"`
	// Resumes counts the host's resumes that moved the lease (of a retained or suspended one).
	Resumes int `json:"resumes,omitempty"`
	// ResumedFrom is where the last of those resumes found the lease (retained: its pod kept;
	// suspended: a new pod made), so every answer to that resume says so: a redelivered one, or
	// the host's retry, finds the lease resuming or created already.
	ResumedFrom events.ResumedFrom `json:"resumedFrom,omitempty"`
	// RetainedAt is when the host last released it (state retained): the idle window runs
	// from it. SuspendedAt is when its pod was deleted (state suspended): the maximum age runs
	// from it.
	RetainedAt  *time.Time `json:"retainedAt,omitempty"`
	SuspendedAt *time.Time `json:"suspendedAt,omitempty"`
	// Collected is set when it ends because it stayed suspended past the maximum age.
	Collected bool `json:"collected,omitempty"`
	// RunDeadlineSec is how long each run it serves may use it: its acquire's deadline (the
	// config's podActivityDeadlineSec, or what requestedExpiresAt left of it). The acquire's
	// ExpiresAt is that long after it, and each resume renews ExpiresAt to that long after the
	// resume (Resume); the dispatcher's sweep suspends a lease still in use past ExpiresAt
	// (BeginSuspend), since its pod has no deadline of its own (policy.RunSpec.VolumeClaim).
	RunDeadlineSec int64 `json:"runDeadlineSec,omitempty"`
}

// Ref is the run the record belongs to.
func (r Record) Ref() events.RunRef { return events.Ref(r.CompanyID, r.RunID) }

// Records reads and writes lease records.
type Records struct {
	KV jetstream.KeyValue
}

// ErrNotFound is returned when the run has no lease record.
var ErrNotFound = errors.New("no lease record")

// Get returns the run's record and its revision.
func (r Records) Get(ctx context.Context, ref events.RunRef) (Record, uint64, error) {
	entry, err := r.KV.Get(ctx, ref.Key())
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Record{}, 0, ErrNotFound
	}
	if err != nil {
		return Record{}, 0, fmt.Errorf("reading lease record of run %s: %w", ref.RunID, err)
	}
	rec, err := decodeRecord(entry.Value())
	if err != nil {
		return Record{}, 0, fmt.Errorf("decoding lease record of run %s: %w", ref.RunID, err)
	}
	return rec, entry.Revision(), nil
}

// decodeRecord reads a KUBECLIP_LEASES value.
func decodeRecord(data []byte) (Record, error) {
	var rec Record
	if err := json.Unmarshal(data, &rec); err != nil {
		return Record{}, err
	}
	return rec, nil
}

// Create stores rec unless the run already has a record, in which case it returns the existing
// one and created false: the first writer wins and everyone agrees on what it wrote.
func (r Records) Create(ctx context.Context, rec Record) (stored Record, created bool, err error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return Record{}, false, fmt.Errorf("encoding lease record: %w", err)
	}
	_, err = r.KV.Create(ctx, rec.Ref().Key(), data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		stored, _, err := r.Get(ctx, rec.Ref())
		return stored, false, err
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("creating lease record of run %s: %w", rec.RunID, err)
	}
	return rec, true, nil
}

// Modify applies change to the run's record with compare-and-set, reading it again and retrying
// when another writer updated it in between (a release racing the run's dispatch, say). change
// returns false when the record needs no write, or an error (a transition the record's state
// does not allow), which Modify returns with the record as it was read. It returns the record
// as stored.
func (r Records) Modify(ctx context.Context, ref events.RunRef, change func(*Record) (bool, error)) (Record, error) {
	var read, next Record
	var refused error
	_, err := cas.Update(ctx, r.KV, ref.Key(), func(current []byte, _ uint64) ([]byte, bool, error) {
		if current == nil {
			return nil, false, ErrNotFound
		}
		rec, err := decodeRecord(current)
		if err != nil {
			return nil, false, fmt.Errorf("decoding it: %w", err)
		}
		read, next = rec, rec
		changed, err := change(&next)
		if err != nil {
			refused = err
			return nil, false, err
		}
		if !changed {
			next = rec
			return nil, false, nil
		}
		data, err := json.Marshal(next)
		if err != nil {
			return nil, false, fmt.Errorf("encoding lease record: %w", err)
		}
		return data, true, nil
	})
	switch {
	case refused != nil:
		return read, refused
	case errors.Is(err, ErrNotFound):
		return Record{}, ErrNotFound
	case err != nil:
		return Record{}, fmt.Errorf("updating lease record of run %s: %w", ref.RunID, err)
	}
	return next, nil
}

// RecordFailure marks the lease of a failed acquire (m, its acquire or dispatch message) as
// failed with code, creating the record when the acquire failed before one was written (a
// payload that does not decode), and has the failed record expire after FailedRecordTTL. A
// message that names no valid run has no lease to mark.
func RecordFailure(ctx context.Context, r Records, m jetstream.Msg, code events.Code, now time.Time) error {
	ref, kind := events.FailureRef(m)
	if ref.Validate() != nil || kind != events.LeaseAcquire {
		return nil
	}
	data, err := json.Marshal(Record{RunID: ref.RunID, CompanyID: ref.CompanyID, State: StateFailed, Failure: code, CreatedAt: now.UTC()})
	if err != nil {
		return fmt.Errorf("encoding lease record: %w", err)
	}
	_, err = r.KV.Create(ctx, ref.Key(), data, jetstream.KeyTTL(FailedRecordTTL))
	if !errors.Is(err, jetstream.ErrKeyExists) {
		if err != nil {
			return fmt.Errorf("creating lease record of run %s: %w", ref.RunID, err)
		}
		return nil
	}
	_, err = r.Modify(ctx, ref, Fail(code))
	if errors.Is(err, ErrEnded) || errors.Is(err, ErrFinished) || errors.Is(err, ErrFailed) {
		return nil // a late failure of a lease that moved on does not change it
	}
	if err != nil {
		return err
	}
	return r.expireFailed(ctx, ref)
}

// expireFailed rewrites the run's failed record to expire after FailedRecordTTL: the record and
// its earlier revisions are purged (at the revision read, so a writer in between wins) and the
// failed record created again with the TTL. A KV update cannot carry a TTL, and without the
// purge an earlier revision (requested) would outlive it.
func (r Records) expireFailed(ctx context.Context, ref events.RunRef) error {
	entry, err := r.KV.Get(ctx, ref.Key())
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading lease record of run %s: %w", ref.RunID, err)
	}
	if rec, err := decodeRecord(entry.Value()); err != nil || rec.State != StateFailed {
		return nil // not failed (any more): it keeps RecordTTL
	}
	err = r.KV.Purge(ctx, ref.Key(), jetstream.LastRevision(entry.Revision()))
	if cas.IsConflict(err) {
		return nil // another writer moved it on
	}
	if err != nil {
		return fmt.Errorf("expiring lease record of run %s: %w", ref.RunID, err)
	}
	_, err = r.KV.Create(ctx, ref.Key(), entry.Value(), jetstream.KeyTTL(FailedRecordTTL))
	if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return fmt.Errorf("expiring lease record of run %s: %w", ref.RunID, err)
	}
	return nil
}
