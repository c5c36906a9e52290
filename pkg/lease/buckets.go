package lease

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// The KV buckets of lease and tenant records. Every worker reads them (the tenant-worker and
// the dispatcher write), so every worker makes sure they exist at start-up (EnsureBuckets).
const (
	// Bucket holds the lease records (Record), keyed by RunRef.Key, created with compare-and-set
	// so a redelivered acquire reuses the run's workload name.
	Bucket = "KUBECLIP_LEASES"
	// TenantBucket holds the tenant records (TenantRecord), keyed by namespace.
	TenantBucket = "KUBECLIP_TENANTS"
)

// DefaultRecordTTL is how long a lease record lives after its last update: as long as run
// events are kept (events.DefaultRunMaxAge), so a run's record is there for as long as its
// history is.
const DefaultRecordTTL = events.DefaultRunMaxAge

const (
	// recordHistory keeps a run's last few lease-record revisions for debugging; compare-and-
	// set only needs the latest.
	recordHistory = 5
	// maxRecordBytes and maxTenantRecordBytes bound KV values: a lease record (namespace,
	// workload, agent, state) and a tenant record (company, config hash) are a few hundred
	// bytes, so a bigger value is a bug, and the server says so at write time.
	maxRecordBytes       = 64 << 10
	maxTenantRecordBytes = 4 << 10
	// failedRecordMarkerTTL is how long the marker of an expired failed record stays: a
	// minute, enough for a reader to see the key go.
	failedRecordMarkerTTL = time.Minute
)

// BucketOptions configures the lease and tenant buckets. The zero value of every field means its
// default.
type BucketOptions struct {
	// Replicas of both buckets (default 1), as for the streams (events.Options.Replicas).
	Replicas int
	// Storage of both buckets (default file): a lost lease record is a redelivered acquire that
	// starts a run twice.
	Storage jetstream.StorageType
	// RecordTTL is how long a lease record lives after its last update (DefaultRecordTTL).
	RecordTTL time.Duration
	// LeaseMaxAge is the lease stream's retention (events.Options.LeaseMaxAge, default
	// events.DefaultLeaseMaxAge). RecordTTL must be at least this long: while an acquire can
	// still be redelivered from the lease stream (say, to a recreated consumer), its lease record
	// must still be there so the redelivery reuses the run's workload instead of creating a
	// second one.
	LeaseMaxAge time.Duration
	// StoreBytes is the JetStream store both buckets take their share of
	// (events.Options.StoreBytes; 0: the default).
	StoreBytes int64
}

func (o BucketOptions) withDefaults() BucketOptions {
	if o.Replicas == 0 {
		o.Replicas = events.DefaultReplicas
	}
	if o.RecordTTL == 0 {
		o.RecordTTL = DefaultRecordTTL
	}
	if o.LeaseMaxAge == 0 {
		o.LeaseMaxAge = events.DefaultLeaseMaxAge
	}
	return o
}

// Validate reports settings the buckets cannot have, after defaults are applied.
func (o BucketOptions) Validate() error {
	o = o.withDefaults()
	switch {
	case o.RecordTTL < 0:
		return fmt.Errorf("lease record TTL must be positive, got %s", o.RecordTTL)
	case o.RecordTTL < o.LeaseMaxAge:
		return fmt.Errorf("lease record TTL %s must be at least the lease max age %s, or a redelivered acquire could start a run twice", o.RecordTTL, o.LeaseMaxAge)
	}
	return nil
}

// RecordBucketConfig is the KUBECLIP_LEASES bucket.
func (o BucketOptions) RecordBucketConfig() jetstream.KeyValueConfig {
	o = o.withDefaults()
	return jetstream.KeyValueConfig{
		Bucket:       Bucket,
		Description:  "kubeclip lease records, keyed by company and run",
		History:      recordHistory,
		TTL:          o.RecordTTL,
		MaxValueSize: maxRecordBytes,
		MaxBytes:     events.StoreLimit(o.StoreBytes, events.StoreLeaseRecords),
		// Enables per-key TTLs: a failed acquire's record expires after FailedRecordTTL.
		LimitMarkerTTL: failedRecordMarkerTTL,
		Storage:        o.Storage,
		Replicas:       o.Replicas,
	}
}

// TenantBucketConfig is the KUBECLIP_TENANTS bucket: the company that claimed each tenant
// namespace and the hash of the tenant config last applied, so the tenant-worker skips the
// server-side apply when nothing changed. No TTL: a tenant lives as long as its namespace, and a
// lost entry costs one re-apply (and a claim the same company makes again).
func (o BucketOptions) TenantBucketConfig() jetstream.KeyValueConfig {
	o = o.withDefaults()
	return jetstream.KeyValueConfig{
		Bucket:       TenantBucket,
		Description:  "kubeclip applied tenant config hash, keyed by namespace",
		History:      1,
		MaxValueSize: maxTenantRecordBytes,
		MaxBytes:     events.StoreLimit(o.StoreBytes, events.StoreTenants),
		Storage:      o.Storage,
		Replicas:     o.Replicas,
	}
}

// EnsureBuckets creates the lease and tenant buckets, or updates them to o. It is idempotent:
// every worker calls it at start-up, after events.EnsureStreams.
func EnsureBuckets(ctx context.Context, js events.BucketMaker, o BucketOptions) error {
	if err := o.Validate(); err != nil {
		return fmt.Errorf("bucket options: %w", err)
	}
	for _, cfg := range []jetstream.KeyValueConfig{o.RecordBucketConfig(), o.TenantBucketConfig()} {
		if _, err := events.EnsureBucket(ctx, js, cfg); err != nil {
			return fmt.Errorf("creating or updating KV bucket %s: %w", cfg.Bucket, err)
		}
	}
	return nil
}
