package main

// The exec phases (docs/exec.md), kept apart from the others: issue 9's benchmark.
//
//	(i) round trip of `true` in a pod lease: NATS + exec-worker + sandboxd over the daemon route,
//	    the same over the kube-exec route, and a raw client-go exec (WebSocket) of `true` in the
//	    same pod's agent container
//	(j) sustained execs/s with many pod leases polled like Paperclip's bridge, at its cadence
//	    and saturating, both routes, and the API server's CPU meanwhile (phases_execload.go)
//	(k) acquire → ready to exec, cold tenant, vs a raw pod create → Ready (phases_execready.go)
//	(l) stdin and stdout throughput (phases_execstream.go)
//	(m) native sync in and out vs the host's base64 route (phases_sync.go)
//
// The exec-workers run in the bench's process, each with its own NATS connection and
// Kubernetes clients, as the binary wires them; the raw side is the bench's own client-go exec.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/inbox"
	"github.com/kubeclip/kubeclip/pkg/k8s"
)

const (
	phaseExecRoundTrip = "(i) exec round trip"
	// sandboxImage is the local cluster's Paperclip sandbox (hack/cluster/sandbox-image.sh).
	sandboxImage = "kubeclip.local/sandbox:dev"
	// execRoundTrips is the samples per route: enough for a p99 that is not the maximum.
	execRoundTrips = 300
)

// newSandboxKey is the bench installation's sandbox master key, for its dispatcher and its
// exec-workers.
func newSandboxKey() ([]byte, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("making the sandbox key: %w", err)
	}
	return key, nil
}

// execPhases are (i) to (m); sandboxKey is the one the bench's dispatcher holds.
func (b *bench) execPhases(sandboxKey []byte) []phase {
	return []phase{
		{phaseExecRoundTrip, func(ctx context.Context, rep *report) error { return b.execRoundTripPhase(ctx, rep, sandboxKey) }},
		{phaseExecLoad, func(ctx context.Context, rep *report) error { return b.execLoadPhase(ctx, rep, sandboxKey) }},
		{phaseExecReady, func(ctx context.Context, rep *report) error { return b.execReadyPhase(ctx, rep, sandboxKey) }},
		{phaseExecStream, func(ctx context.Context, rep *report) error { return b.execStreamPhase(ctx, rep, sandboxKey) }},
		{phaseSync, func(ctx context.Context, rep *report) error { return b.syncPhase(ctx, rep, sandboxKey) }},
	}
}

func (b *bench) execRoundTripPhase(ctx context.Context, rep *report, key []byte) (err error) {
	// The pod's CPU quota is the tenant's, and the execs, back to back, use about half a core
	// in it (phases_exectrace.go reports its throttling): --exec-cpu-limit sets it.
	leases, err := b.acquirePodLeasesWith(ctx, 1, podConfigWithCPULimit(b.s.execCPULimit))
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, b.releasePodLeases(ctx, leases)) }()
	l := leases[0]
	kube, err := newExecKube(b.s.kubeconfig)
	if err != nil {
		return err
	}
	// The raw side first, while no exec-worker runs: the same pod, the same command.
	if err := kube.run(ctx, l, []string{"true"}, nil, io.Discard); err != nil {
		return fmt.Errorf("warming the raw exec up: %w", err)
	}
	var raw samples
	for range execRoundTrips {
		start := time.Now()
		err := kube.run(ctx, l, []string{"true"}, nil, io.Discard)
		raw.add(time.Since(start), err)
	}
	// The primitives under the daemon route, in the same run: sandboxd called directly, and a
	// hop through NATS in the bench's process.
	direct, err := b.sandboxdSamples(ctx, l, key, execRoundTrips)
	if err != nil {
		return err
	}
	echo, err := b.natsSamples(execRoundTrips)
	if err != nil {
		return err
	}
	rep.add(latencyRow("(i'') sandboxd called directly, `true` (POST start, output to the exit frame, DELETE)", direct, samples{}, "", "", nil))
	rep.add(latencyRow("(i''') NATS request → reply, an echo responder on the bench's server", echo, samples{}, "", "", nil))
	for _, route := range []string{execsvc.RouteDaemon, execsvc.RouteKubeExec} {
		obs := &execObserver{}
		stop, err := b.startObservedExecWorkers(ctx, route, key, 1, obs)
		if err != nil {
			return err
		}
		throttleBefore, gcBefore := b.readThrottle(ctx, l), readGC()
		pipe, trace, err := b.tracedSamples(ctx, l.Lease, execRoundTrips, obs)
		throttleAfter, gcAfter := b.readThrottle(ctx, l), readGC()
		if stopErr := stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		if err != nil {
			return err
		}
		rep.Breakdown = append(rep.Breakdown, trace.stages(phaseExecRoundTrip, route)...)
		rep.note("(i) %s route: %s; %s; the %d slowest execs, total = publish→handler + handler→answered + answered→started + started→exit (ms): %s",
			route, throttleAfter.since(throttleBefore), gcAfter.since(gcBefore), slowestTraced, trace.slowest(slowestTraced))
		const rawWhat = "client-go WebSocket exec of `true` in the same pod (the Kubernetes exec API)"
		if route == execsvc.RouteKubeExec {
			rep.add(latencyRow("(i') exec round trip, `true`, kube-exec route", pipe, raw, rawWhat, "", nil))
			continue
		}
		rep.add(latencyRow(phaseExecRoundTrip+", `true`, daemon route", pipe, raw, rawWhat,
			"p50 ≤ 5 ms (aim 3) and ≥ 10× faster than raw",
			func(p50, _, rawP50 float64) bool { return p50 <= 5 && rawP50 >= 10*p50 }))
	}
	return nil
}

