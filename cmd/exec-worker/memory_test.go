package main

import (
	"math"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/execsvc"
)

// TestReplicaSizing: the production overlay's 256 Mi serves 576 streams with 48 MiB of buffers;
// --max-execs replaces the streams only.
func TestReplicaSizing(t *testing.T) {
	const mib = 1 << 20
	for _, tc := range []struct {
		name     string
		limit    int64
		maxExecs int
		want     execsvc.Sizing
	}{
		{"256 Mi", 256 * mib, 0, execsvc.Sizing{Sessions: 576, BufferBytes: 48 * mib}},
		{"256 Mi, --max-execs 100", 256 * mib, 100, execsvc.Sizing{Sessions: 100, BufferBytes: 48 * mib}},
		{"no limit", math.MaxInt64, 0, execsvc.Sizing{Sessions: execsvc.DefaultMaxSessions, BufferBytes: execsvc.DefaultBufferBytes}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := replicaSizing(tc.limit, tc.maxExecs); got != tc.want {
				t.Errorf("replicaSizing(%d, %d) = %+v, want %+v", tc.limit, tc.maxExecs, got, tc.want)
			}
		})
	}
}

// TestSoftMemoryLimit: nine tenths of a container limit, unless GOMEMLIMIT is set or there is
// no limit.
func TestSoftMemoryLimit(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limit  int64
		set    bool
		want   int64
		wantOK bool
	}{
		{"256 Mi", 256 << 20, false, 256<<20 - (256<<20)/10, true},
		{"GOMEMLIMIT set", 256 << 20, true, 0, false},
		{"no limit", math.MaxInt64, false, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := softMemoryLimit(tc.limit, tc.set)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("softMemoryLimit(%d, %v) = %d, %v, want %d, %v", tc.limit, tc.set, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}
