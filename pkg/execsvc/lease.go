package execsvc

import (
	"context"
	"errors"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execproto"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// leaseReader reads lease records; lease.Records is the real one.
type leaseReader interface {
	Get(ctx context.Context, ref events.RunRef) (lease.Record, uint64, error)
}

var _ leaseReader = lease.Records{}

// checkLease admits a request for ref's lease: the record exists for the subject's company, its
// workload is providerLeaseID, its backend runs commands, it has not ended and, if reusable, the
// host has not released it since its last resume. Anything else is
// an *execproto.Error with the code that says why; errors reading the record are returned as
// they are (the caller answers unavailable).
func checkLease(ctx context.Context, leases leaseReader, ref events.RunRef, providerLeaseID string) (lease.Record, error) {
	rec, _, err := leases.Get(ctx, ref)
	if errors.Is(err, lease.ErrNotFound) {
		return lease.Record{}, execproto.NewError(execproto.CodeLeaseNotFound, "", "company %s has no lease for run %s", ref.CompanyID, ref.RunID)
	}
	if err != nil {
		return lease.Record{}, err
	}
	// The workload name is compared before anything else is said about the lease: a client
	// that does not know it learns nothing of the run's state.
	if rec.WorkloadName == "" || rec.WorkloadName != providerLeaseID {
		return lease.Record{}, execproto.NewError(execproto.CodeLeaseMismatch, "providerLeaseId", "is not the lease of run %s", ref.RunID)
	}
	if !policy.Backend(rec.Backend).ExecCapable() {
		return lease.Record{}, execproto.NewError(execproto.CodeNotExecCapable, "", "lease %s has backend %q, which runs no commands on request", rec.WorkloadName, rec.Backend)
	}
	switch {
	case rec.State.Ended():
		return lease.Record{}, execproto.NewError(execproto.CodeLeaseEnded, "", "lease %s was released (%s)", rec.WorkloadName, rec.State)
	case rec.State == lease.StateFinished:
		return lease.Record{}, execproto.NewError(execproto.CodeLeaseEnded, "", "lease %s ended: its run has a result", rec.WorkloadName)
	case rec.State == lease.StateFailed:
		return lease.Record{}, execproto.NewError(execproto.CodeLeaseEnded, "", "lease %s failed to start", rec.WorkloadName)
	// A reusable lease between two runs: the host released it, and its pod (if any) serves
	// commands again only once the host resumes it. Refused here, before a pod that may be gone.
	case rec.State.Kept():
		return lease.Record{}, execproto.NewError(execproto.CodeLeaseEnded, "", "lease %s was released and is kept for the agent's next run (%s): commands run once the host resumes it", rec.WorkloadName, rec.State)
	case rec.State == lease.StateResuming:
		return lease.Record{}, execproto.NewError(execproto.CodeNotReady, "", "lease %s is resuming: its new pod is not ready yet", rec.WorkloadName)
	}
	return rec, nil
}
