package main

// The exec phases (docs/exec.md), kept apart from the others:
//
//	(i) round trip of `true` in a pod lease: NATS + exec-worker + sandboxd over the daemon route,
//	    the same over the kube-exec route, and a raw client-go exec (WebSocket) of `true` in the
//	    same pod's agent container
//	(j) sustained execs/s, short polls on several leases at once (as Paperclip's bridge polls),
//	    daemon route, vs raw client-go execs at the same concurrency
//
// Hook (wired in bench.go and pipeline.go): a `sandboxKey []byte` on bench set with
// newSandboxKey() before startPipeline, given to the dispatcher as dispatch.Options.SandboxKey
// (exec-capable leases need it); `phases = append(phases, b.execPhases(b.sandboxKey)...)` in
// measure; and the letters i and j accepted by --phases.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execclient"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/k8s"
)

const (
	phaseExecRoundTrip  = "(i) exec round trip"
	phaseExecThroughput = "(j) exec throughput"
	// sandboxImage is the local cluster's Paperclip sandbox (hack/cluster/sandbox-image.sh).
	sandboxImage = "kubeclip.local/sandbox:dev"
	// execRoundTrips is the samples per route: enough for a p99 that is not the maximum.
	execRoundTrips = 300
	// execLeases × execPollers run execs at once for execThroughputWindow in (j): four
	// leases with four polls in flight each, Paperclip's load of four agents' bridge polls.
	execLeases           = 4
	execPollers          = 4
	execThroughputWindow = 20 * time.Second
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

// execPhases are (i) and (j); sandboxKey is the one the bench's dispatcher holds.
func (b *bench) execPhases(sandboxKey []byte) []phase {
	return []phase{
		{phaseExecRoundTrip, func(ctx context.Context, rep *report) error { return b.execRoundTripPhase(ctx, rep, sandboxKey) }},
		{phaseExecThroughput, func(ctx context.Context, rep *report) error { return b.execThroughputPhase(ctx, rep, sandboxKey) }},
	}
}

func (b *bench) execRoundTripPhase(ctx context.Context, rep *report, key []byte) error {
	leases, err := b.podLeases(ctx, 1)
	if err != nil {
		return err
	}
	l := leases[0]
	kube, err := newExecKube(b.s.kubeconfig)
	if err != nil {
		return err
	}
	// The raw side first, while no exec-worker runs: the same pod, the same command.
	if err := kube.waitReady(ctx, b.s.waitTimeout, l); err != nil {
		return err
	}
	var raw samples
	for range execRoundTrips {
		start := time.Now()
		err := kube.exec(ctx, l.namespace, l.ProviderLeaseID, []string{"true"})
		raw.add(time.Since(start), err)
	}
	for _, route := range []string{execsvc.RouteDaemon, execsvc.RouteKubeExec} {
		stop, err := b.startExecWorkers(ctx, route, key, 1)
		if err != nil {
			return err
		}
		pipe, err := b.execSamples(ctx, l.Lease, execRoundTrips)
		if stopErr := stop(); stopErr != nil {
			err = errors.Join(err, stopErr)
		}
		if err != nil {
			return err
		}
		metric := phaseExecRoundTrip + ", `true`, " + route + " route"
		if route == execsvc.RouteKubeExec {
			metric = "(i') exec round trip, `true`, kube-exec route"
		}
		rep.add(latencyRow(metric, pipe, raw, "client-go WebSocket exec of `true` in the same pod", "", nil))
	}
	return nil
}

// execSamples runs `true` n times, one after the other, after a warm-up.
func (b *bench) execSamples(ctx context.Context, l execclient.Lease, n int) (samples, error) {
	c, err := b.execClient(ctx)
	if err != nil {
		return samples{}, err
	}
	if _, err := b.execTrue(ctx, c, l); err != nil { // warm: connections, the lease's client
		return samples{}, fmt.Errorf("warming exec up: %w", err)
	}
	var s samples
	for range n {
		d, err := b.execTrue(ctx, c, l)
		s.add(d, err)
	}
	return s, nil
}

// execTrue runs `true` and returns how long it took from the request to the exit.
func (b *bench) execTrue(ctx context.Context, c *execclient.Client, l execclient.Lease) (time.Duration, error) {
	wctx, cancel := b.waitCtx(ctx)
	defer cancel()
	start := time.Now()
	res, err := c.Run(wctx, execclient.Exec{Lease: l, Command: "true", Timeout: time.Minute})
	if err == nil && (res.ExitCode == nil || *res.ExitCode != 0) {
		err = fmt.Errorf("true exited %v", res.ExitCode)
	}
	return time.Since(start), err
}

func (b *bench) execThroughputPhase(ctx context.Context, rep *report, key []byte) error {
	leases, err := b.podLeases(ctx, execLeases)
	if err != nil {
		return err
	}
	kube, err := newExecKube(b.s.kubeconfig)
	if err != nil {
		return err
	}
	for _, l := range leases {
		if err := kube.waitReady(ctx, b.s.waitTimeout, l); err != nil {
			return err
		}
	}
	poll := []string{"sh", "-c", "for f in /workspace/*; do :; done"}
	rawRate, rawErrs := sustain(ctx, len(leases)*execPollers, func(ctx context.Context, i int) error {
		l := leases[i%len(leases)]
		return kube.exec(ctx, l.namespace, l.ProviderLeaseID, poll)
	})
	stop, err := b.startExecWorkers(ctx, execsvc.RouteDaemon, key, 2)
	if err != nil {
		return err
	}
	defer func() { _ = stop() }()
	c, err := b.execClient(ctx)
	if err != nil {
		return err
	}
	for _, l := range leases {
		if _, err := b.execTrue(ctx, c, l.Lease); err != nil {
			return fmt.Errorf("warming exec up: %w", err)
		}
	}
	rate, errs := sustain(ctx, len(leases)*execPollers, func(ctx context.Context, i int) error {
		x := execclient.Exec{Lease: leases[i%len(leases)].Lease, Command: poll[0], Args: poll[1:], Timeout: time.Minute}
		res, err := c.Run(ctx, x)
		if err == nil && (res.ExitCode == nil || *res.ExitCode != 0) {
			err = fmt.Errorf("poll exited %v", res.ExitCode)
		}
		return err
	})
	rep.add(row{
		Metric: fmt.Sprintf("%s (%d leases × %d polls in flight, daemon route, 2 exec-workers)", phaseExecThroughput, len(leases), execPollers),
		N:      int(rate * execThroughputWindow.Seconds()), Unit: "exec/s", P50: &rate, RawP50: &rawRate, Ratio: ratio(rate, rawRate),
		Raw: "client-go WebSocket execs at the same concurrency", Errors: errs + rawErrs,
	})
	return nil
}

// sustain runs fn from n goroutines for execThroughputWindow and returns the completed calls per
// second and the failed ones.
func sustain(ctx context.Context, n int, fn func(ctx context.Context, i int) error) (float64, int) {
	ctx, cancel := context.WithTimeout(ctx, execThroughputWindow)
	defer cancel()
	var done, failed atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			for ctx.Err() == nil {
				if err := fn(ctx, i); err != nil {
					if ctx.Err() == nil {
						failed.Add(1)
					}
					continue
				}
				done.Add(1)
			}
		})
	}
	wg.Wait()
	rate := float64(done.Load()) / time.Since(start).Seconds()
	return float64(int(rate*10)) / 10, int(failed.Load())
}

