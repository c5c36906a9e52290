// Command exec-worker runs the commands Paperclip (and the kubeclip CLI) send over core NATS in
// the pods of exec-capable leases, through each pod's sandboxd (pkg/execsvc, docs/exec.md).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"time"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/internal/ops"
	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/execspec"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
)

const summary = "exec-worker runs commands in the pods of exec-capable leases for Paperclip and the kubeclip CLI."

var (
	_ execsvc.Observer       = (*ops.Metrics)(nil)
	_ execsvc.BudgetObserver = (*ops.Metrics)(nil)
)

func main() { os.Exit(app.Main("exec-worker", run)) }

type settings struct {
	app.Common
	Streams         app.Streams
	Route           string
	SandboxKeyFile  string
	MaxExecs        int
	MaxCompanyExecs int
	EnvPolicy       string
	EnvAllow        []string
	EnvDeny         []string
	BrokeredKeys    []string
	ReadyTimeout    time.Duration
	ReplicaID       string
	Record          recordSettings
}

// recordSettings bound recorded execs (execsvc.RecordLimits, docs/security.md, Budgets).
type recordSettings struct {
	MaxLine, ExecBytes, RunBytes, CompanyBytes int
	CompanyWindow                              time.Duration
}

func (r *recordSettings) bind(fs *config.Set) {
	fs.Int(&r.MaxLine, "record-max-line", "KUBECLIP_RECORD_MAX_LINE", execsvc.DefaultMaxRecordedLine, "longest stdout line of a recorded exec parsed for the agent's result, in bytes; longer lines are skipped, never buffered")
	fs.Int(&r.ExecBytes, "record-exec-budget", "KUBECLIP_RECORD_EXEC_BUDGET", execsvc.DefaultExecBudget, "bytes one recorded exec may store in the run stream (each event's fixed cost included)")
	fs.Int(&r.RunBytes, "record-run-budget", "KUBECLIP_RECORD_RUN_BUDGET", events.DefaultRunBudget, "bytes one run's recorded execs may store in the run stream")
	fs.Int(&r.CompanyBytes, "record-company-budget", "KUBECLIP_RECORD_COMPANY_BUDGET", 0, "bytes one company's recorded execs may store in the run stream per --record-budget-window; 0: the run stream's share of --store-bytes divided among --store-companies, both sources (execs and logs) and every window of --run-retention, the most that fits (and the most allowed)")
	fs.Duration(&r.CompanyWindow, "record-budget-window", "KUBECLIP_RECORD_BUDGET_WINDOW", events.DefaultBudgetWindow, "the window of --record-company-budget")
}

// fit sizes the company budget from the store when it is not set, and refuses one that does not
// fit the run stream for every company the store is sized for.
func (r *recordSettings) fit(fs *config.Set, streams events.Options) error {
	if r.CompanyBytes == 0 {
		r.CompanyBytes = int(streams.CompanyBudget(r.CompanyWindow))
		return nil
	}
	return streams.CheckCompanyBudget(fs.Names("record-company-budget"), int64(r.CompanyBytes), r.CompanyWindow)
}

func (r recordSettings) limits() execsvc.RecordLimits {
	return execsvc.RecordLimits{MaxLine: r.MaxLine, ExecBytes: int64(r.ExecBytes), RunBytes: int64(r.RunBytes), CompanyBytes: int64(r.CompanyBytes), CompanyWindow: r.CompanyWindow}
}