// execTrue runs `true` and returns how long it took from the request to the exit.
func (b *bench) execTrue(ctx context.Context, c *execclient.Client, l execclient.Lease) (time.Duration, error) {
	wctx, cancel := b.waitCtx(ctx)
	defer cancel()
	start := time.Now()
	res, err := c.Run(wctx, execclient.Exec{Lease: l, Command: "true", Timeout: time.Minute})
	return time.Since(start), exitErr("true", res, err)
}

// exitErr is err, or an error when the command did not exit 0.
func exitErr(what string, res execclient.Result, err error) error {
	if err == nil && (res.ExitCode == nil || *res.ExitCode != 0) {
		err = fmt.Errorf("%s exited %v (signal %v, timed out %t)", what, res.ExitCode, res.Signal, res.TimedOut)
	}
	return err
}

// podLease is a pod lease of the bench whose pod is ready.
type podLease struct {
	execclient.Lease
	namespace string
}

// acquirePodLeases publishes n acquires of pod leases on the sandbox image at once, each for a
// fresh company (as n Paperclip agents would), and waits until every lease's pod is ready
// (the run's status Running/Ready event).
func (b *bench) acquirePodLeases(ctx context.Context, n int) ([]podLease, error) {
	return b.acquirePodLeasesWith(ctx, n, podConfig())
}

// acquirePodLeasesWith is acquirePodLeases with the leases' provider config.
func (b *bench) acquirePodLeasesWith(ctx context.Context, n int, config json.RawMessage) ([]podLease, error) {
	reqs := make([]events.AcquireRequest, n)
	for i := range reqs {
		reqs[i] = b.request(newID("co-"), nil)
		reqs[i].Config = config
		if _, err := b.pub.Publish(ctx, reqs[i]); err != nil {
			return nil, fmt.Errorf("publishing a pod lease's acquire: %w", err)
		}
	}
	// The node starts the pods one after another: give each a couple of seconds.
	wctx, cancel := context.WithTimeout(ctx, b.s.waitTimeout+time.Duration(n)*2*time.Second)
	defer cancel()
	out := make([]podLease, n)
	for i, req := range reqs {
		ev, err := b.events.createdEvent(wctx, req.RunID)
		if err != nil {
			return nil, err
		}
		if err := b.labelTenants(ctx, req.CompanyID); err != nil {
			return nil, err
		}
		out[i] = podLease{Lease: execclient.Lease{CompanyID: req.CompanyID, RunID: req.RunID, ProviderLeaseID: ev.lease}, namespace: ev.namespace}
	}
	for _, req := range reqs {
		if _, err := b.events.ready(wctx, req.RunID); err != nil {
			return nil, fmt.Errorf("pod lease of run %s not ready: %w", req.RunID, err)
		}
	}
	return out, nil
}

