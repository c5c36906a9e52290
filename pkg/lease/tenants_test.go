package lease_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

var claimedAt = time.Date(2026, 11, 26, 3, 0, 0, 0, time.UTC)

func tenantBucket(t *testing.T) jetstream.KeyValue {
	t.Helper()
	_, _, js := natstest.Start(t)
	kv, err := js.CreateKeyValue(t.Context(), lease.BucketOptions{}.TenantBucketConfig())
	if err != nil {
		t.Fatalf("creating the tenant bucket: %v", err)
	}
	return kv
}

// TestClaimTenant: the first company to use a namespace claims it, with admit's consent; the
// same company reads its claim back without a write; another company is refused; a record
// from before ownership, or one that does not decode, is claimed; admit's refusal is returned
// as is, with nothing written.
func TestClaimTenant(t *testing.T) {
	const ns = "paperclip-acme"
	refusal := errors.New("the namespace exists and is not acme's tenant")
	tests := []struct {
		name     string
		stored   string // the namespace's value before the claim; "" for none
		company  string
		admit    error
		wantRec  lease.TenantRecord
		wantErr  error
		wantCall bool // admit is asked
	}{
		{name: "no record", company: "acme", wantCall: true, wantRec: lease.TenantRecord{CompanyID: "acme", ClaimedAt: claimedAt}},
		{name: "ours", stored: `{"companyId":"acme","hash":"3f"}`, company: "acme", wantRec: lease.TenantRecord{CompanyID: "acme", Hash: "3f"}},
		{name: "another company's", stored: `{"companyId":"globex"}`, company: "acme", wantErr: lease.ErrTenantOfAnother},
		{
			name: "from before ownership", stored: `{"hash":"3f","egressMode":"cilium"}`, company: "acme", wantCall: true,
			wantRec: lease.TenantRecord{CompanyID: "acme", ClaimedAt: claimedAt, Hash: "3f", EgressMode: "cilium"},
		},
		{name: "does not decode", stored: `{"companyId":`, company: "acme", wantCall: true, wantRec: lease.TenantRecord{CompanyID: "acme", ClaimedAt: claimedAt}},
		{name: "admit refuses", company: "acme", admit: refusal, wantCall: true, wantErr: refusal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			kv := tenantBucket(t)
			ctx := t.Context()
			if tc.stored != "" {
				if _, err := kv.Put(ctx, ns, []byte(tc.stored)); err != nil {
					t.Fatal(err)
				}
			}
			called := false
			rec, rev, err := lease.ClaimTenant(ctx, kv, ns, tc.company, claimedAt, func() error {
				called = true
				return tc.admit
			})
			if called != tc.wantCall {
				t.Errorf("admit asked: %v, want %v", called, tc.wantCall)
			}
			if tc.wantErr != nil {
				if err != tc.wantErr { //nolint:errorlint // as is: the very error
					t.Fatalf("ClaimTenant = %v, want %v as is", err, tc.wantErr)
				}
				if got, _, _, _ := lease.ReadTenant(ctx, kv, ns); got.CompanyID == tc.company {
					t.Errorf("a refused claim wrote %+v", got)
				}
				return
			}
			if err != nil {
				t.Fatalf("ClaimTenant: %v", err)
			}
			stored, storedRev, _, err := lease.ReadTenant(ctx, kv, ns)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantRec, rec); diff != "" {
				t.Errorf("claimed record (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(rec, stored); diff != "" || rev != storedRev {
				t.Errorf("stored record at %d, claim said %d (-claimed +stored):\n%s", storedRev, rev, diff)
			}
		})
	}
}

// TestClaimTenantRace: companies claiming one namespace at once end with one owner, and every
// other claim is refused as another company's.
func TestClaimTenantRace(t *testing.T) {
	kv := tenantBucket(t)
	const claimers = 4
	errs := make([]error, claimers)
	var wg sync.WaitGroup
	for i := range claimers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = lease.ClaimTenant(t.Context(), kv, "paperclip-shared", fmt.Sprintf("c%d", i), claimedAt, func() error { return nil })
		}()
	}
	wg.Wait()
	owner, _, _, err := lease.ReadTenant(t.Context(), kv, "paperclip-shared")
	if err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		company := fmt.Sprintf("c%d", i)
		switch {
		case company == owner.CompanyID && err != nil:
			t.Errorf("the owner %s's claim failed: %v", company, err)
		case company != owner.CompanyID && !errors.Is(err, lease.ErrTenantOfAnother):
			t.Errorf("%s's claim of %s's namespace = %v, want ErrTenantOfAnother", company, owner.CompanyID, err)
		}
	}
}

// TestCountTenant: a company's index counts each namespace once and refuses one past the cap,
// also when its claims race.
func TestCountTenant(t *testing.T) {
	kv := tenantBucket(t)
	ctx := t.Context()
	const limit = 2
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = lease.CountTenant(ctx, kv, "acme", fmt.Sprintf("paperclip-acme-%d", i), limit)
		}()
	}
	wg.Wait()
	var counted []string
	for i, err := range errs {
		var tooMany *lease.TooManyTenantsError
		switch {
		case err == nil:
			counted = append(counted, fmt.Sprintf("paperclip-acme-%d", i))
		case errors.As(err, &tooMany):
			if len(tooMany.Namespaces) != limit {
				t.Errorf("refusal names %v, want the %d counted", tooMany.Namespaces, limit)
			}
		default:
			t.Errorf("CountTenant: %v", err)
		}
	}
	if len(counted) != limit {
		t.Fatalf("counted %v of 4 racing claims, want %d", counted, limit)
	}
	// Counting a namespace already counted is no new claim.
	if err := lease.CountTenant(ctx, kv, "acme", counted[0], limit); err != nil {
		t.Errorf("counting %s again: %v", counted[0], err)
	}
	entry, err := kv.Get(ctx, "companies.acme")
	if err != nil {
		t.Fatal(err)
	}
	var idx struct{ Namespaces []string }
	if err := json.Unmarshal(entry.Value(), &idx); err != nil || len(idx.Namespaces) != limit {
		t.Errorf("index = %s (%v), want %d namespaces", entry.Value(), err, limit)
	}
}

// TestRecordApplied: the applied tenant is recorded at the claim's revision; a record written
// since (a concurrent acquire's) stands.
func TestRecordApplied(t *testing.T) {
	kv := tenantBucket(t)
	ctx := t.Context()
	rec, rev, err := lease.ClaimTenant(ctx, kv, "paperclip-acme", "acme", claimedAt, func() error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	first, second := rec, rec
	first.Hash, second.Hash = "first", "second"
	if ok, err := lease.RecordApplied(ctx, kv, "paperclip-acme", rev, first); err != nil || !ok {
		t.Fatalf("RecordApplied at the claim's revision = %v, %v", ok, err)
	}
	if ok, err := lease.RecordApplied(ctx, kv, "paperclip-acme", rev, second); err != nil || ok {
		t.Errorf("RecordApplied at a stale revision = %v, %v; want not recorded, no error", ok, err)
	}
	if got, _, _, _ := lease.ReadTenant(ctx, kv, "paperclip-acme"); got.Hash != "first" {
		t.Errorf("recorded hash %q, want the first writer's", got.Hash)
	}
}
