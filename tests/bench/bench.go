package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// stubImage is the agent stub `make cluster-up` builds and imports.
const stubImage = "kubeclip.local/agent-stub:dev"

// The phases, in the order they run: (c) measures the runs of (a), (b) and (d) once they are
// over; (g) and (h) need a quiet node too; the bursts go after them because the pods they leave
// behind would load the node for minutes (each burst ends its runs once measured, and every
// phase starts once the node is clear of the ones before: settle).
const (
	phaseSetup    = "setup"
	phaseWarm     = "(a) warm acquire"
	phaseCold     = "(b) cold acquire"
	phaseLogs     = "(d) log lines"
	phaseResults  = "(c) results"
	phaseTakeover = "(g) takeover"
	phaseReplay   = "(h) replay"
	phaseBurst    = "(e) burst"
)

// phase is one step of measure.
type phase struct {
	name string
	run  func(context.Context, *report) error
}

// bench holds everything a measurement needs. It is built by newBench and torn down by close.
type bench struct {
	s        settings
	session  string
	progress io.Writer

	pipe     *pipeline
	stats    *opStats
	raw      *rawKube
	pub      *events.Publisher
	subjects events.Subjects
	policy   policy.Config

	stopWatching context.CancelFunc
	events       *collector
	pods         *podWatch

	// Set up by setup.
	warmCompany    string
	rawWarmCompany string
	// published is when the bench started publishing each run's acquire.
	published map[string]time.Time
	// ended are the published runs settle has seen end.
	ended map[string]bool
	// The runs of each phase; (c) measures the results of (a), (b) and (d).
	warmRuns, coldRuns, logRuns, burstRuns []string
	// finalLogReads is (c'): each of those runs' agent log read once by (a), (b) and (d) at
	// their end, before the next phase's settle deletes their pods.
	finalLogReads samples

	// Set by (e): the raw burst's creates/s.
	rawBurstRate float64
	// replicaBursts are (f)'s bursts, by dispatcher count.
	replicaBursts map[int][]burstResult
	// sandboxKey is the installation's sandbox master key (phases_exec.go).
	sandboxKey []byte
}

// newBench starts the pipeline, the bench's own event consumer and pod informer.
func newBench(ctx context.Context, s settings, stderr io.Writer) (b *bench, err error) {
	b = &bench{
		s: s, session: newID(""), progress: stderr, stats: newOpStats(),
		published: map[string]time.Time{}, ended: map[string]bool{}, replicaBursts: map[int][]burstResult{},
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, b.close(ctx))
		}
	}()
	if b.policy, err = policy.ParseConfig(providerConfig(nil)); err != nil {
		return b, fmt.Errorf("the bench's provider config: %w", err)
	}
	if b.raw, err = newRawKube(s.kubeconfig); err != nil {
		return b, err
	}
	if b.sandboxKey, err = newSandboxKey(); err != nil {
		return b, err
	}
	b.logf("starting the pipeline (embedded JetStream, tenant-worker, dispatcher, run-watcher)")
	if b.pipe, err = startPipeline(ctx, s.kubeconfig, s.workerLog, b.stats, b.sandboxKey, s.sandboxdImage); err != nil {
		return b, err
	}
	js, err := b.pipe.jetStream(ctx, "bench", zerolog.Nop())
	if err != nil {
		return b, err
	}
	if b.subjects, err = b.pipe.common.Subjects(); err != nil {
		return b, err
	}
	if b.pub, err = events.NewPublisher(events.PublisherOptions{JS: js, Subjects: b.subjects}); err != nil {
		return b, err
	}
	watchCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	b.stopWatching = cancel
	if b.events, err = startCollector(watchCtx, js, b.subjects); err != nil {
		return b, err
	}
	b.pods, err = startPodWatch(watchCtx, b.raw.cs)
	return b, err
}

// newLocalBench is the bench of cluster-free phases alone ((p)): no pipeline, no cluster.
func newLocalBench(s settings, stderr io.Writer) *bench {
	return &bench{s: s, session: newID(""), progress: stderr, stats: newOpStats()}
}

