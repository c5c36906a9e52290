package main

// Where (i)'s round trip goes (issue 16, "the tails"): each exec's timestamps at the hops the
// bench can see from the outside, the raw primitives under the route measured in the same run
// (sandboxd called directly, a NATS request to an echo responder), and what could stall
// everything at once meanwhile (the pod's CPU quota, the bench process's garbage collector).

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/oklog/ulid/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/sandboxd"
)

// slowestTraced is how many of a route's slowest execs the report decomposes hop by hop.
const slowestTraced = 5

// execObserver is the exec-workers' Observer in (i): it notes when each request was answered
// with `started` and how long its handler took; the execs run one at a time, so the n-th
// answer is the n-th exec's.
type execObserver struct {
	mu       sync.Mutex
	answered []startAnswer
}

type startAnswer struct {
	at   time.Time
	took time.Duration
}

var _ execsvc.Observer = (*execObserver)(nil)

func (o *execObserver) ExecRequest(op execproto.Op, code execproto.Code, took time.Duration) {
	if op != execproto.OpStart || code != "" {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.answered = append(o.answered, startAnswer{at: time.Now(), took: took})
}

func (o *execObserver) ExecSessions(int)   {}
func (o *execObserver) ExecOutput(int)     {}
func (o *execObserver) ExecDropped(string) {}
func (o *execObserver) ExecEnvDropped(int) {}
func (o *execObserver) take() (startAnswer, bool) { // the one answer since the last take
	o.mu.Lock()
	defer o.mu.Unlock()
	defer func() { o.answered = o.answered[:0] }()
	if len(o.answered) != 1 {
		return startAnswer{}, false
	}
	return o.answered[0], true
}

// execHops are one exec's timestamps: the bench's publish of the start, the exec-worker's
// handler start (its receive) and its `started` answer (lease read, pod found, sandboxd's start
// answered), the client's receipt of `started`, and of the exit.
type execHops struct {
	published, received, answered, started, exited time.Time
}

func (h execHops) total() time.Duration { return h.exited.Sub(h.published) }

// execTrace collects a route's hops.
type execTrace struct {
	hops []execHops
}

// stages are the hops as breakdown rows, for route.
func (t execTrace) stages(phase, route string) []breakdownRow {
	var queue, handler, answering, run samples
	for _, h := range t.hops {
		queue.add(h.received.Sub(h.published), nil)
		handler.add(h.answered.Sub(h.received), nil)
		answering.add(h.started.Sub(h.answered), nil)
		run.add(h.exited.Sub(h.started), nil)
	}
	prefix := "stage " + route + ": "
	return []breakdownRow{
		stageRow(phase, prefix+"start published → exec-worker handler starts (NATS delivery, a slot)", queue),
		stageRow(phase, prefix+"handler → started answered (lease KV read, pod, sandboxd POST start: fork+exec)", handler),
		stageRow(phase, prefix+"answered → started received (session subscribes, publishes started)", answering),
		stageRow(phase, prefix+"started received → exit received (sandboxd output stream: wait, reap, exit frame; exit published)", run),
	}
}

// slowest describes the n slowest execs hop by hop, in milliseconds.
func (t execTrace) slowest(n int) string {
	hops := slices.Clone(t.hops)
	slices.SortFunc(hops, func(a, b execHops) int { return int(b.total() - a.total()) })
	parts := make([]string, 0, n)
	for _, h := range hops[:min(n, len(hops))] {
		parts = append(parts, fmt.Sprintf("%.1f = %.1f + %.1f + %.1f + %.1f", msf(h.total()),
			msf(h.received.Sub(h.published)), msf(h.answered.Sub(h.received)), msf(h.started.Sub(h.answered)), msf(h.exited.Sub(h.started))))
	}
	return strings.Join(parts, "; ")
}

func msf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// tracedSamples runs `true` n times, one after the other after a warm-up, through the
// exec-workers observed by obs, and returns the round trips and their hops.
func (b *bench) tracedSamples(ctx context.Context, l execclient.Lease, n int, obs *execObserver) (samples, execTrace, error) {
	c, err := b.execClient(ctx)
	if err != nil {
		return samples{}, execTrace{}, err
	}
	if _, err := b.execTrue(ctx, c, l); err != nil { // warm: connections, the lease's client
		return samples{}, execTrace{}, fmt.Errorf("warming exec up: %w", err)
	}
	obs.take()
	var s samples
	var tr execTrace
	for range n {
		var h execHops
		wctx, cancel := b.waitCtx(ctx)
		h.published = time.Now()
		res, err := c.Run(wctx, execclient.Exec{Lease: l, Command: "true", Timeout: time.Minute,
			OnStarted: func(string) { h.started = time.Now() }})
		h.exited = time.Now()
		cancel()
		err = exitErr("true", res, err)
		s.add(h.exited.Sub(h.published), err)
		if a, ok := obs.take(); ok && err == nil && !h.started.IsZero() && res.Attaches == 0 {
			h.answered, h.received = a.at, a.at.Add(-a.took)
			tr.hops = append(tr.hops, h)
		}
	}
	return s, tr, nil
}

// sandboxdSamples runs `true` n times through sandboxd directly, as the daemon route's
// exec-worker does (POST start, GET output to the exit frame, DELETE), over its own kept-alive
// TLS connections to the pod: the route's floor below NATS and the exec-worker.
func (b *bench) sandboxdSamples(ctx context.Context, l podLease, key []byte, n int) (samples, error) {
	pod, err := b.raw.cs.CoreV1().Pods(l.namespace).Get(ctx, l.ProviderLeaseID, metav1.GetOptions{})
	if err != nil {
		return samples{}, fmt.Errorf("reading the pod of lease %s: %w", l.ProviderLeaseID, err)
	}
	seed := execspec.DeriveSeed(key, l.namespace, l.ProviderLeaseID)
	c, err := execsvc.DaemonRoute{}.Client(execsvc.Pod{Addr: fmt.Sprintf("%s:%d", pod.Status.PodIP, execsvc.DefaultDaemonPort)}, seed)
	if err != nil {
		return samples{}, err
	}
	defer c.Close()
	run := func() error {
		wctx, cancel := b.waitCtx(ctx)
		defer cancel()
		id := ulid.Make().String()
		if _, err := c.Start(wctx, sandboxd.Spec{ID: id, Command: "true", TimeoutMs: 60_000}); err != nil {
			return err
		}
		out, err := c.Output(wctx, id, 1)
		if err != nil {
			return err
		}
		defer out.Close()
		for {
			f, err := out.Next()
			if err != nil {
				return err
			}
			if exit, ok := f.(*execspec.Exit); ok {
				if exit.ExitCode == nil || *exit.ExitCode != 0 {
					return fmt.Errorf("true exited %v", exit.ExitCode)
				}
				return c.Delete(wctx, id)
			}
		}
	}
	if err := run(); err != nil {
		return samples{}, fmt.Errorf("warming sandboxd up: %w", err)
	}
	var s samples
	for range n {
		start := time.Now()
		err := run()
		s.add(time.Since(start), err)
	}
	return s, nil
}

// natsSamples times n requests to an echo responder on the bench's server, each on a
// connection of its own: the floor of a hop through NATS in the bench's process.
func (b *bench) natsSamples(n int) (samples, error) {
	url := b.pipe.common.NATSURL
	resp, err := nats.Connect(url, nats.Name("kubeclip-bench-echo"))
	if err != nil {
		return samples{}, fmt.Errorf("connecting the echo responder: %w", err)
	}
	defer resp.Close()
	const subject = "kubeclip-bench.echo"
	if _, err := resp.Subscribe(subject, func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		return samples{}, fmt.Errorf("subscribing the echo responder: %w", err)
	}
	if err := resp.Flush(); err != nil {
		return samples{}, err
	}
	req, err := nats.Connect(url, nats.Name("kubeclip-bench-echo-client"))
	if err != nil {
		return samples{}, fmt.Errorf("connecting the echo client: %w", err)
	}
	defer req.Close()
	var s samples
	for i := range n + 1 {
		start := time.Now()
		_, err := req.Request(subject, []byte("true"), b.s.waitTimeout)
		if i > 0 { // the first is the warm-up
			s.add(time.Since(start), err)
		}
	}
	return s, nil
}

// cpuThrottle is a container's CFS quota accounting (cgroup v1 cpu.stat, or v2's).
type cpuThrottle struct {
	periods, throttled uint64
	throttledTime      time.Duration
	ok                 bool
}

// readThrottle reads the CPU throttling of the pod's agent container from its cgroup, when the
// bench runs on the pod's node (the local cluster); ok is false anywhere else.
func (b *bench) readThrottle(ctx context.Context, l podLease) cpuThrottle {
	pod, err := b.raw.cs.CoreV1().Pods(l.namespace).Get(ctx, l.ProviderLeaseID, metav1.GetOptions{})
	if err != nil {
		return cpuThrottle{}
	}
	var id string
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name == execsvc.DefaultContainer {
			_, id, _ = strings.Cut(st.ContainerID, "://")
		}
	}
	if id == "" {
		return cpuThrottle{}
	}
	paths, _ := filepath.Glob("/sys/fs/cgroup/cpu*/*/" + id + "/cpu.stat")
	if len(paths) == 0 {
		return cpuThrottle{}
	}
	data, err := os.ReadFile(paths[0])
	if err != nil {
		return cpuThrottle{}
	}
	return parseCPUStat(string(data))
}

