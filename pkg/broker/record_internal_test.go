package broker

import (
	"crypto/rand"
	"net/netip"
	"strings"
	"testing"

	"github.com/kubeclip/kubeclip/internal/natstest"
)

// TestGrantRecordFitsItsSize mints the largest grant there can be (ids of MaxTokenLen bytes that
// JSON escapes and keys encode, eight hosts of 253 bytes, a value of MaxValueBytes) and measures
// what it costs the bucket's stream: grantRecordBytes, which GrantQuota divides by, must hold
// it, and the record must fit the bucket's MaxValueSize.
func TestGrantRecordFitsItsSize(t *testing.T) {
	_, _, js := natstest.Start(t)
	kv, err := js.CreateKeyValue(t.Context(), BucketOptions{StoreBytes: 1 << 30}.Config())
	if err != nil {
		t.Fatal(err)
	}
	key := make([]byte, SealingKeyLen)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	sealer, err := NewSealer(key)
	if err != nil {
		t.Fatal(err)
	}
	st, err := NewStore(StoreOptions{KV: kv, Sealer: sealer, GrantsPerCompany: 1})
	if err != nil {
		t.Fatal(err)
	}
	id := strings.Repeat("<", 128) // JSON writes each as \u003c; a key part encodes it in base64
	label := strings.Repeat("a", 63)
	host := strings.Join([]string{label, label, label, label[:61]}, ".")
	var hosts []string
	for i := range maxBindingHosts {
		hosts = append(hosts, string(rune('a'+i))+host[1:])
	}
	_, g, err := st.Mint(t.Context(), MintRequest{
		Company: id, Run: id, Lease: id, Key: strings.Repeat("K", maxKeyNameLen),
		Binding: Binding{Hosts: hosts, Headers: Headers()},
		Peer:    netipMustParse("fd00:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
		Value:   strings.Repeat("v", MaxValueBytes),
	})
	if err != nil {
		t.Fatalf("minting the largest grant: %v", err)
	}
	e, err := kv.Get(t.Context(), grantKey(id, id, g.ID))
	if err != nil {
		t.Fatal(err)
	}
	info, err := js.Stream(t.Context(), "KV_"+Bucket)
	if err != nil {
		t.Fatal(err)
	}
	bytes := info.CachedInfo().State.Bytes
	t.Logf("largest grant: record %d bytes (MaxValueSize %d), %d bytes in the stream (grantRecordBytes %d)", len(e.Value()), maxRecordValueBytes, bytes, grantRecordBytes)
	if len(e.Value()) > maxRecordValueBytes || bytes > grantRecordBytes {
		t.Errorf("the largest grant takes %d bytes (record %d): over grantRecordBytes %d or MaxValueSize %d", bytes, len(e.Value()), grantRecordBytes, maxRecordValueBytes)
	}
}

func netipMustParse(s string) netip.Addr { return netip.MustParseAddr(s) }