func run(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout, stderr io.Writer) error {
	var s settings
	fs := config.New("exec-worker", lookupEnv)
	s.Common.Bind(fs)
	s.Streams.Bind(fs)
	fs.String(&s.Route, "exec-route", "KUBECLIP_EXEC_ROUTE", execsvc.RouteDaemon, "how sandboxd in a lease's pod is reached: daemon (TLS to the pod IP, port 7070, key derived per lease) or kube-exec (the Kubernetes exec API running `sandboxd proxy`)")
	fs.String(&s.SandboxKeyFile, "sandbox-key-file", "KUBECLIP_SANDBOX_KEY_FILE", "", "file holding the installation's sandbox master key, the dispatcher's (hex or raw, at least 32 bytes); required")
	fs.Int(&s.MaxExecs, "max-execs", "KUBECLIP_MAX_EXECS", 0, "exec streams this replica serves at once; past it requests are answered unavailable and clients try again. 0: sized from the memory limit (cgroup memory.max or GOMEMLIMIT, whichever is smaller): 64 MiB for the worker, a quarter of the rest for the streams' buffers (taken as they grow), 256 KiB per stream (576 at 256 Mi), at most 2048")
	fs.Int(&s.MaxCompanyExecs, "max-execs-per-company", "KUBECLIP_MAX_EXECS_PER_COMPANY", 0, "a hard ceiling on one company's exec streams on this replica; 0: none, a company's share is fair (all but a reserve of a thirty-second when alone, an equal part when companies compete)")
	fs.String(&s.EnvPolicy, "env-policy", "KUBECLIP_EXEC_ENV_POLICY", execproto.EnvModeDeny, "which keys of an exec's environment reach the pod: deny (every key but the built-in list of Paperclip's server secrets and --env-deny) or allowlist (only the built-in list of what an agent needs and --env-allow, never --env-deny); the plugin's executeEnv setting, with the same rules (the plugin's default is allowlist)")
	fs.Strings(&s.EnvAllow, "env-allow", "", "KUBECLIP_EXEC_ENV_ALLOW", "an environment key glob (`*` any run of characters) that reaches the pod in allowlist mode besides what an agent needs (never past the built-in deny list or --env-deny)")
	fs.Strings(&s.EnvDeny, "env-deny", "", "KUBECLIP_EXEC_ENV_DENY", "an environment key glob (`*` any run of characters) that never reaches the pod")
	fs.Strings(&s.BrokeredKeys, "brokered-keys", "", "KUBECLIP_EXEC_BROKERED_KEYS", "environment keys the credential broker holds (ANTHROPIC_API_KEY,OPENAI_API_KEY; comma-separated or given many times): a start carrying it with anything but a broker placeholder is refused, naming the key, before anything runs; none (the default): off, for installations without a broker")
	fs.Duration(&s.ReadyTimeout, "ready-timeout", "KUBECLIP_EXEC_READY_TIMEOUT", execsvc.DefaultReadyTimeout, "longest a start waits for its lease's pod to become ready (less when the exec's own timeout is shorter)")
	s.Record.bind(fs)
	fs.String(&s.ReplicaID, "replica-id", "KUBECLIP_REPLICA_ID", "", "this replica's name in exec answers and logs (set it to the pod name); empty: host name plus a random suffix")
	if err := fs.Parse(args); err != nil {
		fs.Usage(stdout, summary)
		return app.Usage(err)
	}
	if err := s.Validate(fs); err != nil {
		return &app.UsageError{Err: err}
	}
	if err := s.Record.fit(fs, s.Streams.Options("")); err != nil {
		return &app.UsageError{Err: err}
	}
	envPolicy, err := execproto.NewEnvPolicy(s.EnvPolicy, s.EnvAllow, s.EnvDeny)
	if err != nil {
		return &app.UsageError{Err: fmt.Errorf("%s, %s, %s: %w", fs.Names("env-policy"), fs.Names("env-allow"), fs.Names("env-deny"), err)}
	}
	brokeredNames, err := broker.KeyNames(s.BrokeredKeys)
	if err != nil {
		return &app.UsageError{Err: fmt.Errorf("%s: %w", fs.Names("brokered-keys"), err)}
	}
	brokered, err := execsvc.NewBrokeredKeys(brokeredNames)
	if err != nil {
		return &app.UsageError{Err: fmt.Errorf("%s: %w", fs.Names("brokered-keys"), err)}
	}
	masterKey, err := execspec.ReadMasterKey(s.SandboxKeyFile)
	if err != nil {
		return &app.UsageError{Err: fmt.Errorf("%s: %w", fs.Names("sandbox-key-file"), err)}
	}

	p, err := s.Start(ctx, "exec-worker", s.Streams, stderr)
	if err != nil {
		return err
	}
	defer p.Close()
	if err := s.CheckPermissions(ctx, p, ""); err != nil {
		return err
	}
	limit := memoryLimit()
	_, gomemlimitSet := lookupEnv("GOMEMLIMIT")
	if soft, ok := softMemoryLimit(limit, gomemlimitSet); ok {
		debug.SetMemoryLimit(soft)
	}
	sizing := replicaSizing(limit, s.MaxExecs)
	p.Log.Info().Int64("memory_limit", limit).Int("max_execs", sizing.Sessions).Int64("buffer_bytes", sizing.BufferBytes).Msg("exec streams and buffers sized from the memory limit")

	pods, err := execsvc.NewPodWatcher(execsvc.PodWatcherOptions{Clientset: p.Kube.Clientset, Logger: p.Log})
	if err != nil {
		return err
	}
	var route execsvc.Route = execsvc.DaemonRoute{}
	if s.Route == execsvc.RouteKubeExec {
		route = &execsvc.KubeExecRoute{Config: p.Kube.Config, Clientset: p.Kube.Clientset}
	}
	svc, err := execsvc.New(execsvc.Options{
		NATS: p.NATS, JetStream: p.JS, Subjects: p.Subjects, Pods: pods, Route: route, MasterKey: masterKey,
		Replica: s.ReplicaID, Logger: p.Log, MaxSessions: sizing.Sessions, MaxSessionsPerCompany: s.MaxCompanyExecs, BufferBytes: sizing.BufferBytes, ReadyTimeout: s.ReadyTimeout,
		DrainTimeout: s.ShutdownTimeout, StreamReplicas: s.Streams.Replicas, StoreBytes: int64(s.Streams.StoreBytes), Observer: p.Ops.Metrics,
		Record:       s.Record.limits(),
		Replies:      s.Replies(),
		EnvPolicy:    envPolicy,
		BrokeredKeys: brokered,
	})
	if err != nil {
		return err
	}
	// The pod cache is in before the first request is taken, so a start never misses a pod
	// that exists; and it stops after the service drained. /readyz names the exec service
	// beside NATS and Kubernetes: ready means taking exec requests.
	ready := func() { p.Ops.Ready(p.NATS, p.Kube, ops.Check{Name: "exec", Func: serving(svc)}) }
	return app.Serve(ctx, ready, podWatch{pods}, svc)
}

