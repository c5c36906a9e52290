package runwatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/cas"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// OwnershipBucket holds which run-watcher replica follows which run: key RunRef.Key() (company and run), value
// the replica's id. The bucket's TTL is the ownership timeout: an owner renews its keys every
// third of it, so a key whose owner died ages out and the server leaves a marker that wakes the
// other replicas, one of which takes the run over.
const OwnershipBucket = "KUBECLIP_WATCH"

// DefaultOwnershipTTL is how long a run stays with a replica that stopped renewing. Takeover
// after a crash takes about this long plus the server's expiry check; a shorter TTL means
// faster takeover and more renewals (one KV update per owned run per TTL/3).
const DefaultOwnershipTTL = 6 * time.Second

// ownershipMarkerTTL keeps the expiry markers just long enough for every watcher to see them.
const ownershipMarkerTTL = time.Minute

// OwnershipBucketConfig is the KUBECLIP_WATCH bucket for the given ownership timeout. Only the
// run-watcher creates it, because the TTL is its setting; every replica must use the same.
func OwnershipBucketConfig(ttl time.Duration, replicas int) jetstream.KeyValueConfig {
	if replicas <= 0 {
		replicas = 1
	}
	return jetstream.KeyValueConfig{
		Bucket:      OwnershipBucket,
		Description: "kubeclip run-watcher ownership of live runs, keyed by run id",
		History:     1,
		// A write resets a key's age, so TTL is the time since the owner's last renewal.
		TTL:            ttl,
		LimitMarkerTTL: ownershipMarkerTTL,
		MaxValueSize:   256,
		Storage:        jetstream.FileStorage,
		Replicas:       replicas,
	}
}

// owners tracks the runs this replica owns and keeps their keys alive.
type owners struct {
	kv  jetstream.KeyValue
	id  string
	ttl time.Duration
	log zerolog.Logger

	mu    sync.Mutex
	owned map[events.RunRef]uint64 // run → revision of our key
}

func newOwners(kv jetstream.KeyValue, id string, ttl time.Duration, log zerolog.Logger) *owners {
	return &owners{kv: kv, id: id, ttl: ttl, log: log, owned: map[events.RunRef]uint64{}}
}

// owns reports whether this replica holds the run.
func (o *owners) owns(ref events.RunRef) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.owned[ref]
	return ok
}

// claim makes this replica the owner of the run if nobody else is. It returns false, with no
// error, when another replica owns it.
func (o *owners) claim(ctx context.Context, ref events.RunRef) (bool, error) {
	if o.owns(ref) {
		return true, nil
	}
	// Our own key from before a restart of this replica's run loop is ours to take back.
	holder, rev, err := cas.Take(ctx, o.kv, ref.Key(), []byte(o.id))
	if err != nil {
		return false, fmt.Errorf("claiming run %s: %w", ref.RunID, err)
	}
	if string(holder) != o.id {
		return false, nil
	}
	o.mu.Lock()
	o.owned[ref] = rev
	o.mu.Unlock()
	return true, nil
}

// release gives the run up, so another replica can take it at once.
func (o *owners) release(ctx context.Context, ref events.RunRef) {
	o.mu.Lock()
	rev, ok := o.owned[ref]
	delete(o.owned, ref)
	o.mu.Unlock()
	if !ok {
		return
	}
	err := o.kv.Delete(ctx, ref.Key(), jetstream.LastRevision(rev))
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		o.log.Warn().Err(err).Str(events.LogKeyRunID, ref.RunID).Msg("releasing run ownership failed; it expires on its own")
	}
}

// renewAll renews every owned key once and returns the runs whose ownership was lost.
func (o *owners) renewAll(ctx context.Context) []events.RunRef {
	o.mu.Lock()
	runs := make(map[events.RunRef]uint64, len(o.owned))
	for r, rev := range o.owned {
		runs[r] = rev
	}
	o.mu.Unlock()
	var lost []events.RunRef
	for ref, rev := range runs {
		next, err := o.kv.Update(ctx, ref.Key(), []byte(o.id), rev)
		o.mu.Lock()
		_, still := o.owned[ref]
		switch {
		case !still:
			// released while we renewed
		case err == nil:
			o.owned[ref] = next
		case errors.Is(err, jetstream.ErrKeyRevisionMismatch), errors.Is(err, jetstream.ErrKeyNotFound):
			// Our key expired (we were too slow) and maybe another replica took the run.
			delete(o.owned, ref)
			lost = append(lost, ref)
		default:
			// NATS unreachable: keep trying; if it stays away, the key expires and we lose
			// the run when we are back (the revision check above).
			o.log.Warn().Err(err).Str(events.LogKeyRunID, ref.RunID).Msg("renewing run ownership failed")
		}
		o.mu.Unlock()
	}
	return lost
}

// releaseAll gives every owned run up (graceful shutdown), so takeover is immediate.
func (o *owners) releaseAll(ctx context.Context) {
	o.mu.Lock()
	runs := make([]events.RunRef, 0, len(o.owned))
	for r := range o.owned {
		runs = append(runs, r)
	}
	o.mu.Unlock()
	for _, r := range runs {
		o.release(ctx, r)
	}
}