// parseCPUStat reads a cgroup's cpu.stat: v1 counts throttled_time in nanoseconds, v2
// throttled_usec in microseconds.
func parseCPUStat(data string) cpuThrottle {
	t := cpuThrottle{ok: true}
	for line := range strings.Lines(data) {
		k, v, _ := strings.Cut(strings.TrimSpace(line), " ")
		n, _ := strconv.ParseUint(v, 10, 64)
		switch k {
		case "nr_periods":
			t.periods = n
		case "nr_throttled":
			t.throttled = n
		case "throttled_time":
			t.throttledTime = time.Duration(n)
		case "throttled_usec":
			t.throttledTime = time.Duration(n) * time.Microsecond
		}
	}
	return t
}

// since describes the throttling between two readings.
func (t cpuThrottle) since(from cpuThrottle) string {
	if !t.ok || !from.ok {
		return "pod CPU throttling not readable (the bench is not on the pod's node)"
	}
	return fmt.Sprintf("pod CPU quota: throttled in %d of %d periods, %.1f ms in all",
		t.throttled-from.throttled, t.periods-from.periods, msf(t.throttledTime-from.throttledTime))
}

// gcReading is the bench process's garbage collector's count and pause total.
type gcReading struct {
	num   uint32
	pause time.Duration
}

func readGC() gcReading {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return gcReading{num: m.NumGC, pause: time.Duration(m.PauseTotalNs)}
}

// since describes the collections between two readings, with the longest pause.
func (g gcReading) since(from gcReading) string {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	var longest time.Duration
	for i := from.num; i < g.num && g.num-i <= uint32(len(m.PauseNs)); i++ {
		longest = max(longest, time.Duration(m.PauseNs[(i+1+255)%256]))
	}
	return fmt.Sprintf("bench process GC: %d collections, pauses %.2f ms in all, longest %.2f ms",
		g.num-from.num, msf(g.pause-from.pause), msf(longest))
}
