package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The API server's CPU during a window of (j): the local cluster's kube-apiserver is a process
// of this machine (hack/cluster), so the bench reads its CPU time (utime + stime) from
// /proc/<pid>/stat before and after the window. Against a remote cluster there is no such
// process and the rows say so.
const (
	apiServerComm = "kube-apiserver"
	// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on every Linux ABI Go
	// supports (sysconf(_SC_CLK_TCK) needs cgo).
	clockTicks = 100
	// apiServerHow says in a row how its figure was measured.
	apiServerHow = "kube-apiserver process CPU (utime+stime, /proc/<pid>/stat) ÷ window wall time"
)

// procCPU is one reading of a process's CPU time.
type procCPU struct {
	pid int
	at  time.Time
	cpu time.Duration
	err error
}

// readAPIServerCPU finds the kube-apiserver process and reads its CPU time.
func readAPIServerCPU() procCPU {
	pid, err := findProcess(apiServerComm)
	if err != nil {
		return procCPU{at: time.Now(), err: err}
	}
	r := readProcCPU(pid)
	return r
}

// findProcess returns the pid of the one process whose comm is name.
func findProcess(name string) (int, error) {
	comms, err := filepath.Glob("/proc/[0-9]*/comm")
	if err != nil {
		return 0, err
	}
	var found []int
	for _, path := range comms {
		comm, err := os.ReadFile(path)
		if err != nil || string(bytes.TrimSpace(comm)) != name {
			continue // gone meanwhile, or another process
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		if err == nil {
			found = append(found, pid)
		}
	}
	switch len(found) {
	case 0:
		return 0, fmt.Errorf("no %s process on this machine (a remote cluster?)", name)
	case 1:
		return found[0], nil
	default:
		return 0, fmt.Errorf("%d %s processes on this machine (pids %v): which one is the cluster's?", len(found), name, found)
	}
}

// readProcCPU reads utime + stime of pid.
func readProcCPU(pid int) procCPU {
	r := procCPU{pid: pid, at: time.Now()}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		r.err = err
		return r
	}
	// "pid (comm) state ppid ...": comm may hold spaces and parentheses; the fields after the
	// last ')' start with state (field 3), so utime (14) and stime (15) are at 11 and 12.
	i := bytes.LastIndexByte(data, ')')
	fields := strings.Fields(string(data[i+1:]))
	if i < 0 || len(fields) < 13 {
		r.err = fmt.Errorf("parsing /proc/%d/stat", pid)
		return r
	}
	var ticks uint64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			r.err = fmt.Errorf("parsing /proc/%d/stat: %w", pid, err)
			return r
		}
		ticks += n
	}
	r.cpu = time.Duration(ticks) * time.Second / clockTicks
	return r
}

// coresUsed is the CPU the process used between two readings, in cores (1 = one core busy the
// whole time), or nil when a reading failed or the process was replaced in between.
func coresUsed(from, to procCPU) *float64 {
	wall := to.at.Sub(from.at)
	if from.err != nil || to.err != nil || from.pid != to.pid || wall <= 0 {
		return nil
	}
	return round2(float64(to.cpu-from.cpu) / float64(wall))
}

// cpuErr is why coresUsed has no figure, for the report's notes.
func cpuErr(from, to procCPU) error {
	switch {
	case from.err != nil:
		return from.err
	case to.err != nil:
		return to.err
	case from.pid != to.pid:
		return fmt.Errorf("%s restarted during the window (pid %d, then %d)", apiServerComm, from.pid, to.pid)
	}
	return nil
}
