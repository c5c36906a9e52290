package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// breakdownRow is a diagnostic: where a phase's time went (a pipeline stage, or one kind of
// Kubernetes request made by a worker). Latencies in milliseconds.
type breakdownRow struct {
	Phase string   `json:"phase"`
	What  string   `json:"what"`
	N     int      `json:"n"`
	P50   *float64 `json:"p50"`
	P99   *float64 `json:"p99"`
	// Total is the sum of the durations: what the phase spent on it, comparable across rows
	// where percentiles are not (the p50 of a sum is not the sum of the p50s).
	Total  *float64 `json:"total,omitempty"`
	Errors int      `json:"errors,omitempty"`
}

func stageRow(phase, what string, s samples) breakdownRow {
	return breakdownRow{Phase: phase, What: what, N: len(s.d), P50: s.p50(), P99: s.p99(), Total: s.total(), Errors: s.errs}
}

// acquireStages splits runs' acquire → created into the tenant-worker's part (acquire
// published → dispatch request seen), the dispatch request's wait in the work queue (→ the
// dispatcher's handler reads the lease record), the handler (→ its publish of created
// returned) and the delivery of created to the bench.
func (b *bench) acquireStages(phase string, runs []string) []breakdownRow {
	var tenant, queued, handler, delivery samples
	for _, id := range runs {
		ev := b.events.snapshot(id)
		start, ok := b.published[id]
		read, readOK := b.stats.marked(markLeaseRead, id)
		published, pubOK := b.stats.marked(markCreatedPublished, id)
		if !ok || !readOK || !pubOK || ev.dispatched.IsZero() || ev.created.IsZero() {
			continue
		}
		tenant.add(ev.dispatched.Sub(start), nil)
		queued.add(read.Sub(ev.dispatched), nil)
		handler.add(published.Sub(read), nil)
		delivery.add(ev.created.Sub(published), nil)
	}
	return []breakdownRow{
		stageRow(phase, "stage tenant-worker: acquire published → dispatch request seen", tenant),
		stageRow(phase, "stage work queue: dispatch request seen → dispatcher handler starts", queued),
		stageRow(phase, "stage dispatcher handler: start → created published", handler),
		stageRow(phase, "stage delivery: created published → received by the bench", delivery),
	}
}

// resultStages splits (c)'s runs' container terminated (the bench's pod informer) → result
// received into the run-watcher's terminal status (its informer's event, the status publish,
// its delivery), the log's tail (from the status's receipt to the start of the result's
// publish: the final log read and the last chunk's publish), the result's publish and its
// delivery to the bench; slowest describes the slowest runs stage by stage.
func (b *bench) resultStages(phase string, pods map[string]podTimes) (rows []breakdownRow, slowest string) {
	type split struct {
		run                             string
		total, status, tail, pub, deliv time.Duration
		ran                             time.Duration // running → terminated, as the bench saw it
	}
	var all []split
	var status, tail, publish, delivery samples
	for id, pod := range pods {
		ev := b.events.snapshot(id)
		publishing, okStart := b.stats.marked(markPublishing+string(events.KindResult), id)
		published, okEnd := b.stats.marked(markPublished+string(events.KindResult), id)
		if ev.ended.IsZero() || ev.result.IsZero() || !okStart || !okEnd {
			continue
		}
		sp := split{run: id, total: ev.result.Sub(pod.terminated), status: ev.ended.Sub(pod.terminated), tail: publishing.Sub(ev.ended),
			pub: published.Sub(publishing), deliv: ev.result.Sub(published), ran: pod.terminated.Sub(pod.running)}
		all = append(all, sp)
		status.add(sp.status, nil)
		tail.add(sp.tail, nil)
		publish.add(sp.pub, nil)
		delivery.add(sp.deliv, nil)
	}
	slices.SortFunc(all, func(x, y split) int { return int(y.total - x.total) })
	parts := make([]string, 0, 3)
	for _, sp := range all[:min(3, len(all))] {
		parts = append(parts, fmt.Sprintf("%s run seen running %.0f ms: %.1f = %.1f + %.1f + %.1f + %.1f", b.runPhase(sp.run), msf(sp.ran),
			msf(sp.total), msf(sp.status), msf(sp.tail), msf(sp.pub), msf(sp.deliv)))
	}
	return []breakdownRow{
		stageRow(phase, "stage run-watcher: raw watch saw container terminated → terminal status received", status),
		stageRow(phase, "stage run-watcher: terminal status received → result publish starts (final log read, last chunk)", tail),
		stageRow(phase, "stage run-watcher: result publish (start → acknowledged)", publish),
		stageRow(phase, "stage delivery: result published → received by the bench", delivery),
	}, strings.Join(parts, "; ")
}

