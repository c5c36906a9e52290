package main

import (
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/kubeclip/kubeclip/pkg/execsvc"
)

// cgroupMemoryFiles hold the container's memory limit: cgroup v2, then v1.
var cgroupMemoryFiles = []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

// memoryLimit is the smaller of the container's cgroup memory limit and GOMEMLIMIT, in bytes;
// math.MaxInt64 when neither is set.
func memoryLimit() int64 {
	limit := debug.SetMemoryLimit(-1) // reads GOMEMLIMIT's effect without changing it
	for _, f := range cgroupMemoryFiles {
		if n, ok := readLimit(f); ok {
			limit = min(limit, n)
			break
		}
	}
	return limit
}

// readLimit reads a cgroup memory limit file: a byte count, or "max" (none).
func readLimit(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return math.MaxInt64, true
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, false
	}
	return n, true
}

// replicaSizing is what the replica serves at once: execsvc.SizeFor its memory limit, with
// maxExecs sessions when it is set (the buffers stay sized from the limit).
func replicaSizing(limit int64, maxExecs int) execsvc.Sizing {
	sz := execsvc.SizeFor(limit)
	if maxExecs > 0 {
		sz.Sessions = maxExecs
	}
	return sz
}

// softMemoryLimit is the Go runtime's memory limit for a container limited to limit bytes when
// GOMEMLIMIT is not set: nine tenths of it, so the collector works harder before the container
// is killed rather than letting garbage grow the heap to twice what is live. ok is false when
// there is nothing to set (no container limit, or GOMEMLIMIT set).
func softMemoryLimit(limit int64, gomemlimitSet bool) (int64, bool) {
	if gomemlimitSet || limit <= 0 || limit == math.MaxInt64 {
		return 0, false
	}
	return limit - limit/10, true
}
