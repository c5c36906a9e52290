package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// (j): Paperclip polls its in-sandbox bridge with a short command about every 116 ms for as long
// as an agent works (paperclip-plugin-contract.md §3.3), each agent on its own lease. The phase
// runs --poll-agents such pollers over as many pod leases (one company each) as the node can
// schedule, through each route and through raw client-go execs: first at Paperclip's cadence
// (offered vs achieved, and the polls' latency), then saturating (--poll-inflight polls in
// flight per lease, back to back), reading the API server's CPU over each window.
const (
	phaseExecLoad = "(j) exec load"
	// execLoadWorkers is the exec-workers serving (j), each with its own NATS connection.
	execLoadWorkers = 2
	// apiServerIdleWindow is how long the API server's CPU is read with the leases up and no
	// poll running, for the baseline the windows are compared with.
	apiServerIdleWindow = 5 * time.Second
	// failurePause is the least a poller waits after a failed poll.
	failurePause = 50 * time.Millisecond
)

// bridgePoll is Paperclip's bridge poll: list the bridge queue's requests. The queue is empty
// here, as it is between two of an agent's API calls, so it runs sh and nothing else.
var bridgePoll = []string{"sh", "-c", `for file in /workspace/.paperclip-runtime/bridge/queue/requests/*.json; do [ -e "$file" ] || continue; basename "$file"; done`}

// bridgePollExec is the poll as Paperclip sends it: channel bridge, the lease's cwd, the 4 h
// timeout of its bridge calls.
func bridgePollExec(l execclient.Lease) execclient.Exec {
	return execclient.Exec{
		Lease: l, Command: bridgePoll[0], Args: bridgePoll[1:], Cwd: "/workspace",
		Env: map[string]string{"PAPERCLIP_SANDBOX_EXEC_CHANNEL": "bridge"}, Timeout: 4 * time.Hour,
	}
}

// loadWindow is what one window of (j) measured.
type loadWindow struct {
	window  time.Duration
	latency samples // the completed polls' latency; failed ones in latency.errs
	cpu     windowCPU
}

// rate is the completed polls per second.
func (w loadWindow) rate() float64 {
	return float64(int(10*float64(len(w.latency.d))/w.window.Seconds())) / 10
}

// windowCPU is the API server's CPU over a window and the node's, for the rows and the notes.
type windowCPU struct {
	// apiserver is in cores; nil when it could not be read (apiErr says why).
	apiserver *float64
	apiErr    error
	node      string
}

// cpuReading is the node's and the API server's CPU time at the start of a window.
type cpuReading struct {
	node cpuUsage
	api  procCPU
}

func readWindowCPU() cpuReading { return cpuReading{node: readCPU(), api: readAPIServerCPU()} }

// until is the CPU used from r to now.
func (r cpuReading) until() windowCPU {
	end := readWindowCPU()
	return windowCPU{
		apiserver: coresUsed(r.api, end.api), apiErr: cpuErr(r.api, end.api),
		node: fmt.Sprintf("node CPU %.0f%% busy, load average %s → %s", nodeBusy(r.node, end.node), r.node.load, end.node.load),
	}
}

// drive runs n pollers for window: poller i calls poll(ctx, i), one call in flight, each
// interval after the start of its previous one (a call that overruns delays the next; none is
// sent to catch up), or back to back when interval is 0. Pollers start spread evenly over the
// first interval. Calls still running when the window ends count neither as done nor failed;
// after a failure a poller pauses failurePause.
func drive(ctx context.Context, n int, interval, window time.Duration, poll func(context.Context, int) error) loadWindow {
	start := time.Now()
	deadline := start.Add(window)
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	begin := readWindowCPU()
	ended := make(chan windowCPU, 1)
	go func() {
		<-wctx.Done()
		ended <- begin.until()
	}()
	var mu sync.Mutex
	var all samples
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			var mine samples
			next := start.Add(time.Duration(i) * interval / time.Duration(n))
			for sleep(wctx, time.Until(next)) == nil {
				sent := time.Now()
				err := poll(wctx, i)
				done := time.Now()
				if done.After(deadline) {
					break
				}
				mine.add(done.Sub(sent), err)
				next = sent.Add(interval)
				if err != nil { // a route that fails at once must not spin
					next = done.Add(max(interval, failurePause))
				}
			}
			mu.Lock()
			all.merge(mine)
			mu.Unlock()
		})
	}
	wg.Wait()
	return loadWindow{window: window, latency: all, cpu: <-ended}
}

