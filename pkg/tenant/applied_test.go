package tenant

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

var now = time.Date(2026, 8, 24, 10, 30, 0, 0, time.UTC)

// TestFresh pins when the tenant-worker skips the server-side apply: only for the same
// objects, applied within the resync period, into a namespace the informer still sees.
func TestFresh(t *testing.T) {
	const ns, hash = "paperclip-acme", "3f2a"
	tests := []struct {
		name      string
		namespace bool   // the informer has the namespace
		record    record // KUBECLIP_TENANTS value of ns; zero for none
		want      bool
	}{
		{name: "same hash, namespace present, within resync", namespace: true, record: rec(hash, now.Add(-time.Minute)), want: true},
		{name: "applied just now", namespace: true, record: rec(hash, now), want: true},
		{name: "namespace missing", namespace: false, record: rec(hash, now.Add(-time.Minute)), want: false},
		{name: "applied a resync period ago", namespace: true, record: rec(hash, now.Add(-DefaultResync)), want: false},
		{name: "applied longer ago", namespace: true, record: rec(hash, now.Add(-time.Hour)), want: false},
		{name: "hash differs", namespace: true, record: rec("9c1d", now.Add(-time.Minute)), want: false},
		{name: "claimed, never applied", namespace: true, record: record{CompanyID: "acme", ClaimedAt: now}, want: false},
		{name: "no record", namespace: true, want: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			namespaces := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
			if err := namespaces.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "paperclip-other"}}); err != nil {
				t.Fatal(err)
			}
			if tc.namespace {
				if err := namespaces.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
					t.Fatal(err)
				}
			}
			w := &Worker{
				opts:       Options{Now: func() time.Time { return now }, Resync: DefaultResync},
				namespaces: namespaces,
			}
			if got := w.fresh(tc.record, ns, hash); got != tc.want {
				t.Errorf("fresh() = %v, want %v", got, tc.want)
			}
		})
	}
}

func rec(hash string, appliedAt time.Time) record {
	return record{CompanyID: "acme", Hash: hash, AppliedAt: appliedAt}
}

// TestEnsureTenantSkipsAnUnchangedTenant: an acquire whose rendered tenant hashes to the
// recorded one, applied recently into a namespace that exists, applies nothing. The Worker has no
// Applier, so any apply would fail the test.
func TestEnsureTenantSkipsAnUnchangedTenant(t *testing.T) {
	_, _, js := natstest.Start(t)
	kv, err := js.CreateKeyValue(t.Context(), lease.BucketOptions{}.TenantBucketConfig())
	if err != nil {
		t.Fatalf("creating the tenant bucket: %v", err)
	}
	plan, err := lease.New(events.AcquireRequest{
		RunID: "run-1", CompanyID: "acme", EnvironmentID: "env-1", AgentID: "agent-1",
		AdapterType: "codex_local", Config: json.RawMessage(`{"egressMode":"cilium"}`),
	}, now, policy.DefaultOperator())
	if err != nil {
		t.Fatalf("lease.New() error: %v", err)
	}
	tenant, err := plan.Tenant()
	if err != nil {
		t.Fatalf("Tenant() error: %v", err)
	}
	data, err := json.Marshal(rec(tenant.Hash(), now.Add(-time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(t.Context(), plan.Namespace, data); err != nil {
		t.Fatalf("writing the tenant record: %v", err)
	}
	namespaces := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := namespaces.Add(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: plan.Namespace}}); err != nil {
		t.Fatal(err)
	}
	w := &Worker{
		opts:       Options{Now: func() time.Time { return now }, Resync: DefaultResync},
		tenants:    kv,
		namespaces: namespaces,
	}
	if err := w.ensureTenant(t.Context(), zerolog.New(zerolog.NewTestWriter(t)), plan); err != nil {
		t.Fatalf("ensureTenant() error: %v", err)
	}
}
