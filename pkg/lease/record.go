package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// State is where a lease is in its life.
type State string

// Lease states.
const (
	// StateDispatching: the workload name is chosen; the workload may or may not exist yet.
	StateDispatching State = "dispatching"
	// StateCreated: the workload exists and `created` was published.
	StateCreated State = "created"
	// StateFinished: the run's result was published; the workload may linger until its TTL
	// or a release.
	StateFinished State = "finished"
	// StateReleased and StateDestroyed: the workload is gone and `released` was published.
	StateReleased  State = "released"
	StateDestroyed State = "destroyed"
)

// Ended reports whether the lease was released or destroyed.
func (s State) Ended() bool { return s == StateReleased || s == StateDestroyed }

// Record is a run's lease as the dispatcher keeps it in KUBECLIP_LEASES. It is created once per
// run with compare-and-set, which is what makes the workload name stable: a redelivered or
// duplicated acquire finds the record and reuses its name instead of minting another.
type Record struct {
	RunID        string     `json:"runId"`
	CompanyID    string     `json:"companyId"`
	AgentID      string     `json:"agentId,omitempty"`
	Namespace    string     `json:"namespace,omitempty"`
	WorkloadName string     `json:"workloadName,omitempty"`
	SecretName   string     `json:"secretName,omitempty"`
	Backend      string     `json:"backend,omitempty"`
	State        State      `json:"state"`
	CreatedAt    time.Time  `json:"createdAt"`
	ExpiresAt    *time.Time `json:"expiresAt,omitempty"`
}

// Records reads and writes lease records.
type Records struct {
	KV jetstream.KeyValue
}

// ErrNotFound is returned when the run has no lease record.
var ErrNotFound = errors.New("no lease record")

// Get returns the run's record and its revision.
func (r Records) Get(ctx context.Context, runID string) (Record, uint64, error) {
	entry, err := r.KV.Get(ctx, events.LeaseKey(runID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Record{}, 0, ErrNotFound
	}
	if err != nil {
		return Record{}, 0, fmt.Errorf("reading lease record of run %s: %w", runID, err)
	}
	var rec Record
	if err := json.Unmarshal(entry.Value(), &rec); err != nil {
		return Record{}, 0, fmt.Errorf("decoding lease record of run %s: %w", runID, err)
	}
	return rec, entry.Revision(), nil
}

// Create stores rec unless the run already has a record, in which case it returns the
// existing one: the first writer wins and everyone agrees on its workload name.
func (r Records) Create(ctx context.Context, rec Record) (Record, uint64, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return Record{}, 0, fmt.Errorf("encoding lease record: %w", err)
	}
	rev, err := r.KV.Create(ctx, events.LeaseKey(rec.RunID), data)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return r.Get(ctx, rec.RunID)
	}
	if err != nil {
		return Record{}, 0, fmt.Errorf("creating lease record of run %s: %w", rec.RunID, err)
	}
	return rec, rev, nil
}

// Update replaces the record at revision rev (compare-and-set).
func (r Records) Update(ctx context.Context, rec Record, rev uint64) (uint64, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return 0, fmt.Errorf("encoding lease record: %w", err)
	}
	next, err := r.KV.Update(ctx, events.LeaseKey(rec.RunID), data, rev)
	if err != nil {
		return 0, fmt.Errorf("updating lease record of run %s: %w", rec.RunID, err)
	}
	return next, nil
}

// Modify applies change to the run's record with compare-and-set, reading it again and retrying
// when another writer updated it in between (a release racing the run's result, say). change
// returns false when the record needs no write. It returns the record as stored.
func (r Records) Modify(ctx context.Context, runID string, change func(*Record) bool) (Record, error) {
	for range 5 {
		rec, rev, err := r.Get(ctx, runID)
		if err != nil {
			return Record{}, err
		}
		if !change(&rec) {
			return rec, nil
		}
		_, err = r.Update(ctx, rec, rev)
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		return rec, err
	}
	return Record{}, fmt.Errorf("updating lease record of run %s: it keeps changing", runID)
}
