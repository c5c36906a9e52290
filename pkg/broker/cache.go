package broker

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// GrantWatcher is the part of the grants bucket (jetstream.KeyValue) the Cache reads.
type GrantWatcher interface {
	WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error)
}

var _ GrantWatcher = (jetstream.KeyValue)(nil)

// Cache is one broker replica's copy of the grants bucket, kept by a KV watcher: Resolve
// answers from memory and never waits on NATS, and a grant deleted through any replica stops
// resolving here as soon as its delete marker arrives (milliseconds;
// TestReleaseStopsEveryReplicaWithinASecond). Values stay sealed in memory and are opened per
// request.
type Cache struct {
	watch  GrantWatcher
	sealer *Sealer
	log    zerolog.Logger
	now    func() time.Time
	onEnd  func(Grant) // CacheOptions.Released

	started atomic.Bool
	ready   chan struct{}
	// live is true from the watch's initial values until Run returns: outside it the cache
	// cannot know what was deleted, and Resolve refuses (ReasonUnavailable), failing closed.
	live atomic.Bool

	mu     sync.RWMutex
	grants map[GrantID]cached
	// changed is closed, and replaced, whenever a grant is stored or deleted, and when the
	// watch ends: ResolveWait's requests wait on it for their grant's binding. One channel for
	// every waiter, so a waiting request costs nothing beyond itself; each wakes to look again.
	changed  chan struct{}
	released map[GrantID]time.Time // when the delete marker arrived, kept for markerTTL
	sweptAt  time.Time

	// unsealLoggedAt (unix nanoseconds) rate-limits the log of grants that do not open.
	unsealLoggedAt atomic.Int64
}

type cached struct {
	grant  Grant
	hash   [sha256.Size]byte
	sealed []byte
}

// CacheOptions configure NewCache.
type CacheOptions struct {
	// KV is the grants bucket. Required.
	KV GrantWatcher
	// Sealer opens the values. Required.
	Sealer *Sealer
	// Log receives records that do not decode and values that do not open (never a value).
	Log zerolog.Logger
	// Now is the clock of the released-grant memory (nil: time.Now).
	Now func() time.Time
	// Released, when set, is told of every grant the cache held whose delete marker arrived
	// (through any replica), from the watch's goroutine and outside the cache's lock: the
	// usage observer publishes the run's usage at once. It must not block.
	Released func(Grant)
}

// NewCache checks o; Run fills the cache.
func NewCache(o CacheOptions) (*Cache, error) {
	switch {
	case o.KV == nil:
		return nil, errors.New("broker.CacheOptions.KV is required")
	case o.Sealer == nil:
		return nil, errors.New("broker.CacheOptions.Sealer is required")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Cache{
		watch: o.KV, sealer: o.Sealer, log: o.Log, now: o.Now, onEnd: o.Released,
		ready: make(chan struct{}), grants: map[GrantID]cached{}, released: map[GrantID]time.Time{},
		changed: make(chan struct{}),
	}, nil
}

// Ready is closed once the cache holds every grant the bucket held when Run started.
func (c *Cache) Ready() <-chan struct{} { return c.ready }

// Run watches the bucket until ctx ends (nil) or the watch does (an error: the replica should
// restart, and until then Resolve refuses). Call it once.
func (c *Cache) Run(ctx context.Context) error {
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("broker.Cache.Run called twice")
	}
	// The watch's subscription ends when its context does (and keeps a goroutine until then).
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := c.watch.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watching KV bucket %s: %w", Bucket, err)
	}
	defer func() { _ = w.Stop() }()
	defer c.wake() // after live is false: a waiting request is refused at once (unavailable)
	defer c.live.Store(false)
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			switch {
			case !ok && ctx.Err() != nil: // the subscription ended with ctx
				return nil
			case !ok:
				return fmt.Errorf("the watch of KV bucket %s ended", Bucket)
			case e == nil: // the initial values are in
				if !c.live.Swap(true) {
					close(c.ready)
				}
			default:
				c.apply(e)
			}
		}
	}
}

// apply folds one entry of the bucket into the cache.
func (c *Cache) apply(e jetstream.KeyValueEntry) {
	if isPeerKey(e.Key()) {
		return // a run's remembered peer (Store.BindRun): its grants carry it
	}
	id, ok := keyGrantID(e.Key())
	if !ok {
		c.log.Warn().Str("key", e.Key()).Msg("the grants bucket holds a key that names no grant; ignored")
		return
	}
	if op := e.Operation(); op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge {
		c.mu.Lock()
		gone, held := c.grants[id]
		delete(c.grants, id)
		c.released[id] = c.now()
		c.sweep()
		c.wakeLocked()
		c.mu.Unlock()
		if held && c.onEnd != nil {
			c.onEnd(gone.grant)
		}
		return
	}
	entry, err := decodeRecord(id, e.Value())
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		// Fail closed: a grant that cannot be read resolves as unknown, even if an earlier
		// revision could.
		delete(c.grants, id)
		c.wakeLocked()
		c.log.Warn().Err(err).Str("key", e.Key()).Msg("a grant does not decode; it will not resolve")
		return
	}
	c.grants[id] = entry
	delete(c.released, id)
	c.wakeLocked()
}

// wake wakes every request waiting in ResolveWait.
func (c *Cache) wake() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wakeLocked()
}

// wakeLocked is wake with c.mu held.
func (c *Cache) wakeLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

func decodeRecord(id GrantID, data []byte) (cached, error) {
	var rec record
	if err := json.Unmarshal(data, &rec); err != nil {
		return cached{}, fmt.Errorf("decoding: %w", err)
	}
	g, err := rec.grant()
	if err != nil {
		return cached{}, err
	}
	if g.ID != id {
		return cached{}, fmt.Errorf("the record's id %s is not its key's", g.ID)
	}
	e := cached{grant: g, sealed: rec.Sealed}
	copy(e.hash[:], rec.SecretHash)
	return e, nil
}

