package runwatch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

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
// run-watcher creates it, because the TTL is its setting; every replica must use the same. It
// takes its share of a store of storeBytes (0: the default).
func OwnershipBucketConfig(ttl time.Duration, replicas int, storeBytes int64) jetstream.KeyValueConfig {
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
		MaxBytes:       events.StoreLimit(storeBytes, events.StoreOwnership),
		Storage:        jetstream.FileStorage,
		Replicas:       replicas,
	}
}

// owners tracks the runs this replica owns and keeps their keys alive.
type owners struct {
	kv jetstream.KeyValue
	// renewer publishes the renewals asynchronously, to the keys' subjects (renewAll).
	renewer jetstream.JetStream
	id      string
	ttl     time.Duration
	log     zerolog.Logger

	mu    sync.Mutex
	owned map[events.RunRef]uint64 // run → revision of our key
}

// newOwners is this replica's ownership of runs in kv (the bucket OwnershipBucketConfig makes
// with ttl), renewed over nc.
func newOwners(nc *nats.Conn, kv jetstream.KeyValue, id string, ttl time.Duration, log zerolog.Logger) (*owners, error) {
	// An answer that never comes (NATS went away) fails its renewal after a third of the TTL,
	// when the next pass is due, rather than holding a place in flight for ever.
	renewer, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(renewInFlight), jetstream.WithPublishAsyncTimeout(ttl/3))
	if err != nil {
		return nil, fmt.Errorf("opening JetStream for ownership renewals: %w", err)
	}
	return &owners{kv: kv, renewer: renewer, id: id, ttl: ttl, log: log, owned: map[events.RunRef]uint64{}}, nil
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
	if err := o.deleteKey(ctx, ref, rev); err != nil {
		o.log.Warn().Err(err).Str(events.LogKeyRunID, ref.RunID).Msg("releasing run ownership failed; it expires on its own")
	}
}

// deleteKey deletes the run's key if it is still at rev, ours; a key that expired or moved on
// is not ours to delete.
func (o *owners) deleteKey(ctx context.Context, ref events.RunRef, rev uint64) error {
	err := o.kv.Delete(ctx, ref.Key(), jetstream.LastRevision(rev))
	if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) && !cas.IsConflict(err) {
		return err
	}
	return nil
}

// renewInFlight bounds the renewals published and not yet answered. One synchronous update
// at a time, a pass over 10,000 runs took 0.76 s against an in-process server and outlasted
// the 6 s TTL against a loaded one (issue 16: thousands of runs lost at once); pipelined, a
// pass costs the server's time per write, not a round trip per run, and this many in flight
// keep the connection busy without queueing a whole pass in the server.
const renewInFlight = 512

// ownershipSubjectPrefix is the subject prefix of the ownership bucket's keys: a renewal is a
// publish to the key's subject, as KeyValue.Update is.
const ownershipSubjectPrefix = "$KV." + OwnershipBucket + "."

// renewal is one key's renewal in flight, at revision rev, or its publish's error.
type renewal struct {
	ref events.RunRef
	rev uint64
	ack jetstream.PubAckFuture
	err error
}

// renewAll renews every owned key once and returns the runs whose ownership was lost. Each
// renewal is an update at the revision this replica wrote last (the stream's expected last
// subject sequence), so a key that expired, and maybe was taken by another replica, is lost,
// never overwritten; renewInFlight of them are pipelined. A renewal that fails otherwise (NATS
// unreachable) stops the pass, and so does the end of ctx: nothing more is published, the
// answers to what was are still recorded (each key's revision stays the one stored), and the
// runs not renewed stay owned until the next pass renews them, or expire.
func (o *owners) renewAll(ctx context.Context) []events.RunRef {
	o.mu.Lock()
	runs := make(map[events.RunRef]uint64, len(o.owned))
	for r, rev := range o.owned {
		runs[r] = rev
	}
	o.mu.Unlock()

	inFlight := make(chan renewal, renewInFlight)
	stop := make(chan struct{})
	go func() {
		defer close(inFlight)
		for ref, rev := range runs {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			default:
			}
			r := renewal{ref: ref, rev: rev}
			r.ack, r.err = o.renewer.PublishAsync(ownershipSubjectPrefix+ref.Key(), []byte(o.id),
				jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithStallWait(o.ttl/3))
			inFlight <- r // read whatever happens: its answer moves the key's revision
		}
	}()

	var lost []events.RunRef
	var failure error
	renewed := 0
	for r := range inFlight {
		ack, err := r.ack, r.err
		var pa *jetstream.PubAck
		if err == nil {
			// Answered, or failed after the publisher's timeout.
			select {
			case pa = <-ack.Ok():
			case err = <-ack.Err():
			}
		}
		switch o.settle(r.ref, r.rev, pa, err) {
		case renewKept:
			renewed++
		case renewLost:
			lost = append(lost, r.ref)
		case renewFailed:
			if failure == nil {
				failure = err
				close(stop)
			}
		}
	}
	if failure != nil && ctx.Err() == nil {
		// NATS unreachable: keep trying; if it stays away, the keys expire and the runs are
		// lost when it is back (the revision check).
		o.log.Warn().Err(failure).Int("runs", len(runs)-renewed-len(lost)).Msg("renewing run ownership failed; retrying with the next pass")
	}
	return lost
}

// renewOutcome is what a renewal did to a run's ownership.
type renewOutcome int

const (
	renewKept renewOutcome = iota
	renewLost
	renewFailed
)

// settle records the answer to a renewal at rev: the key's new revision, or err.
func (o *owners) settle(ref events.RunRef, rev uint64, ack *jetstream.PubAck, err error) renewOutcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	if held, still := o.owned[ref]; !still || held != rev {
		// Released, or released and claimed again, while we renewed: the answer is about a
		// key this replica no longer holds at rev.
		return renewKept
	}
	switch {
	case err == nil:
		o.owned[ref] = ack.Sequence
		return renewKept
	case isWrongLastSequence(err):
		// Our key expired (we were too slow) and maybe another replica took the run.
		delete(o.owned, ref)
		return renewLost
	default:
		return renewFailed
	}
}

// releaseWorkers bounds the releases in flight at shutdown: one at a time, 10,000 runs took
// longer than releaseTimeout on a loaded machine and the rest waited for the TTL.
const releaseWorkers = 64

// releaseAll gives every owned run up (graceful shutdown), so takeover is immediate. What is
// not released when ctx ends expires after the TTL; that is said once, not once per run.
func (o *owners) releaseAll(ctx context.Context) {
	o.mu.Lock()
	runs := o.owned
	o.owned = map[events.RunRef]uint64{}
	o.mu.Unlock()
	var (
		mu       sync.Mutex
		released int
		failure  error
	)
	var g errgroup.Group
	g.SetLimit(releaseWorkers)
	for ref, rev := range runs {
		if ctx.Err() != nil {
			break
		}
		g.Go(func() error {
			err := o.deleteKey(ctx, ref, rev)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failure = err
			} else {
				released++
			}
			return nil
		})
	}
	_ = g.Wait()
	if released < len(runs) {
		if failure == nil {
			failure = ctx.Err()
		}
		o.log.Warn().Err(failure).Int("runs", len(runs)-released).Msg("releasing run ownership failed; the runs not released expire on their own")
	}
}
