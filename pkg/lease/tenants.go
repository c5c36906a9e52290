package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/cas"
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

// ErrTenantOfAnother is returned when a namespace is claimed by another company.
var ErrTenantOfAnother = errors.New("the namespace belongs to another company")

// ClaimTenant returns ns's record and revision after making sure it belongs to companyID: a
// namespace another company claimed is refused (ErrTenantOfAnother); one nobody claimed (no
// record, a record from before ownership, or one that does not decode) is claimed at now,
// once admit has agreed. admit's error is returned as is; admit runs again when another writer
// got in between.
func ClaimTenant(ctx context.Context, kv cas.KV, ns, companyID string, now time.Time, admit func() error) (TenantRecord, uint64, error) {
	var rec TenantRecord
	rev, err := cas.Update(ctx, kv, ns, func(current []byte, _ uint64) ([]byte, bool, error) {
		rec, _ = decodeTenant(current)
		if rec.CompanyID == companyID {
			return nil, false, nil
		}
		if rec.CompanyID != "" {
			return nil, false, ErrTenantOfAnother
		}
		if err := admit(); err != nil {
			return nil, false, err
		}
		rec.CompanyID, rec.ClaimedAt = companyID, now.UTC()
		data, err := json.Marshal(rec)
		if err != nil {
			return nil, false, fmt.Errorf("encoding tenant record: %w", err)
		}
		return data, true, nil
	})
	if err != nil {
		return TenantRecord{}, 0, err
	}
	return rec, rev, nil
}

// RecordApplied stores rec as ns's record if it is still at revision rev (the one its claim
// read), and reports whether it was: when another acquire of the company wrote the record
// meanwhile it recorded the same tenant, and the first record stands.
func RecordApplied(ctx context.Context, kv cas.KV, ns string, rev uint64, rec TenantRecord) (bool, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return false, fmt.Errorf("encoding tenant record: %w", err)
	}
	_, err = kv.Update(ctx, ns, data, rev)
	if cas.IsConflict(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("recording the tenant applied in %s: %w", ns, err)
	}
	return true, nil
}

// companyTenants is KUBECLIP_TENANTS' index of the namespaces one company claimed, kept under
// companyTenantsKey, so the per-company cap holds across every tenant-worker replica.
type companyTenants struct {
	Namespaces []string `json:"namespaces"`
}

// companyTenantsKey is a company's index key: "companies." + its id. Company ids are label
// values ([A-Za-z0-9._-]), valid KV key characters, and namespace names never contain '.', so
// it cannot meet a namespace's key.
func companyTenantsKey(companyID string) string { return "companies." + companyID }

// TooManyTenantsError refuses a company a namespace past the operator's cap; Namespaces are
// the ones it holds.
type TooManyTenantsError struct {
	Namespaces []string
}

func (e *TooManyTenantsError) Error() string {
	return fmt.Sprintf("the company already has %d tenant namespaces (%s)", len(e.Namespaces), strings.Join(e.Namespaces, ", "))
}

// CountTenant adds ns to companyID's index of namespaces unless it is there already, refusing
// it (*TooManyTenantsError) when the company holds limit namespaces.
func CountTenant(ctx context.Context, kv cas.KV, companyID, ns string, limit int) error {
	_, err := cas.Update(ctx, kv, companyTenantsKey(companyID), func(current []byte, _ uint64) ([]byte, bool, error) {
		var idx companyTenants
		if current != nil {
			if err := json.Unmarshal(current, &idx); err != nil {
				return nil, false, fmt.Errorf("decoding the namespaces of company %s: %w", companyID, err)
			}
		}
		if slices.Contains(idx.Namespaces, ns) {
			return nil, false, nil
		}
		if len(idx.Namespaces) >= limit {
			return nil, false, &TooManyTenantsError{Namespaces: idx.Namespaces}
		}
		idx.Namespaces = append(idx.Namespaces, ns)
		data, err := json.Marshal(idx)
		if err != nil {
			return nil, false, fmt.Errorf("encoding company record: %w", err)
		}
		return data, true, nil
	})
	var tooMany *TooManyTenantsError
	if err != nil && !errors.As(err, &tooMany) {
		return fmt.Errorf("recording the namespaces of company %s: %w", companyID, err)
	}
	return err
}
