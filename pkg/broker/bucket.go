package broker

import (
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// Bucket is the KV bucket of grants.
const Bucket = "KUBECLIP_GRANTS"

// grantRecordBytes is what one grant costs the bucket at most: a record with every field at
// its bound (ids of events.MaxTokenLen bytes, maxBindingHosts hosts of 253 bytes, a value of
// MaxValueBytes), its key and the store's own record took 10,906 bytes
// (TestGrantRecordFitsItsSize); 12 KiB leaves margin.
const grantRecordBytes = 12 << 10

// maxRecordValueBytes is the bucket's MaxValueSize: a record's JSON at its largest took 10,414
// bytes (TestGrantRecordFitsItsSize).
const maxRecordValueBytes = 11 << 10

// markerTTL is how long a released grant's delete marker stays in the bucket: a replica that
// starts within it learns the grant was released (and answers "released" rather than
// "unknown"); after it the marker's bytes go.
const markerTTL = time.Hour

// BucketOptions size the grants bucket.
type BucketOptions struct {
	// StoreBytes is the JetStream store the bucket takes its share of (0:
	// events.DefaultStoreBytes), as the workers' --store-bytes.
	StoreBytes int64
	// Companies is how many companies the store is sized for (0:
	// events.DefaultStoreCompanies), as the workers' --store-companies.
	Companies int
	// Replicas is the bucket's replicas (0: events.DefaultReplicas).
	Replicas int
	// Storage is the bucket's storage (the zero value is file storage).
	Storage jetstream.StorageType
	// GrantTTL is the longest a grant lives (0: events.DefaultLeaseMaxAge, a lease's longest
	// life): a grant whose release never reached the broker expires with its lease.
	GrantTTL time.Duration
}

func (o BucketOptions) withDefaults() BucketOptions {
	if o.StoreBytes <= 0 {
		o.StoreBytes = events.DefaultStoreBytes
	}
	if o.Companies <= 0 {
		o.Companies = events.DefaultStoreCompanies
	}
	if o.Replicas <= 0 {
		o.Replicas = events.DefaultReplicas
	}
	if o.GrantTTL <= 0 {
		o.GrantTTL = events.DefaultLeaseMaxAge
	}
	return o
}

// bucketBytes is the bucket's byte limit: its share of the store (events.StoreGrants).
func (o BucketOptions) bucketBytes() int64 {
	return events.StoreLimit(o.StoreBytes, events.StoreGrants)
}

// Config is the KUBECLIP_GRANTS bucket: history 1 (a grant is written once, bound to its pod
// once, and deleted), file storage, its share of the store, a TTL of a lease's life, and delete
// markers that every watcher sees and that go after markerTTL.
func (o BucketOptions) Config() jetstream.KeyValueConfig {
	o = o.withDefaults()
	return jetstream.KeyValueConfig{
		Bucket:         Bucket,
		Description:    "kubeclip credential broker grants (values sealed), keyed by company, lease and grant id",
		History:        1,
		TTL:            o.GrantTTL,
		MaxValueSize:   maxRecordValueBytes,
		MaxBytes:       events.StoreLimit(o.StoreBytes, events.StoreGrants),
		LimitMarkerTTL: markerTTL,
		Storage:        o.Storage,
		Replicas:       o.Replicas,
	}
}

// GrantQuota is how many grants one company may hold at once by default: the bucket divided
// among the companies the store is sized for, at a grant's largest. So as long as no more
// companies than that hold their quota, the bucket (DiscardNew, like every kubeclip bucket)
// never refuses a mint or a release for being full.
func (o BucketOptions) GrantQuota() int {
	o = o.withDefaults()
	return int(o.bucketBytes() / int64(o.Companies) / grantRecordBytes)
}

// CheckGrantQuota reports an error naming setting when quota grants per company, for every
// company the store is sized for, do not fit the bucket.
func (o BucketOptions) CheckGrantQuota(setting string, quota int) error {
	if fit := o.GrantQuota(); quota > fit || quota <= 0 {
		o = o.withDefaults()
		return fmt.Errorf("%s is %d grants per company, but %d companies × grants of up to %d bytes fit the grants bucket's %d bytes (%d‰ of %d) only at 1 to %d: lower it, or raise the store bytes or lower the companies the store is sized for",
			setting, quota, o.Companies, grantRecordBytes, o.bucketBytes(), events.Stores()[events.StoreGrants].Permille, o.StoreBytes, fit)
	}
	return nil
}

// Keys. A grant's key is "<company>.<lease>.<grant id in hex>", the company and lease parts as
// events.RunRef.Key writes ids (the id itself when it is made of key characters, else
// "_b64_" + base64url). The layout is chosen over "<grant id>" plus a lease index because the
// key itself then answers the two questions the bucket is asked besides "this grant": a
// lease's grants (Release, BindPeer: a filtered listing of "<company>.<lease>.*") and a
// company's count (the quota: "<company>.>"), with nothing to keep in step and nothing left
// behind when a write between the grant and its index fails. Resolve never reads keys: each
// replica's Cache finds a grant by its id in memory, wherever its key puts it.

// leaseKey is "<company>.<lease>", the prefix of the lease's grants.
func leaseKey(company, lease string) string { return events.Ref(company, lease).Key() }

// grantKey is grant g's key.
func grantKey(company, lease string, id GrantID) string {
	return leaseKey(company, lease) + "." + id.String()
}

// companyFilter matches every key of company's grants.
func companyFilter(company string) string {
	part, _, _ := strings.Cut(leaseKey(company, "-"), ".")
	return part + ".>"
}

// keyGrantID is the grant id a key ends with.
func keyGrantID(key string) (GrantID, bool) {
	i := strings.LastIndexByte(key, '.')
	if i < 0 {
		return GrantID{}, false
	}
	return parseGrantID(key[i+1:])
}