// podLease is a ready pod lease of the bench.
type podLease struct {
	execclient.Lease
	namespace string
}

// podLeases acquires n pod leases on the sandbox image, each for a fresh company, and waits for
// their created events (exec waits for their pods itself).
func (b *bench) podLeases(ctx context.Context, n int) ([]podLease, error) {
	var out []podLease
	for range n {
		company := newID("co-")
		req := b.request(company, nil)
		req.Config = podConfig()
		if _, err := b.pub.Publish(ctx, req); err != nil {
			return nil, fmt.Errorf("publishing a pod lease's acquire: %w", err)
		}
		wctx, cancel := b.waitCtx(ctx)
		_, err := b.events.created(wctx, req.RunID)
		cancel()
		if err != nil {
			return nil, err
		}
		if err := b.labelTenants(ctx, company); err != nil {
			return nil, err
		}
		ns, err := b.tenantNamespace(company)
		if err != nil {
			return nil, err
		}
		lease, err := b.leaseOf(ctx, company, req.RunID)
		if err != nil {
			return nil, err
		}
		out = append(out, podLease{Lease: execclient.Lease{CompanyID: company, RunID: req.RunID, ProviderLeaseID: lease}, namespace: ns})
	}
	return out, nil
}

// execClient is an exec client on a connection of the bench's own.
func (b *bench) execClient(ctx context.Context) (*execclient.Client, error) {
	js, err := b.pipe.jetStream(ctx, "bench-exec", zerolog.Nop())
	if err != nil {
		return nil, err
	}
	return execclient.New(execclient.Options{NATS: js.Conn(), Subjects: b.subjects})
}

// leaseOf reads the run's providerLeaseId from its created event.
func (b *bench) leaseOf(ctx context.Context, companyID, runID string) (string, error) {
	js, err := b.pipe.jetStream(ctx, "bench-exec", zerolog.Nop())
	if err != nil {
		return "", err
	}
	subj, err := b.subjects.Run(companyID, runID, events.KindCreated)
	if err != nil {
		return "", err
	}
	stream, err := js.Stream(ctx, b.subjects.RunStream())
	if err != nil {
		return "", err
	}
	msg, err := stream.GetLastMsgForSubject(ctx, subj)
	if err != nil {
		return "", fmt.Errorf("reading run %s's created event: %w", runID, err)
	}
	var created events.RunCreatedEvent
	if err := json.Unmarshal(msg.Data, &created); err != nil {
		return "", err
	}
	return created.ProviderLeaseID, nil
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

// startExecWorkers runs n exec-workers on route in the bench's process, each with its own NATS
// connection and Kubernetes clients, as the binary wires them; stop stops them.
func (b *bench) startExecWorkers(ctx context.Context, route string, key []byte, n int) (stop func() error, err error) {
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
		svc, err := execsvc.New(execsvc.Options{NATS: nc, JetStream: js, Subjects: b.subjects, Pods: pods, Route: r, MasterKey: key, Replica: name, Logger: log})
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

// waitReady execs `true` in the lease's pod until it succeeds (the pod is starting) or timeout
// passes.
func (k *execKube) waitReady(ctx context.Context, timeout time.Duration, l podLease) error {
	deadline := time.Now().Add(timeout)
	for {
		err := k.exec(ctx, l.namespace, l.ProviderLeaseID, []string{"true"})
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the pod of lease %s did not take an exec within %s: %w", l.ProviderLeaseID, timeout, err)
		}
		if err := sleep(ctx, 250*time.Millisecond); err != nil {
			return err
		}
	}
}

// exec runs command in the agent container of pod and waits for it; a non-zero exit is an error.
func (k *execKube) exec(ctx context.Context, namespace, pod string, command []string) error {
	url := k.cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(namespace).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: execsvc.DefaultContainer, Command: command, Stdout: true, Stderr: true}, scheme.ParameterCodec).URL()
	ex, err := remotecommand.NewWebSocketExecutor(k.cfg, "GET", url.String())
	if err != nil {
		return err
	}
	var out strings.Builder
	return ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &out, Stderr: &out})
}
