package broker

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// GrantWriter is the part of the grants bucket (jetstream.KeyValue) the Store writes with.
type GrantWriter interface {
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
	Purge(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error
	ListKeysFiltered(ctx context.Context, filters ...string) (jetstream.KeyLister, error)
}

var _ GrantWriter = (jetstream.KeyValue)(nil)

// Store mints, binds and releases grants in the grants bucket. Any broker replica may run one:
// every write is a single KV operation whose outcome every replica's Cache sees.
type Store struct {
	kv     GrantWriter
	sealer *Sealer
	quota  int
	now    func() time.Time
}

// StoreOptions configure NewStore.
type StoreOptions struct {
	// KV is the grants bucket (BucketOptions.Config). Required.
	KV GrantWriter
	// Sealer seals the values. Required.
	Sealer *Sealer
	// GrantsPerCompany is how many grants one company may hold at once (BucketOptions.GrantQuota
	// is the most that fits; CheckGrantQuota checks an operator's setting). Required.
	GrantsPerCompany int
	// Now is the clock of a grant's Created (nil: time.Now).
	Now func() time.Time
}

// NewStore checks o.
func NewStore(o StoreOptions) (*Store, error) {
	switch {
	case o.KV == nil:
		return nil, errors.New("broker.StoreOptions.KV is required")
	case o.Sealer == nil:
		return nil, errors.New("broker.StoreOptions.Sealer is required")
	case o.GrantsPerCompany <= 0:
		return nil, fmt.Errorf("broker.StoreOptions.GrantsPerCompany must be positive, got %d", o.GrantsPerCompany)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Store{kv: o.KV, sealer: o.Sealer, quota: o.GrantsPerCompany, now: o.Now}, nil
}

// QuotaError is Mint's refusal of a company that holds its quota of grants.
type QuotaError struct {
	Company string
	Held    int
	Quota   int
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("company %q holds %d credential broker grants, its quota (GrantsPerCompany) is %d: release its ended leases, or raise the quota", e.Company, e.Held, e.Quota)
}

// Mint stores the grant of r's lease and key and returns its placeholder.
//
// A lease holds one grant per key, whose id is derived from the company, the lease and the key
// (Sealer.grantID), so Mint is idempotent: a mint repeated (NATS redelivered it, the plugin
// retried after losing the answer, two replicas each got a copy) answers with the placeholder
// the first one made and writes nothing; a mint with another value, run or binding for the same
// lease and key (the operator rotated the key mid-lease, a reusable lease's next run) replaces
// them in that grant, whose placeholder the pod already holds. The placeholder's secret part is
// kept sealed in the grant for that answer.
//
// The quota is checked against the bucket (a listing of the company's keys), not reserved: mints
// of one company racing on several replicas may each see the last free place, so a company can
// exceed its quota by the mints it has in flight at once, bounded by the acquires it has in
// flight. The quota is sized for grants at their largest (grantRecordBytes, over ten times a
// typical grant's: a 610-byte record with UUID ids and a 108-byte key), which leaves the bucket
// room for that. A repeated mint is never refused for the quota: it adds no grant.
func (s *Store) Mint(ctx context.Context, r MintRequest) (Placeholder, Grant, error) {
	binding, err := r.validate()
	if err != nil {
		return Placeholder{}, Grant{}, fmt.Errorf("minting a grant: %w", err)
	}
	id := s.sealer.grantID(r.Company, r.Lease, r.Key)
	key := grantKey(r.Company, r.Lease, id)
	if !r.Peer.IsValid() {
		// The run's pod is known (BindRun): the grant is born bound to it.
		if r.Peer, err = s.bornPeer(ctx, r.Company, r.Run); err != nil {
			return Placeholder{}, Grant{}, fmt.Errorf("minting a grant: %w", err)
		}
	}
	for range mintAttempts {
		e, err := s.kv.Get(ctx, key)
		switch {
		case err == nil:
			p, g, done, err := s.remint(ctx, e, r, binding)
			if done || err != nil {
				return p, g, err
			}
			continue // the grant changed (or went) since Get: read it again
		case !errors.Is(err, jetstream.ErrKeyNotFound):
			return Placeholder{}, Grant{}, fmt.Errorf("reading grant %s of company %q lease %q: %w", id, r.Company, r.Lease, err)
		}
		held, err := s.count(ctx, r.Company)
		if err != nil {
			return Placeholder{}, Grant{}, err
		}
		if held >= s.quota {
			return Placeholder{}, Grant{}, &QuotaError{Company: r.Company, Held: held, Quota: s.quota}
		}
		p, err := newPlaceholder(id)
		if err != nil {
			return Placeholder{}, Grant{}, err
		}
		g := Grant{ID: id, Company: r.Company, Run: r.Run, Lease: r.Lease, Key: r.Key, Binding: binding, Peer: r.Peer.Unmap(), Created: s.now().UTC()}
		rec, err := s.newRecord(g, p, r.Value)
		if err != nil {
			return Placeholder{}, Grant{}, err
		}
		data, err := json.Marshal(rec)
		if err != nil {
			return Placeholder{}, Grant{}, fmt.Errorf("encoding grant %s: %w", id, err)
		}
		_, err = s.kv.Create(ctx, key, data)
		switch {
		case err == nil:
			if !g.Peer.IsValid() {
				// A BindRun that listed the run's grants before this one was stored remembered
				// the peer first: look again, and bind the grant if it did.
				if g.Peer, err = s.bornPeer(ctx, r.Company, r.Run); err == nil && g.Peer.IsValid() {
					_, err = s.bind(ctx, key, g.Peer)
				}
				if err != nil {
					return Placeholder{}, Grant{}, fmt.Errorf("binding grant %s to its run's pod: %w", id, err)
				}
			}
			return p, g, nil
		case errors.Is(err, jetstream.ErrKeyExists): // a concurrent mint of the same grant won: answer with its
			continue
		default:
			return Placeholder{}, Grant{}, fmt.Errorf("storing grant %s of company %q lease %q: %w", id, r.Company, r.Lease, err)
		}
	}
	return Placeholder{}, Grant{}, fmt.Errorf("minting grant %s of company %q lease %q: the grant kept changing under %d attempts", id, r.Company, r.Lease, mintAttempts)
}

// mintAttempts bounds Mint's read-create-update retries: only mints and binds of the same
// lease and key race it.
const mintAttempts = 4

// remint answers a mint whose grant exists (entry e): its placeholder, after replacing the
// value, run and binding when r changes them (and the peer when r names one). done is false
// when the grant changed under the update: read it again.
func (s *Store) remint(ctx context.Context, e jetstream.KeyValueEntry, r MintRequest, binding Binding) (p Placeholder, g Grant, done bool, err error) {
	var rec record
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		return Placeholder{}, Grant{}, false, fmt.Errorf("decoding grant %s: %w", e.Key(), err)
	}
	if g, err = rec.grant(); err != nil {
		return Placeholder{}, Grant{}, false, fmt.Errorf("decoding grant %s: %w", e.Key(), err)
	}
	secret, err := s.sealer.openSecret(g.ID, rec.SealedSecret)
	if err != nil || len(secret) != secretLen {
		return Placeholder{}, Grant{}, false, fmt.Errorf("grant %s exists but its placeholder does not open under this broker's sealing key (minted under another?): release the lease", g.ID)
	}
	p = Placeholder{id: g.ID}
	copy(p.secret[:], secret)
	clear(secret)
	value, err := s.sealer.open(g.ID, rec.Sealed)
	same := err == nil && subtle.ConstantTimeCompare(value, []byte(r.Value)) == 1
	clear(value)
	peer := r.Peer.Unmap()
	if same && rec.Run == r.Run && slices.Equal(rec.Binding.Hosts, binding.Hosts) && slices.Equal(rec.Binding.Headers, binding.Headers) && (!peer.IsValid() || peer == g.Peer) {
		return p, g, true, nil
	}
	g.Run, g.Binding = r.Run, binding
	if peer.IsValid() {
		g.Peer = peer
	}
	sealed, err := s.sealer.seal(g.ID, []byte(r.Value))
	if err != nil {
		return Placeholder{}, Grant{}, false, err
	}
	hash := p.secretHash()
	upd := newRecord(g, hash[:], sealed, rec.SealedSecret)
	data, err := json.Marshal(upd)
	if err != nil {
		return Placeholder{}, Grant{}, false, fmt.Errorf("encoding grant %s: %w", g.ID, err)
	}
	_, err = s.kv.Update(ctx, e.Key(), data, e.Revision())
	switch {
	case err == nil:
		return p, g, true, nil
	case errors.Is(err, jetstream.ErrKeyExists):
		return Placeholder{}, Grant{}, false, nil
	default:
		return Placeholder{}, Grant{}, false, fmt.Errorf("updating grant %s of company %q lease %q: %w", g.ID, g.Company, g.Lease, err)
	}
}

// newRecord seals value and p's secret part into g's record.
func (s *Store) newRecord(g Grant, p Placeholder, value string) (record, error) {
	sealed, err := s.sealer.seal(g.ID, []byte(value))
	if err != nil {
		return record{}, err
	}
	sealedSecret, err := s.sealer.sealSecret(g.ID, p.secret[:])
	if err != nil {
		return record{}, err
	}
	hash := p.secretHash()
	return newRecord(g, hash[:], sealed, sealedSecret), nil
}

func newRecord(g Grant, hash, sealed, sealedSecret []byte) record {
	rec := record{
		ID: g.ID.String(), Company: g.Company, Run: g.Run, Lease: g.Lease, Key: g.Key, Binding: g.Binding,
		SecretHash: hash, Sealed: sealed, SealedSecret: sealedSecret, Created: g.Created,
	}
	if g.Peer.IsValid() {
		rec.Peer = g.Peer.String()
	}
	return rec
}

// count is how many grants company holds.
func (s *Store) count(ctx context.Context, company string) (int, error) {
	keys, err := s.list(ctx, companyFilter(company))
	if err != nil {
		return 0, fmt.Errorf("counting company %q's grants: %w", company, err)
	}
	return len(keys), nil
}

// list is every key filter matches. It reads the lister to its end (its goroutine blocks on a
// full channel until read, whatever Stop says), and cancels the context it lists with (the
// subscription behind the lister keeps a goroutine until its context ends).
func (s *Store) list(ctx context.Context, filter string) ([]string, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lister, err := s.kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, err
	}
	var keys []string
	seen := map[string]bool{} // the lister may repeat a key written while it lists
	for k := range lister.Keys() {
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err // the lister stops early on a cancelled context: the list is partial
	}
	return keys, nil
}

