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
)

var now = time.Date(2026, 8, 24, 10, 30, 0, 0, time.UTC)

// TestApplied pins when the tenant-worker skips the server-side apply: only for the same
// objects, applied within the resync period, into a namespace the informer still sees.
func TestApplied(t *testing.T) {
	const ns, hash = "paperclip-acme", "3f2a"
	_, _, js := natstest.Start(t)
	tests := []struct {
		name      string
		namespace bool            // the informer has the namespace
		record    json.RawMessage // KUBECLIP_TENANTS value of ns; nil for none
		want      bool
	}{
		{name: "same hash, namespace present, within resync", namespace: true, record: rec(t, hash, now.Add(-time.Minute)), want: true},
		{name: "applied just now", namespace: true, record: rec(t, hash, now), want: true},
		{name: "namespace missing", namespace: false, record: rec(t, hash, now.Add(-time.Minute)), want: false},
		{name: "applied a resync period ago", namespace: true, record: rec(t, hash, now.Add(-DefaultResync)), want: false},
		{name: "applied longer ago", namespace: true, record: rec(t, hash, now.Add(-time.Hour)), want: false},
		{name: "hash differs", namespace: true, record: rec(t, "9c1d", now.Add(-time.Minute)), want: false},
		{name: "no record", namespace: true, want: false},
		{name: "record not JSON", namespace: true, record: json.RawMessage(`not json`), want: false},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// A bucket per case: the bucket keeps one value per namespace.
			cfg := events.Options{}.TenantBucketConfig()
			cfg.Bucket += "_" + string(rune('A'+i))
			kv, err := js.CreateKeyValue(t.Context(), cfg)
			if err != nil {
				t.Fatalf("creating the tenant bucket: %v", err)
			}
			if tc.record != nil {
				if _, err := kv.Put(t.Context(), ns, tc.record); err != nil {
					t.Fatalf("writing the tenant record: %v", err)
				}
			}
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
				tenants:    kv,
				namespaces: namespaces,
			}
			if got := w.applied(t.Context(), ns, hash); got != tc.want {
				t.Errorf("applied() = %v, want %v", got, tc.want)
			}
		})
	}
}

func rec(t *testing.T, hash string, appliedAt time.Time) json.RawMessage {
	t.Helper()
	data, err := json.Marshal(record{Hash: hash, AppliedAt: appliedAt})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestEnsureTenantSkipsAnUnchangedTenant: an acquire whose rendered tenant hashes to the
// recorded one, applied recently into a namespace that exists, applies nothing. The Worker has no
// Applier, so any apply would fail the test.
func TestEnsureTenantSkipsAnUnchangedTenant(t *testing.T) {
	_, _, js := natstest.Start(t)
	kv, err := js.CreateKeyValue(t.Context(), events.Options{}.TenantBucketConfig())
	if err != nil {
		t.Fatalf("creating the tenant bucket: %v", err)
	}
	plan, err := lease.New(events.AcquireRequest{
		RunID: "run-1", CompanyID: "acme", EnvironmentID: "env-1", AgentID: "agent-1",
		AdapterType: "codex_local", Config: json.RawMessage(`{"egressMode":"cilium"}`),
	}, now)
	if err != nil {
		t.Fatalf("lease.New() error: %v", err)
	}
	tenant, err := plan.Tenant()
	if err != nil {
		t.Fatalf("Tenant() error: %v", err)
	}
	if _, err := kv.Put(t.Context(), plan.Namespace, rec(t, tenant.Hash(), now.Add(-time.Minute))); err != nil {
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
