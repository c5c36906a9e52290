package events_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

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

// TestBudgetsRetryAReplicatedConflict: a replica whose remembered revision of a run's counter
// is stale (the other replica charged since) reads it again and charges on top, on a
// replicated bucket too, whose conflicts do not match ErrKeyExists.
func TestBudgetsRetryAReplicatedConflict(t *testing.T) {
	_, _, js := natstest.Start(t)
	kv, err := js.CreateOrUpdateKeyValue(t.Context(), events.BudgetBucketConfig(1, 0, 0))
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	var replicas []*events.Budgets
	for range 2 {
		b, err := events.NewBudgets(events.BudgetOptions{KV: replicatedConflicts{kv}, Source: "log", Now: func() time.Time { return at }})
		if err != nil {
			t.Fatal(err)
		}
		replicas = append(replicas, b)
	}
	ref := events.Ref("acme", "r1")
	for i := range 4 {
		if err := replicas[i%2].Charge(t.Context(), ref, 10); err != nil {
			t.Fatalf("charge %d by replica %d: %v", i+1, i%2, err)
		}
	}
	entry, err := kv.Get(t.Context(), "log.run."+ref.Key())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := strconv.Atoi(string(entry.Value())); err != nil || got != 40 {
		t.Errorf("run counter = %s, want all 4 charges' 40", entry.Value())
	}
}