// Release deletes every grant of the lease and returns how many it deleted. Each is purged with
// a marker that every replica's watcher sees (so the grant stops resolving everywhere) and that
// the bucket drops after markerTTL. Releasing a lease with no grants is no error, so a repeated
// release is harmless; on errors it deletes what it can and returns them all.
func (s *Store) Release(ctx context.Context, company, lease string) (int, error) {
	keys, err := s.list(ctx, leaseKey(company, lease)+".*")
	if err != nil {
		return 0, fmt.Errorf("listing the grants of company %q lease %q: %w", company, lease, err)
	}
	var errs []error
	n := 0
	for _, k := range keys {
		if err := s.kv.Purge(ctx, k, jetstream.PurgeTTL(markerTTL)); err != nil {
			errs = append(errs, fmt.Errorf("deleting grant %s: %w", k, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// ReleaseRun deletes every grant minted for the run (whatever its lease), and the run's
// remembered peer (BindRun), and returns how many grants it deleted: a run's result, or its
// acquire's failure, ends the grants of its run when the lease's id is not in the event. It
// reads each of the company's grants (a listing and a get each, at most the company's quota),
// so it is for the end of a run, not for a request's path. Like Release it is idempotent and
// deletes what it can on errors.
func (s *Store) ReleaseRun(ctx context.Context, company, run string) (int, error) {
	keys, err := s.list(ctx, companyFilter(company))
	if err != nil {
		return 0, fmt.Errorf("listing the grants of company %q: %w", company, err)
	}
	var errs []error
	if err := s.forgetPeer(ctx, company, run); err != nil {
		errs = append(errs, err)
	}
	n := 0
	for _, k := range keys {
		e, err := s.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("reading grant %s: %w", k, err))
			continue
		}
		var rec record
		if err := json.Unmarshal(e.Value(), &rec); err != nil || rec.Run != run || rec.Company != company {
			continue // a record that does not decode resolves as nothing anyway (Cache)
		}
		if err := s.kv.Purge(ctx, k, jetstream.PurgeTTL(markerTTL)); err != nil {
			errs = append(errs, fmt.Errorf("deleting grant %s: %w", k, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// BindPeer binds every grant of the lease to its pod's IP: from then on only a request from
// peer resolves them. The broker's flow binds by run instead (BindRun, from the run stream's
// status events, which name runs, not leases). The pod's address is known only after the grants were minted (they are
// in the Secret the pod starts with), so binding is a step of its own; binding again (a pod
// that came back with another address) replaces the address. It returns how many grants it
// bound; a grant released meanwhile is skipped.
func (s *Store) BindPeer(ctx context.Context, company, lease string, peer netip.Addr) (int, error) {
	if !peer.IsValid() {
		return 0, errors.New("binding grants: the peer address is required")
	}
	peer = peer.Unmap()
	keys, err := s.list(ctx, leaseKey(company, lease)+".*")
	if err != nil {
		return 0, fmt.Errorf("listing the grants of company %q lease %q: %w", company, lease, err)
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

// bindAttempts bounds bind's read-modify-write retries: only another BindPeer of the same
// lease races it.
const bindAttempts = 3

func (s *Store) bind(ctx context.Context, key string, peer netip.Addr) (bool, error) {
	for range bindAttempts {
		e, err := s.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		var rec record
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			return false, fmt.Errorf("decoding: %w", err)
		}
		if rec.Peer == peer.String() {
			return true, nil // bound already (a redelivered event; a retained lease's resume)
		}
		rec.Peer = peer.String()
		data, err := json.Marshal(rec)
		if err != nil {
			return false, err
		}
		_, err = s.kv.Update(ctx, key, data, e.Revision())
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, jetstream.ErrKeyExists): // written (or released) since Get: read again
			continue
		default:
			return false, err
		}
	}
	return false, fmt.Errorf("the grant kept changing under %d attempts", bindAttempts)
}
