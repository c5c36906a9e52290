package lease

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The lease and tenant records are kubeclip's own, but a bucket can hold a value an older or
// broken writer left. The seed corpora under testdata/fuzz run with every `go test`; `make fuzz`
// explores.

// FuzzDecodeRecord checks that a lease record Modify reads, it can write back: the encoding
// reads as the same record.
func FuzzDecodeRecord(f *testing.F) {
	f.Add([]byte(`{"runId":"r1","companyId":"c1","state":"created","namespace":"paperclip-c1","createdAt":"2026-08-24T10:30:00Z"}`))
	f.Add([]byte(reusableRecord))
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

// reusableRecord is a suspended reusable lease as kubeclip writes it.
const reusableRecord = `{"runId":"r1","companyId":"c1","agentId":"a1","state":"suspended","namespace":"paperclip-c1",` +
	`"workloadName":"pc-1","secretName":"pc-1-env","backend":"pod","createdAt":"2026-08-24T10:30:00Z",` +
	`"reusable":true,"volumeClaim":"pc-1-home","generation":2,"resumes":3,"suspendedAt":"2026-08-24T11:00:00Z"}`

// oldRecord is a lease record as workers wrote it before reusable leases existed (the seed
// testdata/fuzz/FuzzDecodeRecord/created).
const oldRecord = `{"runId":"0e8b6f4a-5a7c-4c1e-9f0b-2a9d7c3e1b44","companyId":"7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13",` +
	`"agentId":"4a9e2c7b-1f3d-4b8a-9c6e-7d1f3a5b2e98","state":"created","namespace":"paperclip-7d2f1c9e-3b4a-4e8d-a6f1-0c5b9e2d7a13",` +
	`"workloadName":"pc-01k3b7r2m9x4c8v5n6t1q0w2ey","secretName":"pc-01k3b7r2m9x4c8v5n6t1q0w2ey-env","backend":"job",` +
	`"createdAt":"2026-08-24T10:30:00.412318Z","expiresAt":"2026-08-24T12:30:00+02:00"}`

// TestRecordsBeforeReuse: a record written before reusable leases existed decodes as a lease
// that is not reusable, and encodes again with exactly its keys (the reusable lease's fields are
// omitted when zero), so the records of every other lease read the same to a worker of the
// previous release. A reusable lease's record keeps all of its fields.
func TestRecordsBeforeReuse(t *testing.T) {
	old, err := decodeRecord([]byte(oldRecord))
	if err != nil {
		t.Fatal(err)
	}
	if old.Reusable || old.VolumeClaim != "" || old.Generation != 0 || old.Resumes != 0 ||
		old.RetainedAt != nil || old.SuspendedAt != nil || old.Collected {
		t.Errorf("an old record decodes with reusable-lease fields set: %+v", old)
	}
	if diff := cmp.Diff(keys(t, []byte(oldRecord)), keys(t, mustMarshal(t, old))); diff != "" {
		t.Errorf("an old record's keys after a round trip (-before +after):\n%s", diff)
	}

	r, err := decodeRecord([]byte(reusableRecord))
	if err != nil {
		t.Fatal(err)
	}
	want := Record{
		RunID: "r1", CompanyID: "c1", AgentID: "a1", State: StateSuspended, Namespace: "paperclip-c1",
		WorkloadName: "pc-1", SecretName: "pc-1-env", Backend: "pod", CreatedAt: time.Date(2026, 8, 24, 10, 30, 0, 0, time.UTC),
		Reusable: true, VolumeClaim: "pc-1-home", Generation: 2, Resumes: 3, SuspendedAt: ptr(time.Date(2026, 8, 24, 11, 0, 0, 0, time.UTC)),
	}
	if diff := cmp.Diff(want, r); diff != "" {
		t.Errorf("reusable record (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(keys(t, []byte(reusableRecord)), keys(t, mustMarshal(t, r))); diff != "" {
		t.Errorf("a reusable record's keys after a round trip (-before +after):\n%s", diff)
	}
}

func keys(t *testing.T, data []byte) []string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func ptr[T any](v T) *T { return &v }

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