// releasePodLeases destroys the leases (cancelling whatever runs in them) and waits for their
// released events: their pods are gone then, and their CPU is free for the next phase.
func (b *bench) releasePodLeases(ctx context.Context, leases []podLease) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.s.cleanupTimeout)
	defer cancel()
	var errs []error
	for _, l := range leases {
		req := events.ReleaseRequest{RunID: l.RunID, CompanyID: l.CompanyID, ProviderLeaseID: l.ProviderLeaseID, CancelActiveWork: true, Destroy: true}
		if _, err := b.pub.Publish(ctx, req); err != nil {
			errs = append(errs, fmt.Errorf("publishing the destroy of lease %s: %w", l.ProviderLeaseID, err))
		}
	}
	for _, l := range leases {
		if err := b.events.released(ctx, l.RunID); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// execClient is an exec client on a connection of the bench's own.
func (b *bench) execClient(ctx context.Context) (*execclient.Client, error) {
	// Connected as the CLI is, with a client inbox prefix: the exec-workers answer into
	// nothing else (pkg/inbox), and the pipeline's connections use the workers' prefix.
	nc, err := nats.Connect(b.pipe.common.NATSURL, nats.Name("kubeclip-bench-exec"), nats.CustomInboxPrefix(inbox.CLIPrefix))
	if err != nil {
		return nil, fmt.Errorf("connecting the exec client: %w", err)
	}
	b.pipe.mu.Lock()
	b.pipe.conns = append(b.pipe.conns, nc)
	b.pipe.mu.Unlock()
	return execclient.New(execclient.Options{NATS: nc, Subjects: b.subjects})
}

// podConfig is the bench's provider config with backend pod on the sandbox image.
func podConfig() json.RawMessage {
	var cfg map[string]any
	_ = json.Unmarshal(providerConfig(nil), &cfg)
	cfg["backend"] = "pod"
	cfg["podActivityDeadlineSec"] = 1800
	cfg["adapters"].([]any)[0].(map[string]any)["runtimeImage"] = sandboxImage
	data, _ := json.Marshal(cfg)
	return data
}

// podConfigWithCPULimit is podConfig with the pod's CPU limit (a quantity) in place of the
// bench's 500m.
func podConfigWithCPULimit(limit string) json.RawMessage {
	var cfg map[string]any
	_ = json.Unmarshal(podConfig(), &cfg)
	cfg["defaultResources"].(map[string]any)["limits"].(map[string]any)["cpu"] = limit
	data, _ := json.Marshal(cfg)
	return data
}

// startExecWorkers runs n exec-workers on route in the bench's process, each with its own NATS
// connection and Kubernetes clients, as the binary wires them; stop stops them.
func (b *bench) startExecWorkers(ctx context.Context, route string, key []byte, n int) (stop func() error, err error) {
	return b.startObservedExecWorkers(ctx, route, key, n, nil)
}

// startObservedExecWorkers is startExecWorkers with the workers telling obs (nil: nothing).
func (b *bench) startObservedExecWorkers(ctx context.Context, route string, key []byte, n int, obs execsvc.Observer) (stop func() error, err error) {
	type running struct {
		cancel context.CancelFunc
		done   chan error
	}
	var all []running
	stop = func() error {
		var errs []error
		for _, r := range all {
			r.cancel()
			if err := <-r.done; err != nil && !errors.Is(err, context.Canceled) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	for i := range n {
		name := fmt.Sprintf("exec-worker-%s-%d", route, i+1)
		kube, nc, js, log, err := b.pipe.connect(ctx, name)
		if err != nil {
			return stop, errors.Join(err, stop())
		}
		pods, err := execsvc.NewPodWatcher(execsvc.PodWatcherOptions{Clientset: kube.Clientset, Logger: log})
		if err != nil {
			return stop, errors.Join(err, stop())
		}
		var r execsvc.Route = execsvc.DaemonRoute{}
		if route == execsvc.RouteKubeExec {
			r = &execsvc.KubeExecRoute{Config: kube.Config, Clientset: kube.Clientset}
		}
		svc, err := execsvc.New(execsvc.Options{NATS: nc, JetStream: js, Subjects: b.subjects, Pods: pods, Route: r, MasterKey: key, Replica: name, Logger: log, Observer: obs,
			Replies: inbox.MustRule(inbox.DefaultClientPrefixes()...)})
		if err != nil {
			return stop, errors.Join(err, stop())
		}
		runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan error, 1)
		go func() {
			watched := make(chan error, 1)
			go func() { watched <- pods.Run(runCtx) }()
			select {
			case <-pods.Synced():
				err = svc.Run(runCtx)
			case err = <-watched:
			}
			cancel()
			nc.Close()
			done <- err
		}()
		all = append(all, running{cancel: cancel, done: done})
		select {
		case <-svc.Ready():
		case err := <-done:
			done <- err
			return stop, errors.Join(fmt.Errorf("%s stopped: %w", name, err), stop())
		case <-ctx.Done():
			return stop, errors.Join(ctx.Err(), stop())
		}
	}
	return stop, nil
}

// execKube runs raw client-go execs, as the kube-exec route does without kubeclip.
type execKube struct {
	cfg *rest.Config
	cs  kubernetes.Interface
}

func newExecKube(kubeconfig string) (*execKube, error) {
	cfg, err := k8s.RESTConfig(kubeconfig, rawQPS, rawBurst)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &execKube{cfg: cfg, cs: cs}, nil
}

// run runs command in the agent container of l's pod and waits for it, with stdin (nil: none)
// and stdout (stderr is discarded); a non-zero exit is an error.
func (k *execKube) run(ctx context.Context, l podLease, command []string, stdin io.Reader, stdout io.Writer) error {
	opts := &corev1.PodExecOptions{Container: execsvc.DefaultContainer, Command: command, Stdin: stdin != nil, Stdout: true, Stderr: true}
	url := k.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(l.namespace).Name(l.ProviderLeaseID).SubResource("exec").
		VersionedParams(opts, scheme.ParameterCodec).URL()
	ex, err := remotecommand.NewWebSocketExecutor(k.cfg, "GET", url.String())
	if err != nil {
		return err
	}
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Stderr: io.Discard})
}
