package dispatch

import (
	"context"
	"encoding/json"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// WarmPoolStats is what one pool's record says of its company's acquires of its shape since
// the pool was made (a drained pool deletes its record, and its counts with it).
type WarmPoolStats struct {
	CompanyID    string
	Hits, Misses uint64
}

// ReadWarmPools reads every pool record of kv (the WarmBucket) once; locks and values that are
// no pool record are skipped.
func ReadWarmPools(ctx context.Context, kv jetstream.KeyValue) ([]WarmPoolStats, error) {
	var out []WarmPoolStats
	err := events.ReadCurrent(ctx, kv, func(e jetstream.KeyValueEntry) {
		companyID, _, ok := splitPoolKey(e.Key())
		var rec poolRecord
		if ok && json.Unmarshal(e.Value(), &rec) == nil {
			out = append(out, WarmPoolStats{CompanyID: companyID, Hits: rec.Hits, Misses: rec.Misses})
		}
	})
	return out, err
}