func (b *bench) execLoadPhase(ctx context.Context, rep *report, key []byte) (err error) {
	room, perLease, err := b.podLeaseRoom(ctx)
	if err != nil {
		return err
	}
	agents := b.s.pollAgents
	n := min(agents, room)
	if n == 0 {
		return fmt.Errorf("the node has no room for a pod lease (each requests %s)", perLease)
	}
	b.logf("(j) acquiring %d pod leases at once (the node's free CPU and memory admit %d, each requests %s) for %d agents", n, room, perLease, agents)
	leases, err := b.acquirePodLeases(ctx, n)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, b.releasePodLeases(ctx, leases)) }()
	b.logf("(j) %d pod leases ready", n)
	shape := fmt.Sprintf("%d agents on %d leases", agents, n)
	if n < agents {
		rep.note("(j) %d agents share %d pod leases round-robin (one company each): the node's free allocatable resources admit no more pods requesting %s (the tenant LimitRange's minimum CPU and memory), so the offered load is %d agents' but each lease carries ~%.1f agents' polls", agents, n, perLease, agents, float64(agents)/float64(n))
	}

	begin := readWindowCPU()
	if err := sleep(ctx, apiServerIdleWindow); err != nil {
		return err
	}
	if idle := begin.until(); idle.apiserver != nil {
		rep.note("(j) API server CPU with the %d leases up and no poll running (%s): %.2f cores; %s", n, apiServerIdleWindow, *idle.apiserver, idle.node)
	} else {
		rep.note("(j) API server CPU not measured: %v", idle.apiErr)
	}

	interval, window, inflight := b.s.pollInterval, b.s.pollWindow, b.s.pollInflight
	// Each window starts on a quiet node, so none pays for the one before it (the raw exec
	// API's windows leave the API server and kubelet busy for a while). A ctx that ends also
	// ends drive, so waitQuiet's error needs no handling of its own.
	run := func(name string, poll func(context.Context, int) error) (cadence, saturating loadWindow) {
		_ = b.waitQuiet(ctx)
		b.logf("(j) %s: %s, one poll every %s each, for %s", name, shape, interval, window)
		cadence = drive(ctx, agents, interval, window, func(ctx context.Context, i int) error { return poll(ctx, i%n) })
		_ = b.waitQuiet(ctx)
		b.logf("(j) %s: saturating, %d leases × %d polls in flight, for %s", name, n, inflight, window)
		saturating = drive(ctx, n*inflight, 0, window, func(ctx context.Context, i int) error { return poll(ctx, i%n) })
		for _, w := range []struct {
			what string
			w    loadWindow
		}{{"bridge cadence", cadence}, {"saturating", saturating}} {
			rep.note("(j) %s, %s: %.1f exec/s, %d failed; %s", name, w.what, w.w.rate(), w.w.latency.errs, w.w.cpu.node)
			if w.w.latency.firstErr != nil {
				b.logf("(j) %s, %s: first failure: %v", name, w.what, w.w.latency.firstErr)
			}
		}
		return cadence, saturating
	}

	kube, err := newExecKube(b.s.kubeconfig)
	if err != nil {
		return err
	}
	for _, l := range leases { // warm: the raw client's connections
		if err := kube.run(ctx, l, []string{"true"}, nil, io.Discard); err != nil {
			return fmt.Errorf("warming the raw exec up: %w", err)
		}
	}
	rawCadence, rawSat := run("raw client-go exec", func(ctx context.Context, i int) error {
		return kube.run(ctx, leases[i], bridgePoll, nil, io.Discard)
	})

	offered := float64(agents) / interval.Seconds()
	for _, route := range []string{execsvc.RouteDaemon, execsvc.RouteKubeExec} {
		stop, err := b.startExecWorkers(ctx, route, key, execLoadWorkers)
		if err != nil {
			return err
		}
		cadence, saturating, err := b.routeLoad(ctx, leases, run, route)
		if stopErr := stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		if err != nil {
			return err
		}
		label := "(j)"
		if route == execsvc.RouteKubeExec {
			label = "(j')"
		}
		pre := fmt.Sprintf("%s %s route, %d exec-workers", label, route, execLoadWorkers)
		rawWhat := "raw client-go WebSocket execs of the same poll, same pollers and leases"
		rep.add(
			rateRow(fmt.Sprintf("%s: bridge polls, %s, offered %.0f exec/s", pre, shape, offered), cadence, rawCadence, rawWhat, "", nil),
			latencyRow(fmt.Sprintf("%s: bridge polls, %s, latency", pre, shape), cadence.latency, rawCadence.latency, rawWhat, "", nil),
		)
		satRow := rateRow(fmt.Sprintf("%s: saturating, %d leases × %d in flight", pre, n, inflight), saturating, rawSat, rawWhat, "", nil)
		if route == execsvc.RouteDaemon {
			satRow = rateRow(satRow.Metric, saturating, rawSat, rawWhat, "≥ 500 exec/s", func(rate float64) bool { return rate >= 500 })
		}
		rep.add(satRow,
			cpuRow(fmt.Sprintf("%s: API server CPU, bridge polls", pre), cadence, rawCadence),
			cpuRow(fmt.Sprintf("%s: API server CPU, saturating", pre), saturating, rawSat),
		)
	}
	return nil
}

