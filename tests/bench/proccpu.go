package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// nodeProcesses are the processes whose CPU (e) and (f) report: the control plane and the node
// agent that serve a burst on this one-node cluster (comm names, cut to 15 bytes as the kernel
// keeps them). The bench itself (the embedded NATS server and every worker, (f)'s extra
// dispatchers included: they run in this process) comes first.
var nodeProcesses = []string{"kube-apiserver", "etcd", "kube-controller", "kube-scheduler", "kubelet", "containerd", "containerd-shim"}

// nodeCPU is a reading of the CPU time of the bench and of the node's processes by name, every
// process of a name summed (containerd-shim: one per pod).
type nodeCPU struct {
	at    time.Time
	bench time.Duration
	procs map[string]time.Duration
}

// readNodeCPU reads /proc; on a system without it the reading is empty and procShares says
// nothing.
func readNodeCPU() nodeCPU {
	r := nodeCPU{at: time.Now(), procs: map[string]time.Duration{}}
	r.bench = readProcCPU(os.Getpid()).cpu
	comms, _ := filepath.Glob("/proc/[0-9]*/comm")
	for _, path := range comms {
		comm, err := os.ReadFile(path)
		name := string(bytes.TrimSpace(comm))
		if err != nil || !slices.Contains(nodeProcesses, name) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(path)))
		if err != nil {
			continue
		}
		if p := readProcCPU(pid); p.err == nil {
			r.procs[name] += p.cpu
		}
	}
	return r
}

// procShares is each process's CPU between two readings in percent of one core, the bench
// first, then the others in nodeProcesses' order; "" when nothing was read. A process that
// ended in between (a pod's shim) takes its time with it, so a sum can come out low.
func procShares(from, to nodeCPU) string {
	window := to.at.Sub(from.at).Seconds()
	if window <= 0 || len(to.procs) == 0 {
		return ""
	}
	pct := func(d time.Duration) string { return fmt.Sprintf("%.0f%%", 100*max(0, d.Seconds())/window) }
	parts := []string{"bench (NATS + workers) " + pct(to.bench-from.bench)}
	for _, name := range nodeProcesses {
		if _, ok := to.procs[name]; ok {
			parts = append(parts, name+" "+pct(to.procs[name]-from.procs[name]))
		}
	}
	return strings.Join(parts, ", ")
}
