// Command run-watcher follows kubeclip's runs in the cluster and publishes their status
// changes, live log chunks and results as run events.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/internal/ops"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/runwatch"
)

const summary = "run-watcher publishes the status, live logs and result of every kubeclip run."

func main() { os.Exit(app.Main("run-watcher", run)) }

type settings struct {
	app.Common
	Streams            app.Streams
	FlushInterval      time.Duration
	UnschedulableGrace time.Duration
	StartErrorGrace    time.Duration
	ReplicaID          string
	OwnershipTTL       time.Duration
	Reconcile          time.Duration
	LogRunBudget       int
	LogCompanyBudget   int
	LogBudgetWindow    time.Duration
}

var (
	_ runwatch.BudgetObserver    = (*ops.Metrics)(nil)
	_ runwatch.LifecycleObserver = (*ops.Metrics)(nil)
	_ runwatch.LogGapObserver    = (*ops.Metrics)(nil)
)

func run(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout, stderr io.Writer) error {
	var s settings
	fs := config.New("run-watcher", lookupEnv)
	s.Common.Bind(fs)
	s.Streams.Bind(fs)
	fs.Duration(&s.FlushInterval, "log-flush-interval", "KUBECLIP_LOG_FLUSH_INTERVAL", runwatch.DefaultFlushInterval, "longest a log line waits before its chunk is published")
	fs.Duration(&s.UnschedulableGrace, "unschedulable-grace", "KUBECLIP_UNSCHEDULABLE_GRACE", runwatch.DefaultUnschedulableGrace, "how long a pod may stay unschedulable before its run fails")
	fs.Duration(&s.StartErrorGrace, "start-error-grace", "KUBECLIP_START_ERROR_GRACE", runwatch.DefaultStartErrorGrace, "how long a pod may report an image-pull or container-config error before its run fails")
	fs.String(&s.ReplicaID, "replica-id", "KUBECLIP_REPLICA_ID", "", "this replica's name in the run ownership bucket (set it to the pod name); empty: host name plus a random suffix")
	fs.Duration(&s.Reconcile, "reconcile-interval", "KUBECLIP_RECONCILE_INTERVAL", runwatch.DefaultReconcileInterval, "how often runs whose workload vanished unobserved get a result (also at start)")
	fs.Duration(&s.OwnershipTTL, "ownership-ttl", "KUBECLIP_OWNERSHIP_TTL", runwatch.DefaultOwnershipTTL, "how long a run stays with a replica that stopped renewing it; bounds takeover after a crash (same on every replica)")
	fs.Int(&s.LogRunBudget, "log-run-budget", "KUBECLIP_LOG_RUN_BUDGET", events.DefaultRunBudget, "bytes of container log one run may store in the run stream (each event's fixed cost included); past it the run's log stops with a logStopped event")
	fs.Int(&s.LogCompanyBudget, "log-company-budget", "KUBECLIP_LOG_COMPANY_BUDGET", 0, "bytes of container log one company's runs may store in the run stream per --log-budget-window; 0: the run stream's share of --store-bytes divided among --store-companies, both sources (execs and logs) and every window of --run-retention, the most that fits (and the most allowed)")
	fs.Duration(&s.LogBudgetWindow, "log-budget-window", "KUBECLIP_LOG_BUDGET_WINDOW", events.DefaultBudgetWindow, "the window of --log-company-budget")
	if err := fs.Parse(args); err != nil {
		fs.Usage(stdout, summary)
		return app.Usage(err)
	}
	if err := s.Validate(fs); err != nil {
		return &app.UsageError{Err: err}
	}
	// The company budget is sized from the store when it is not set, and refused when it does
	// not fit the run stream for every company the store is sized for.
	if streams := s.Streams.Options(""); s.LogCompanyBudget == 0 {
		s.LogCompanyBudget = int(streams.CompanyBudget(s.LogBudgetWindow))
	} else if err := streams.CheckCompanyBudget(fs.Names("log-company-budget"), int64(s.LogCompanyBudget), s.LogBudgetWindow); err != nil {
		return &app.UsageError{Err: err}
	}

	p, err := s.Start(ctx, "run-watcher", s.Streams, stderr)
	if err != nil {
		return err
	}
	defer p.Close()
	if err := s.CheckPermissions(ctx, p, ""); err != nil {
		return err
	}

	w, err := runwatch.New(runwatch.Options{
		Clientset: p.Kube.Clientset, Dynamic: p.Kube.Dynamic, JetStream: p.JS, Subjects: p.Subjects, Logger: p.Log,
		FlushInterval: s.FlushInterval, UnschedulableGrace: s.UnschedulableGrace, StartErrorGrace: s.StartErrorGrace,
		ReplicaID: s.ReplicaID, OwnershipTTL: s.OwnershipTTL, StreamReplicas: s.Streams.Replicas, StoreBytes: int64(s.Streams.StoreBytes),
		ReconcileInterval: s.Reconcile,
		LogBudget:         runwatch.LogBudget{RunBytes: int64(s.LogRunBudget), CompanyBytes: int64(s.LogCompanyBudget), Window: s.LogBudgetWindow},
		Observer:          p.Ops.Metrics,
	})
	if err != nil {
		return err
	}
	return p.Serve(ctx, w)
}

func (s *settings) Validate(fs *config.Set) error {
	if err := s.Common.Validate(fs); err != nil {
		return err
	}
	if s.FlushInterval <= 0 {
		return fmt.Errorf("%s must be > 0", fs.Names("log-flush-interval"))
	}
	if s.UnschedulableGrace < 0 {
		return fmt.Errorf("%s must not be negative", fs.Names("unschedulable-grace"))
	}
	if s.StartErrorGrace < 0 {
		return fmt.Errorf("%s must not be negative", fs.Names("start-error-grace"))
	}
	if s.OwnershipTTL < time.Second {
		return fmt.Errorf("%s must be at least 1s", fs.Names("ownership-ttl"))
	}
	return nil
}