// sweep forgets released grants older than markerTTL, at most once a minute (c.mu held).
func (c *Cache) sweep() {
	now := c.now()
	if now.Sub(c.sweptAt) < time.Minute {
		return
	}
	c.sweptAt = now
	for id, at := range c.released {
		if now.Sub(at) > markerTTL {
			delete(c.released, id)
		}
	}
}

// Len is how many grants the cache holds.
func (c *Cache) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.grants)
}

// Secret is a real value. Its String is "[redacted]", so a Secret formatted by mistake gives
// nothing away; Reveal is the value, for the upstream request's header only.
type Secret struct{ v string }

// Reveal is the value.
func (s Secret) Reveal() string { return s.v }

// String redacts.
func (s Secret) String() string { return "[redacted]" }

// Resolved is a placeholder resolved: its grant (whose Binding must not be modified: the cache
// shares it) and the real value.
type Resolved struct {
	Grant Grant
	Value Secret
}

// Resolve decides whether placeholder, sent to host (canonical, ca.CanonicalHost) in header
// from peer, may be swapped, and for what. A refusal is a *RefusedError whose Reason is the
// first rule the request breaks, in this order: malformed, unavailable, released (the id of a
// grant released within markerTTL, whatever the secret: the cache no longer holds its hash, and
// the id alone is no secret), unknown (no such grant, or a wrong secret: one answer), wrong
// peer, wrong host, wrong header, unbound.
//
// A grant bound to no pod yet resolves from no address (ReasonUnbound): were it to resolve from
// any, a placeholder copied out of its pod in the moments before the run-watcher reported the
// pod's address would work from anywhere until then. ResolveWait waits for the binding instead.
func (c *Cache) Resolve(placeholder, host string, header Header, peer netip.Addr) (Resolved, error) {
	p, err := ParsePlaceholder(placeholder)
	if err != nil {
		return Resolved{}, err
	}
	if !c.live.Load() {
		return Resolved{}, refuse(ReasonUnavailable)
	}
	c.mu.RLock()
	e, ok := c.grants[p.id]
	_, gone := c.released[p.id]
	c.mu.RUnlock()
	if !ok {
		if gone {
			return Resolved{}, refuse(ReasonReleased)
		}
		return Resolved{}, refuse(ReasonUnknown)
	}
	hash := p.secretHash()
	if subtle.ConstantTimeCompare(hash[:], e.hash[:]) != 1 {
		return Resolved{}, refuse(ReasonUnknown)
	}
	switch {
	case e.grant.Peer.IsValid() && e.grant.Peer != peer.Unmap():
		return Resolved{}, refuse(ReasonWrongPeer)
	case !slices.Contains(e.grant.Binding.Hosts, host):
		return Resolved{}, refuse(ReasonWrongHost)
	case !slices.Contains(e.grant.Binding.Headers, header):
		return Resolved{}, refuse(ReasonWrongHeader)
	case !e.grant.Peer.IsValid():
		return Resolved{}, refuse(ReasonUnbound)
	}
	value, err := c.sealer.open(p.id, e.sealed)
	if err != nil {
		c.logUnsealable(p.id, err)
		return Resolved{}, refuse(ReasonUnavailable)
	}
	return Resolved{Grant: e.grant, Value: Secret{v: string(value)}}, nil
}

// ResolveWait is Resolve for a request that may come before its grant is bound to its pod: an
// unbound grant (ReasonUnbound) is looked at again each time a grant changes, for at most wait
// and while ctx lasts, and resolved against the pod it is then bound to (so a request from
// another address is refused as ReasonWrongPeer once the binding arrives). A grant that is
// still unbound then is refused as ReasonUnbound. Every other answer is Resolve's, at once.
//
// The wait is short in practice: the run-watcher reports a pod's address as soon as Kubernetes
// assigns it, before its agent can run anything, and its binding reaches every replica's cache
// in milliseconds (cmd/credential-broker TestGrantBoundToItsPod); a request that comes
// first is held, not refused. It costs one timer, and the waiting request's own goroutine.
func (c *Cache) ResolveWait(ctx context.Context, wait time.Duration, placeholder, host string, header Header, peer netip.Addr) (Resolved, error) {
	var deadline *time.Timer // made at the first wait: a bound grant's request makes none
	defer func() {
		if deadline != nil {
			deadline.Stop()
		}
	}()
	for {
		c.mu.RLock()
		changed := c.changed // taken before Resolve looks: a change after it closes this one
		c.mu.RUnlock()
		res, err := c.Resolve(placeholder, host, header, peer)
		if r, _ := RefusalReason(err); r != ReasonUnbound || wait <= 0 {
			return res, err
		}
		if deadline == nil {
			deadline = time.NewTimer(wait)
		}
		select {
		case <-changed:
		case <-deadline.C:
			return Resolved{}, err
		case <-ctx.Done():
			return Resolved{}, err
		}
	}
}

// logUnsealable logs a grant that does not open, at most once a minute: it means this replica
// has another sealing key than the one that minted it, and every request would say so.
func (c *Cache) logUnsealable(id GrantID, err error) {
	now := c.now().UnixNano()
	last := c.unsealLoggedAt.Load()
	if now-last < int64(time.Minute) || !c.unsealLoggedAt.CompareAndSwap(last, now) {
		return
	}
	c.log.Error().Err(err).Str("grant", id.String()).Msg("a grant does not open under this replica's sealing key; its requests are refused")
}
