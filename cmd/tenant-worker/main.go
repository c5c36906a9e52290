// Command tenant-worker consumes Paperclip's acquire requests, provisions each company's tenant
// namespace with server-side apply, and hands the lease to the dispatcher.
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
	"github.com/kubeclip/kubeclip/pkg/tenant"
)

const summary = "tenant-worker provisions a company's tenant namespace for each acquire request and hands the lease to the dispatcher."

// The metrics count the acquires the lease-record quota refuses.
var _ tenant.BudgetObserver = (*ops.Metrics)(nil)

func main() { os.Exit(app.Main("tenant-worker", run)) }

type settings struct {
	app.Common
	Streams     app.Streams
	Tenancy     app.Tenancy
	Resync      time.Duration
	Concurrency int
	RecordQuota int
}

func run(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout, stderr io.Writer) error {
	var s settings
	fs := config.New("tenant-worker", lookupEnv)
	s.Common.Bind(fs)
	s.Streams.Bind(fs)
	s.Tenancy.Bind(fs)
	fs.Duration(&s.Resync, "tenant-resync", "KUBECLIP_TENANT_RESYNC", tenant.DefaultResync, "re-apply an unchanged tenant after this long, repairing drift")
	fs.Int(&s.Concurrency, "concurrency", "KUBECLIP_CONCURRENCY", 8, "acquire requests handled at once")
	fs.Int(&s.RecordQuota, "lease-record-quota", "KUBECLIP_LEASE_RECORD_QUOTA", 0, "lease records one company may create a day (one per acquire, a failing one too); past it its acquires fail quota_exceeded. 0: the lease records' share of --store-bytes divided among --store-companies for the whole --run-retention, the most that fits (and the most allowed)")
	if err := fs.Parse(args); err != nil {
		fs.Usage(stdout, summary)
		return app.Usage(err)
	}
	if err := s.Validate(fs); err != nil {
		return &app.UsageError{Err: err}
	}
	op, err := s.Tenancy.Operator(fs)
	if err != nil {
		return &app.UsageError{Err: err}
	}

	p, err := s.Start(ctx, "tenant-worker", s.Streams, stderr)
	if err != nil {
		return err
	}
	defer p.Close()
	if err := s.CheckPermissions(ctx, p, op.RBACNameSuffix); err != nil {
		return err
	}

	quota := int64(s.RecordQuota)
	if quota == 0 {
		quota = s.Streams.Options("").LeaseRecordQuota()
	} else if err := s.Streams.Options("").CheckLeaseRecordQuota(fs.Names("lease-record-quota"), quota); err != nil {
		return &app.UsageError{Err: err}
	}
	w, err := tenant.New(tenant.Options{
		Clientset: p.Kube.Clientset, Applier: p.Kube.Applier, JetStream: p.JS, Subjects: p.Subjects,
		Logger: p.Log, Resync: s.Resync, Concurrency: s.Concurrency, DrainTimeout: s.ShutdownTimeout,
		Observer: p.Ops.Metrics, Operator: op, Replies: s.Replies(), StreamReplicas: s.Streams.Replicas, StoreBytes: int64(s.Streams.StoreBytes),
		RecordQuota: quota,
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
	if s.RecordQuota < 0 {
		return fmt.Errorf("%s must not be negative", fs.Names("lease-record-quota"))
	}
	if s.Resync <= 0 {
		return fmt.Errorf("%s must be > 0", fs.Names("tenant-resync"))
	}
	if s.Concurrency <= 0 {
		return fmt.Errorf("%s must be > 0", fs.Names("concurrency"))
	}
	return nil
}