// routeLoad runs run's windows through the exec service on route, after one poll per lease to
// warm every lease's connections.
func (b *bench) routeLoad(ctx context.Context, leases []podLease, run func(string, func(context.Context, int) error) (loadWindow, loadWindow), route string) (loadWindow, loadWindow, error) {
	c, err := b.execClient(ctx)
	if err != nil {
		return loadWindow{}, loadWindow{}, err
	}
	poll := func(ctx context.Context, i int) error {
		res, err := c.Run(ctx, bridgePollExec(leases[i].Lease))
		return exitErr("the bridge poll", res, err)
	}
	for i := range leases {
		if err := poll(ctx, i); err != nil {
			return loadWindow{}, loadWindow{}, fmt.Errorf("warming exec up: %w", err)
		}
	}
	cadence, saturating := run(route+" route", poll)
	return cadence, saturating, nil
}

// rateRow is a throughput row: completed polls per second, both sides.
func rateRow(metric string, w, raw loadWindow, rawWhat, target string, met func(rate float64) bool) row {
	rate, rawRate := w.rate(), raw.rate()
	r := row{
		Metric: metric, N: len(w.latency.d), Unit: "exec/s", P50: &rate,
		RawN: len(raw.latency.d), RawP50: &rawRate, Ratio: ratio(rate, rawRate),
		Raw: rawWhat, Target: target, Errors: w.latency.errs + raw.latency.errs,
	}
	if met != nil {
		ok := met(rate)
		r.Met = &ok
	}
	return r
}

// cpuRow is the API server's CPU over a window, next to the raw window's.
func cpuRow(metric string, w, raw loadWindow) row {
	r := row{Metric: metric, Unit: "cores", P50: w.cpu.apiserver, RawP50: raw.cpu.apiserver, Raw: apiServerHow + "; raw: during the raw client-go window"}
	if r.P50 != nil && r.RawP50 != nil {
		r.Ratio = ratio(*r.P50, *r.RawP50)
	}
	return r
}

// podLeaseRoom is how many more pod leases the cluster's nodes can schedule: their allocatable
// CPU, memory and pods less what the pods bound to them request, over what one lease's pod
// requests (rendered from podConfig as the dispatcher renders it).
func (b *bench) podLeaseRoom(ctx context.Context) (int, string, error) {
	req := b.request(newID("room-"), nil)
	req.Config = podConfig()
	plan, err := lease.New(req, time.Now(), benchOperator())
	if err != nil {
		return 0, "", fmt.Errorf("planning a pod lease: %w", err)
	}
	need := podRequests(policy.RenderPod(plan.RunSpec(policy.WorkloadName(ulid.Make()))))
	nodes, err := b.raw.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, "", fmt.Errorf("listing nodes: %w", err)
	}
	pods, err := b.raw.cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "status.phase!=Succeeded,status.phase!=Failed"})
	if err != nil {
		return 0, "", fmt.Errorf("listing pods: %w", err)
	}
	used, bound := map[string]corev1.ResourceList{}, map[string]int64{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.Spec.NodeName == "" {
			continue
		}
		if used[p.Spec.NodeName] == nil {
			used[p.Spec.NodeName] = corev1.ResourceList{}
		}
		addResources(used[p.Spec.NodeName], podRequests(p))
		bound[p.Spec.NodeName]++
	}
	room := int64(0)
	for _, node := range nodes.Items {
		if node.Spec.Unschedulable {
			continue
		}
		fits := node.Status.Allocatable.Pods().Value() - bound[node.Name]
		for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			q := need[name]
			if q.IsZero() {
				continue
			}
			free := node.Status.Allocatable[name].DeepCopy()
			free.Sub(used[node.Name][name])
			fits = min(fits, free.MilliValue()/q.MilliValue())
		}
		room += max(0, fits)
	}
	return int(room), fmt.Sprintf("%s CPU and %s memory", need.Cpu(), need.Memory()), nil
}

// podRequests is what the scheduler counts for pod: the larger of its containers' sum and its
// largest init container, plus its overhead.
func podRequests(pod *corev1.Pod) corev1.ResourceList {
	sum := corev1.ResourceList{}
	for _, c := range pod.Spec.Containers {
		addResources(sum, c.Resources.Requests)
	}
	for _, c := range pod.Spec.InitContainers {
		for name, q := range c.Resources.Requests {
			if cur, ok := sum[name]; !ok || q.Cmp(cur) > 0 {
				sum[name] = q.DeepCopy()
			}
		}
	}
	addResources(sum, pod.Spec.Overhead)
	return sum
}

func addResources(to, add corev1.ResourceList) {
	for name, q := range add {
		cur := to[name]
		cur.Add(q)
		to[name] = cur
	}
}
