package lease

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The lease and tenant records are kubeclip's own, but a bucket can hold a value an older or
// broken writer left. The seed corpora under testdata/fuzz run with every `go test`; `make fuzz`
// explores.

// FuzzDecodeRecord checks that a lease record Modify reads, it can write back: the encoding
// reads as the same record.
func FuzzDecodeRecord(f *testing.F) {
	f.Add([]byte(`{"runId":"r1","companyId":"c1","state":"created","namespace":"paperclip-c1","createdAt":"2026-08-24T10:30:00Z"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rec, err := decodeRecord(data)
		if err != nil {
			return
		}
		enc, err := json.Marshal(rec)
		if err != nil {
			t.Fatalf("encoding %+v: %v", rec, err)
		}
		again, err := decodeRecord(enc)
		if err != nil {
			t.Fatalf("decoding %s: %v", enc, err)
		}
		if diff := cmp.Diff(rec, again); diff != "" {
			t.Fatalf("round trip (-first +again):\n%s", diff)
		}
	})
}

// FuzzDecodeTenant checks the same of tenant records, and that a value that does not decode
// reads as the zero record a claim replaces.
func FuzzDecodeTenant(f *testing.F) {
	f.Add([]byte(`{"companyId":"c1","claimedAt":"2026-08-24T10:30:00Z","hash":"sha256:ab","egressMode":"standard"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		rec, ok := decodeTenant(data)
		if !ok {
			if rec != (TenantRecord{}) {
				t.Fatalf("a value that does not decode reads as %+v", rec)
			}
			return
		}
		enc, err := json.Marshal(rec)
		if err != nil {
			t.Fatalf("encoding %+v: %v", rec, err)
		}
		again, ok := decodeTenant(enc)
		if diff := cmp.Diff(rec, again); !ok || diff != "" {
			t.Fatalf("round trip of %s (decoded: %v) (-first +again):\n%s", enc, ok, diff)
		}
	})
}
