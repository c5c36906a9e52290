package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TenantRecord is what KUBECLIP_TENANTS holds per tenant namespace: the company that claimed
// it, first and for good (compare-and-set, by the tenant-worker), and what was last applied
// there. The dispatcher reads it before it creates a run in the namespace.
type TenantRecord struct {
	// CompanyID owns the namespace; empty only in records of kubeclip releases before
	// ownership.
	CompanyID string    `json:"companyId,omitempty"`
	ClaimedAt time.Time `json:"claimedAt,omitzero"`
	Hash      string    `json:"hash,omitempty"`
	AppliedAt time.Time `json:"appliedAt,omitzero"`
	// EgressMode is the mode applied, so a later switch knows to delete the other policy.
	EgressMode string `json:"egressMode,omitempty"`
}

// ReadTenant returns ns's record, its revision and whether it has an entry. An entry that does
// not decode reads as a zero record with its revision, so a claim replaces it.
func ReadTenant(ctx context.Context, kv jetstream.KeyValue, ns string) (TenantRecord, uint64, bool, error) {
	entry, err := kv.Get(ctx, ns)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return TenantRecord{}, 0, false, nil
	}
	if err != nil {
		return TenantRecord{}, 0, false, fmt.Errorf("reading the tenant record of %s: %w", ns, err)
	}
	rec, _ := decodeTenant(entry.Value())
	return rec, entry.Revision(), true, nil
}

// decodeTenant reads a KUBECLIP_TENANTS value; ok is false, with a zero record, when it does
// not decode.
func decodeTenant(data []byte) (rec TenantRecord, ok bool) {
	if json.Unmarshal(data, &rec) != nil {
		return TenantRecord{}, false
	}
	return rec, true
}
