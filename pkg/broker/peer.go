package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// A run's pod is known only after grants were minted for it (the dispatcher mints the run
// Secret's placeholders before the pod exists), and grants are minted after it is known (the
// plugin mints at each execute). So binding is two things: BindRun binds the run's grants that
// exist, and remembers the run's peer in the grants bucket, so that a grant Mint makes later is
// born bound (Store.bornPeer). The remembered peer lives until the run's grants are released
// (ReleaseRun), or the bucket's TTL.
//
// It is kept in the grants bucket because every replica's Mint must see it and the broker's
// NATS user may write nothing else; under its own key prefix, peerKeyPrefix, which no grant's
// key can start with, so the quota's count ("<company>.>") never counts it and the Cache skips
// it. A remembered peer is a small record (under 200 bytes), one per run in progress: far below
// a grant's share of the bucket.

// peerKeyPrefix starts the key of a run's remembered peer, "_b64_=peer.<company>.<run>". A
// grant's key starts with its company as events.RunRef.Key writes ids: the id itself, or
// "_b64_" + base64url without padding; neither can be "_b64_=peer", since an id starting
// "_b64_" is always encoded and unpadded base64url has no '='.
const peerKeyPrefix = "_b64_=peer"

// peerKey is the key of the run's remembered peer.
func peerKey(company, run string) string {
	return peerKeyPrefix + "." + events.Ref(company, run).Key()
}

// isPeerKey reports a key of a remembered peer (not a grant).
func isPeerKey(key string) bool { return strings.HasPrefix(key, peerKeyPrefix+".") }

// peerRecord is a run's remembered peer.
type peerRecord struct {
	Company string `json:"company"`
	Run     string `json:"run"`
	Peer    string `json:"peer"`
}

// BindRun binds the run's grants to its pod's IP, and every grant minted for the run from now
// on (Mint): from then on only a request from peer resolves them. The run-watcher names the
// pod's IP on the run stream once Kubernetes assigned it (events.RunStatusEvent.PodIP), for
// every backend, and the dispatcher a resumed reusable lease's (events.RunResumedEvent.PodIP);
// a grant minted before that is unbound until then, and resolves from no address (a request
// waits for the binding: Cache.ResolveWait). Binding again with another address (a pod that
// came back with another IP, a lease resumed onto a new pod) moves the run's grants to it;
// binding again with the same address writes nothing, so a redelivered event is harmless. It
// returns how many grants it bound.
//
// The peer is remembered before the grants are bound, and Mint looks for it after it stores a
// grant: whichever of a bind and a concurrent mint comes second sees the other's write, so no
// grant is left unbound by the race.
func (s *Store) BindRun(ctx context.Context, company, run string, peer netip.Addr) (int, error) {
	if !peer.IsValid() {
		return 0, errors.New("binding a run's grants: the peer address is required")
	}
	for _, f := range []struct{ name, value string }{{"company", company}, {"run", run}} {
		if err := events.ValidateToken(f.name, f.value); err != nil {
			return 0, fmt.Errorf("binding a run's grants: %w", err)
		}
	}
	peer = peer.Unmap()
	if err := s.rememberPeer(ctx, company, run, peer); err != nil {
		return 0, err
	}
	keys, err := s.runGrants(ctx, company, run)
	if err != nil {
		return 0, err
	}
	var errs []error
	n := 0
	for _, k := range keys {
		bound, err := s.bind(ctx, k, peer)
		if err != nil {
			errs = append(errs, fmt.Errorf("binding grant %s to its pod: %w", k, err))
		}
		if bound {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// rememberPeer writes the run's remembered peer (unless it already says peer).
func (s *Store) rememberPeer(ctx context.Context, company, run string, peer netip.Addr) error {
	key := peerKey(company, run)
	data, err := json.Marshal(peerRecord{Company: company, Run: run, Peer: peer.String()})
	if err != nil {
		return err
	}
	for range bindAttempts {
		e, err := s.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			_, err = s.kv.Create(ctx, key, data)
		case err != nil:
			return fmt.Errorf("reading the peer of company %q run %q: %w", company, run, err)
		default:
			var rec peerRecord
			if json.Unmarshal(e.Value(), &rec) == nil && rec.Peer == peer.String() {
				return nil
			}
			_, err = s.kv.Update(ctx, key, data, e.Revision())
		}
		switch {
		case err == nil:
			return nil
		case errors.Is(err, jetstream.ErrKeyExists): // written since Get: read again
			continue
		default:
			return fmt.Errorf("remembering the peer of company %q run %q: %w", company, run, err)
		}
	}
	return fmt.Errorf("remembering the peer of company %q run %q: it kept changing under %d attempts", company, run, bindAttempts)
}

// bornPeer is the run's remembered peer (the zero Addr: none yet).
func (s *Store) bornPeer(ctx context.Context, company, run string) (netip.Addr, error) {
	e, err := s.kv.Get(ctx, peerKey(company, run))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return netip.Addr{}, nil
	}
	if err != nil {
		return netip.Addr{}, fmt.Errorf("reading the peer of company %q run %q: %w", company, run, err)
	}
	var rec peerRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return netip.Addr{}, fmt.Errorf("decoding the peer of company %q run %q: %w", company, run, err)
	}
	peer, err := netip.ParseAddr(rec.Peer)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("decoding the peer of company %q run %q: %w", company, run, err)
	}
	return peer, nil
}

// forgetPeer deletes the run's remembered peer; none is no error.
func (s *Store) forgetPeer(ctx context.Context, company, run string) error {
	if _, err := s.kv.Get(ctx, peerKey(company, run)); errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil // nothing to delete: no marker either
	}
	if err := s.kv.Purge(ctx, peerKey(company, run), jetstream.PurgeTTL(markerTTL)); err != nil {
		return fmt.Errorf("forgetting the peer of company %q run %q: %w", company, run, err)
	}
	return nil
}

// runGrants lists the keys of the run's grants: each of the company's grants is read (a listing
// and a get each, at most the company's quota), as ReleaseRun does.
func (s *Store) runGrants(ctx context.Context, company, run string) ([]string, error) {
	keys, err := s.list(ctx, companyFilter(company))
	if err != nil {
		return nil, fmt.Errorf("listing the grants of company %q: %w", company, err)
	}
	var out []string
	for _, k := range keys {
		e, err := s.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading grant %s: %w", k, err)
		}
		var rec record
		if json.Unmarshal(e.Value(), &rec) != nil || rec.Run != run || rec.Company != company {
			continue
		}
		out = append(out, k)
	}
	return out, nil
}