// serving is the readiness check of a worker: it passes once the worker serves.
func serving(w app.Worker) func(context.Context) error {
	return func(context.Context) error {
		select {
		case <-w.Ready():
			return nil
		default:
			return errors.New("not serving exec requests yet")
		}
	}
}

// podWatch is the pod watcher as a worker: ready once its cache is in.
type podWatch struct{ *execsvc.PodWatcher }

func (w podWatch) Ready() <-chan struct{} { return w.Synced() }

func (w podWatch) Run(ctx context.Context) error {
	if err := w.PodWatcher.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("watching pods: %w", err)
	}
	return nil
}

func (s *settings) Validate(fs *config.Set) error {
	var errs []error
	if err := s.Common.Validate(fs); err != nil {
		errs = append(errs, err)
	}
	if s.Route != execsvc.RouteDaemon && s.Route != execsvc.RouteKubeExec {
		errs = append(errs, fmt.Errorf("%s must be %s or %s, got %q", fs.Names("exec-route"), execsvc.RouteDaemon, execsvc.RouteKubeExec, s.Route))
	}
	if s.SandboxKeyFile == "" {
		errs = append(errs, fmt.Errorf("%s is required: exec-workers derive every lease's key from it", fs.Names("sandbox-key-file")))
	}
	if s.MaxExecs < 0 {
		errs = append(errs, fmt.Errorf("%s must be >= 0 (0: sized from the memory limit)", fs.Names("max-execs")))
	}
	if s.MaxCompanyExecs < 0 {
		errs = append(errs, fmt.Errorf("%s must be >= 0 (0: none)", fs.Names("max-execs-per-company")))
	}
	if s.ReadyTimeout <= 0 {
		errs = append(errs, fmt.Errorf("%s must be > 0", fs.Names("ready-timeout")))
	}
	return errors.Join(errs...)
}
