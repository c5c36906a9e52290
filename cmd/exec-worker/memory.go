package main

import (
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
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
