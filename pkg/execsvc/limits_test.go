package execsvc

import (
	"math"
	"testing"
)

// TestSessionsFor pins the sizing arithmetic: what remains of the memory limit after the
// replica's reserve, in worst-case sessions.
func TestSessionsFor(t *testing.T) {
	const mib = 1 << 20
	if got := SessionBytes(DefaultMaxRecordedLine); got != 4*mib+3*mib/4 {
		t.Errorf("SessionBytes = %d, want 4.75 MiB (1 MiB frame + 2.5 MiB stdin + 1 MiB line + 256 KiB)", got)
	}
	for _, tc := range []struct {
		name  string
		limit int64
		want  int
	}{
		{"the manifests' 256 Mi", 256 * mib, 40},
		{"1 GiB", 1024 * mib, 202},
		{"less than the reserve", 32 * mib, 1},
		{"no limit (cgroup max)", math.MaxInt64, DefaultMaxSessions},
		{"unknown", 0, DefaultMaxSessions},
		{"huge", 1 << 50, DefaultMaxSessions},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := SessionsFor(tc.limit, DefaultMaxRecordedLine); got != tc.want {
				t.Errorf("SessionsFor(%d) = %d, want %d", tc.limit, got, tc.want)
			}
			if got := SessionsFor(tc.limit, DefaultMaxRecordedLine); tc.limit > 0 && tc.limit < math.MaxInt64 && got > 1 && sessionReserve+int64(got)*SessionBytes(DefaultMaxRecordedLine) > tc.limit {
				t.Errorf("%d sessions need more than %d bytes", got, tc.limit)
			}
		})
	}
}

// TestSlots: a company is held to its share, the replica to its total, and a release (once,
// however often called) frees the slot.
func TestSlots(t *testing.T) {
	s := newSlots(3, 2)
	a1, err := s.take("a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.take("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.take("a"); err == nil {
		t.Fatal("a third slot of company a's share of 2")
	}
	if _, err := s.take("b"); err != nil {
		t.Fatalf("company b while a holds its share: %v", err)
	}
	if _, err := s.take("c"); err == nil {
		t.Fatal("a fourth slot of 3")
	}
	a1()
	a1()
	if _, err := s.take("c"); err != nil {
		t.Fatalf("after a release: %v", err)
	}
	if _, err := s.take("c"); err == nil {
		t.Fatal("a released twice freed two slots")
	}
	if got := CompanyShare(16); got != 4 {
		t.Errorf("CompanyShare(16) = %d, want 4", got)
	}
	if got := CompanyShare(2); got != 1 {
		t.Errorf("CompanyShare(2) = %d, want 1", got)
	}
}