// close stops the bench's readers, then the pipeline, then deletes every namespace the bench
// made and waits (bounded by --cleanup-timeout, even when ctx is already cancelled) until they
// are gone.
func (b *bench) close(ctx context.Context) error {
	var errs []error
	if b.stopWatching != nil {
		b.stopWatching()
		if b.pods != nil {
			b.pods.stop()
		}
		if b.events != nil {
			if err := b.events.wait(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if b.pipe != nil {
		if err := b.pipe.stop(); err != nil {
			errs = append(errs, err)
		}
	}
	if b.raw != nil {
		errs = append(errs, b.cleanup(ctx))
	}
	return errors.Join(errs...)
}

func (b *bench) cleanup(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.s.cleanupTimeout)
	defer cancel()
	start := time.Now()
	b.logf("cleanup: deleting the bench's namespaces")
	n, err := cleanup(ctx, b.raw.cs)
	if err != nil {
		return fmt.Errorf("cleaning up: %w", err)
	}
	b.logf("cleanup: %d namespace(s) deleted and gone in %s", n, time.Since(start).Round(time.Second))
	return nil
}

// measure runs every phase in turn, each on a node the ones before it have left (settle), and
// returns the report, with the rows of the phases that ran when one fails. Without the
// pipeline (only cluster-free phases selected: newLocalBench) it runs those alone.
func (b *bench) measure(ctx context.Context) (*report, error) {
	rep := newReport(b.session)
	rep.note("p50/p99 are nearest-rank percentiles: p99 is the ⌈0.99·n⌉-th smallest of n samples (the largest when n < 100, the second largest when n = 100)")
	phases := []phase{
		{phaseSetup, b.setup},
		{phaseWarm, b.warmPhase},
		{phaseCold, b.coldPhase},
		{phaseLogs, b.logPhase},
		{phaseResults, b.resultPhase},
		{phaseTakeover, b.takeoverPhase},
		{phaseReplay, b.replayPhase},
		{phaseBurst, b.burstPhase},
	}
	phases = append(phases, b.replicaPhases()...)
	phases = append(phases, b.execPhases(b.sandboxKey)...)
	phases = append(phases, phase{phaseReuse, b.reusePhase})
	phases = append(phases, phase{phaseWarmPool, func(ctx context.Context, rep *report) error { return b.warmPoolPhase(ctx, rep, b.sandboxKey) }})
	phases = append(phases, phase{phaseBroker, b.brokerPhase})
	if b.pipe == nil {
		rep.Mode = "phase (p) alone, without the cluster or the pipeline: the credential-broker binary as its own process, " +
			"NATS, its upstream and the clients in the bench process; times are the clients' (request sent → body or first byte read)"
	}
	for i, p := range phases {
		if !b.s.runs(p.name) || (b.pipe == nil && p.name == phaseSetup) {
			continue
		}
		if i > 0 && b.pipe != nil {
			ps, err := b.settle(ctx, p.name)
			if err != nil {
				return rep, err
			}
			rep.Phases = append(rep.Phases, ps)
		}
		b.logf("%s ...", p.name)
		b.stats.reset()
		before := readCPU()
		err := p.run(ctx, rep)
		after := readCPU()
		if note := cpuNote(p.name, before, after); note != "" && after.at.Sub(before.at) >= minCPUWindow {
			rep.note("%s", note)
		}
		rep.Breakdown = append(rep.Breakdown, b.stats.rows(p.name)...)
		if err != nil {
			return rep, fmt.Errorf("%s: %w", p.name, err)
		}
		b.logf("%s done in %s", p.name, after.at.Sub(before.at).Round(100*time.Millisecond))
	}
	return rep, nil
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(b.progress, "%s bench: %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// newID returns prefix + a fresh lower-case ULID: usable as company, agent and run id.
func newID(prefix string) string {
	return prefix + strings.ToLower(ulid.Make().String())
}

// request is an acquire for a fresh run of a fresh agent of companyID, the stub told by env.
func (b *bench) request(companyID string, env map[string]string) events.AcquireRequest {
	return events.AcquireRequest{
		RunID: newID("run-"), CompanyID: companyID, EnvironmentID: "bench",
		AgentID: newID("agent-"), Config: providerConfig(env),
	}
}

// stubEnv tells the stub to print lines assistant lines interval apart and exit.
func stubEnv(lines int, interval time.Duration) map[string]string {
	env := map[string]string{"STUB_LINES": strconv.Itoa(lines)}
	if interval > 0 {
		env["STUB_INTERVAL"] = interval.String()
	}
	return env
}

// providerConfig is the Job-backend config of every bench lease (as the e2e tests' stubConfig),
// with the bench's namespace prefix and the stub's env.
func providerConfig(env map[string]string) json.RawMessage {
	if env == nil {
		env = map[string]string{}
	}
	cfg := map[string]any{
		"namespacePrefix":        namespacePrefix,
		"backend":                "job",
		"podActivityDeadlineSec": 120,
		"adapters": []any{map[string]any{
			"adapterType":  "claude_local",
			"runtimeImage": stubImage,
			"envKeys":      []string{"ANTHROPIC_API_KEY"},
			"allowFqdns":   []string{"api.anthropic.com"},
			"defaultEnv":   env,
		}},
		"defaultResources": map[string]any{
			"requests": map[string]string{"cpu": "100m", "memory": "128Mi"},
			"limits":   map[string]string{"cpu": "500m", "memory": "256Mi"},
		},
	}
	data, _ := json.Marshal(cfg) // maps of strings and numbers always encode
	return data
}

// tenantNamespace is companyID's tenant namespace under the bench's config.
func (b *bench) tenantNamespace(companyID string) (string, error) {
	return policy.TenantNamespace(b.policy, companyID)
}

// labelTenants labels the pipeline's tenant namespaces of companies with the session.
func (b *bench) labelTenants(ctx context.Context, companies ...string) error {
	for _, c := range companies {
		ns, err := b.tenantNamespace(c)
		if err != nil {
			return err
		}
		if err := labelNamespace(ctx, b.raw.cs, ns, b.session); err != nil {
			return err
		}
	}
	return nil
}

// waitCtx bounds one wait by --wait-timeout.
func (b *bench) waitCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.s.waitTimeout)
}

// sleep pauses for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