// runPhase is the letter of the phase that started runID: (a), (b) or (d).
func (b *bench) runPhase(runID string) string {
	switch {
	case slices.Contains(b.warmRuns, runID):
		return "(a)"
	case slices.Contains(b.coldRuns, runID):
		return "(b)"
	case slices.Contains(b.logRuns, runID):
		return "(d)"
	}
	return "?"
}

// readFinalLogs adds to (c')'s samples each of runIDs' agent log read once (Timestamps, no
// Follow), the request the run-watcher's final read makes (k8s.ReadLogs) once the container has
// terminated. A phase calls it at its end: the next phase's settle deletes the pods.
func (b *bench) readFinalLogs(ctx context.Context, runIDs []string) {
	wctx, cancel := b.waitCtx(ctx)
	defer cancel()
	for _, id := range runIDs {
		p, err := b.pods.terminated(wctx, id)
		if err != nil {
			b.finalLogReads.add(0, err)
			continue
		}
		start := time.Now()
		err = readAll(wctx, b.raw.cs.CoreV1().Pods(p.namespace).GetLogs(p.name, &corev1.PodLogOptions{Container: policy.AgentContainerName, Timestamps: true}))
		b.finalLogReads.add(time.Since(start), err)
	}
}

// readAll reads a log request's stream to its end.
func readAll(ctx context.Context, req *rest.Request) error {
	stream, err := req.Stream(ctx)
	if err != nil {
		return err
	}
	defer stream.Close()
	_, err = io.Copy(io.Discard, stream)
	return err
}

// minCPUWindow is the shortest phase whose CPU use is reported: shorter ones are mostly the
// clock's granularity.
const minCPUWindow = 2 * time.Second

// cpuUsage is a reading of the node's and this process's CPU time.
type cpuUsage struct {
	at          time.Time
	busy, total uint64 // jiffies over all CPUs, /proc/stat
	process     time.Duration
	// load is /proc/loadavg's 1, 5 and 15 minute averages: other work on a shared node shows.
	load string
}

// readCPU reads /proc/stat, /proc/loadavg and this process's rusage; on a system without them
// it returns the zero value and the phase's note says nothing about CPU.
func readCPU() cpuUsage {
	u := cpuUsage{at: time.Now(), load: "?"}
	if data, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(data)); len(f) >= 3 {
			u.load = strings.Join(f[:3], " ")
		}
	}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		u.process = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return u
	}
	line, _, _ := strings.Cut(string(data), "\n")
	fields := strings.Fields(line)
	for i, f := range fields[1:] {
		n, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			continue
		}
		u.total += n
		if i != 3 && i != 4 { // idle, iowait
			u.busy += n
		}
	}
	return u
}

// nodeBusy is the node's CPU use between two readings in percent of all cores, or -1 when
// /proc/stat could not be read.
func nodeBusy(from, to cpuUsage) float64 {
	if to.total <= from.total {
		return -1
	}
	return 100 * float64(to.busy-from.busy) / float64(to.total-from.total)
}

// cpuNote describes the CPU use between two readings.
func cpuNote(phase string, from, to cpuUsage) string {
	if to.total <= from.total {
		return ""
	}
	node := nodeBusy(from, to)
	proc := 100 * (to.process - from.process).Seconds() / to.at.Sub(from.at).Seconds()
	return fmt.Sprintf("%s: node CPU %.0f%% busy (all cores), load average %s → %s; the bench process (NATS server, workers, bench) used %.0f%% of one core", phase, node, from.load, to.load, proc)
}
