package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/oklog/ulid/v2"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execclient"
)

// A lease request (release, destroy, resume) is answered by a run event of the run that
// acquired the lease: released, resumed, or failed with the request's kind. A reusable lease is
// released and resumed once per run of its agent, so those requests name themselves (releaseId,
// resumeId: a fresh ULID here, as the plugin's are fresh) and only the answer carrying the same id
// is theirs; a destroy has one answer, released {destroyed}.

// refusal is kubeclip's failed event answering a lease request: the process exits 1 with it.
type refusal struct{ ev events.RunFailedEvent }

func (r *refusal) Error() string {
	field := ""
	if r.ev.Field != "" {
		field = " (field " + r.ev.Field + ")"
	}
	return fmt.Sprintf("%s of run %s refused: %s%s: %s", r.ev.Request, r.ev.RunID, r.ev.Code, field, r.ev.Message)
}

// answerFunc reports whether ev answers the request, and the request's refusal as an error.
type answerFunc func(ev events.Event) (bool, error)

// refusedBy is the part of an answerFunc every request shares: ev is the failed event of kind
// that carries the request's id (none for a destroy).
func refusedBy(ev events.Event, kind events.LeaseKind, requestID string) (bool, error) {
	f, ok := ev.(events.RunFailedEvent)
	if !ok || f.Request != kind || f.RequestID != requestID {
		return false, nil
	}
	return true, &refusal{ev: f}
}

// resumeAnswer is a resume's answer: its resumed event, or its refusal.
func resumeAnswer(req events.ResumeRequest) answerFunc {
	return func(ev events.Event) (bool, error) {
		if r, ok := ev.(events.RunResumedEvent); ok {
			return r.ResumeID == req.ResumeID, nil
		}
		return refusedBy(ev, events.LeaseResume, req.ResumeID)
	}
}

// releaseAnswer is a release's or destroy's answer: released (destroyed, for a destroy), or its
// refusal. A release's released carries its releaseId when the lease is reusable and none for
// any other lease, whose release kubeclip answers once.
func releaseAnswer(req events.ReleaseRequest) answerFunc {
	return func(ev events.Event) (bool, error) {
		if r, ok := ev.(events.RunReleasedEvent); ok {
			if req.Destroy {
				return r.State == events.ReleaseDestroyed, nil
			}
			return r.ReleaseID == req.ReleaseID || r.ReleaseID == "", nil
		}
		return refusedBy(ev, req.Kind(), req.ReleaseID)
	}
}

// releasedFinal reports whether the run's last released event (released), with the sequence
// of its last resumed event (0: none), ends the lease whatever is asked of it next: one that
// answers no named release (a destroy's or a collection's, or the release of a lease that is not
// reusable), not followed by a resume, and for a destroy one that says destroyed. kubeclip
// confirms such a lease's next release or destroy with the same event, which JetStream drops as
// a repeat within its duplicate window: the wait reads it before the request is published.
func releasedFinal(req events.ReleaseRequest, released events.Received, resumedSeq uint64) bool {
	r, ok := released.Event.(events.RunReleasedEvent)
	return ok && r.ReleaseID == "" && released.StreamSeq > resumedSeq && (r.State == events.ReleaseDestroyed || !req.Destroy)
}

// newRequestID names a request among the lease's requests of its kind.
func newRequestID() string { return strings.ToLower(ulid.Make().String()) }

// releaseLease is `kubeclip release` and (destroy) `kubeclip lease destroy`: one request, and
// with --wait (always for lease destroy) its answer.
func releaseLease(ctx context.Context, name string, args []string, lookupEnv config.LookupEnv, stdout io.Writer, destroy bool) error {
	var c client
	var req events.ReleaseRequest
	var wait bool
	var timeout time.Duration
	fs := config.New(name, lookupEnv)
	c.bind(fs)
	fs.String(&req.CompanyID, "company", "KUBECLIP_COMPANY", "", "company id (required)")
	fs.String(&req.RunID, "run", "KUBECLIP_RUN", "", "id of the run that acquired the lease (required)")
	fs.String(&req.ProviderLeaseID, "lease", "KUBECLIP_LEASE", "", "the lease's providerLeaseId; empty: read from the run's created event")
	fs.Bool(&req.CancelActiveWork, "cancel", "KUBECLIP_CANCEL", true, "cancel active work (a reusable lease is then suspended at once)")
	summary := "release publishes a release (or destroy) request for a run's lease."
	if destroy {
		req.Destroy, wait = true, true
		summary = leaseUsage
	} else {
		fs.Bool(&req.Destroy, "destroy", "KUBECLIP_DESTROY", false, "destroy (also delete the run's Secret and a reusable lease's volume) instead of release")
		fs.Bool(&wait, "wait", "KUBECLIP_WAIT", false, "wait for kubeclip's answer (released, or the refusal) and print it")
	}
	fs.Duration(&timeout, "timeout", "KUBECLIP_ANSWER_TIMEOUT", defaultAnswerTimeout, "with --wait: how long to wait for the answer")
	if err := parse(fs, args, stdout, summary); err != nil {
		return err
	}
	if err := required(fs, flagValue{"company", req.CompanyID}, flagValue{"run", req.RunID}); err != nil {
		return err
	}
	if timeout <= 0 {
		return &app.UsageError{Err: fmt.Errorf("%s must be > 0", fs.Names("timeout"))}
	}
	if !req.Destroy {
		req.ReleaseID = newRequestID()
	}
	if err := req.Validate(); err != nil {
		return &app.UsageError{Err: err}
	}
	nc, js, s, err := c.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	if req.ProviderLeaseID, err = leaseName(ctx, js, s, req.CompanyID, req.RunID, req.ProviderLeaseID); err != nil {
		return err
	}
	if !wait {
		if err := publish(ctx, js, s, req); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s published for run %s\n", req.Kind(), req.RunID)
		return nil
	}
	ref := events.Ref(req.CompanyID, req.RunID)
	return request(ctx, js, s, req, timeout, printer{w: stdout}, releaseAnswer(req), func(stream jetstream.Stream) (events.Received, bool, error) {
		released, ok, err := lastEvent[events.RunReleasedEvent](ctx, stream, s, ref)
		if err != nil || !ok {
			return released, false, err
		}
		resumed, _, err := lastEvent[events.RunResumedEvent](ctx, stream, s, ref)
		return released, err == nil && releasedFinal(req, released, resumed.StreamSeq), err
	})
}

func runLeaseResume(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout io.Writer) error {
	var c client
	var req events.ResumeRequest
	var timeout time.Duration
	fs := config.New("kubeclip lease resume", lookupEnv)
	c.bind(fs)
	fs.String(&req.CompanyID, "company", "KUBECLIP_COMPANY", "", "company id (required)")
	fs.String(&req.RunID, "run", "KUBECLIP_RUN", "", "id of the run that acquired the lease (required)")
	fs.String(&req.ProviderLeaseID, "lease", "KUBECLIP_LEASE", "", "the lease's providerLeaseId; empty: read from the run's created event")
	fs.Duration(&timeout, "timeout", "KUBECLIP_ANSWER_TIMEOUT", defaultAnswerTimeout, "how long to wait for the answer")
	if err := parse(fs, args, stdout, leaseUsage); err != nil {
		return err
	}
	if err := required(fs, flagValue{"company", req.CompanyID}, flagValue{"run", req.RunID}); err != nil {
		return err
	}
	if timeout <= 0 {
		return &app.UsageError{Err: fmt.Errorf("%s must be > 0", fs.Names("timeout"))}
	}
	req.ResumeID = newRequestID()
	if err := events.Ref(req.CompanyID, req.RunID).Validate(); err != nil {
		return &app.UsageError{Err: err}
	}
	nc, js, s, err := c.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	if req.ProviderLeaseID, err = leaseName(ctx, js, s, req.CompanyID, req.RunID, req.ProviderLeaseID); err != nil {
		return err
	}
	if err := req.Validate(); err != nil {
		return &app.UsageError{Err: err}
	}
	return request(ctx, js, s, req, timeout, printer{w: stdout}, resumeAnswer(req), nil)
}

// leaseName is the lease's providerLeaseId: name, or the one the run's created event gives.
func leaseName(ctx context.Context, js jetstream.JetStream, s events.Subjects, companyID, runID, name string) (string, error) {
	l, err := resolveLease(ctx, js, s, execclient.Lease{CompanyID: companyID, RunID: runID, ProviderLeaseID: name})
	return l.ProviderLeaseID, err
}

func publish(ctx context.Context, js jetstream.JetStream, s events.Subjects, req events.Event) error {
	pub, err := events.NewPublisher(events.PublisherOptions{JS: js, Subjects: s})
	if err != nil {
		return err
	}
	if _, err := pub.Publish(ctx, req); err != nil {
		return fmt.Errorf("publishing the request: %w", err)
	}
	return nil
}

// request publishes req and waits, for at most timeout, for the run event that answers it,
// which it prints; the run's status events on the way are printed too (a resumed lease's new pod
// coming up). Only what the run stream stores after the publish can answer it: the run's earlier
// events (an earlier resume's resumed) are left unread. already, when set, reads the stream
// before the publish for an answer stored already (see releasedFinal) and reports whether it is.
func request(ctx context.Context, js jetstream.JetStream, s events.Subjects, req events.Event, timeout time.Duration, p printer, answer answerFunc, already func(jetstream.Stream) (events.Received, bool, error)) error {
	companyID, runID := req.IDs()
	stream, err := js.Stream(ctx, s.RunStream())
	if err != nil {
		return fmt.Errorf("opening stream %s: %w", s.RunStream(), err)
	}
	from := stream.CachedInfo().State.LastSeq + 1
	if already != nil {
		r, ok, err := already(stream)
		if err != nil {
			return err
		}
		if ok {
			fmt.Fprintf(p.w, "run %s's lease was released already:\n", runID)
			p.print(r)
			return nil
		}
	}
	if err := publish(ctx, js, s, req); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var answered bool
	var answerErr error
	err = events.Follow(wctx, js, s, companyID, runID, events.FollowOptions{StartSeq: from}, func(r events.Received) error {
		if r.Err != nil {
			return nil
		}
		ok, aerr := answer(r.Event)
		if _, status := r.Event.(events.RunStatusEvent); ok || status {
			p.print(r)
		}
		if !ok {
			return nil
		}
		answered, answerErr = true, aerr
		return events.ErrStopFollowing
	})
	switch {
	case answered:
		return answerErr
	case wctx.Err() != nil && ctx.Err() == nil:
		return fmt.Errorf("no answer to the %s of run %s within %s (is the dispatcher up? kubeclip lease show --company %s --run %s)", requestKind(req), runID, timeout, companyID, runID)
	case err != nil:
		return fmt.Errorf("waiting for the answer: %w", err)
	}
	return ctx.Err()
}

// requestKind names a lease request in messages.
func requestKind(req events.Event) string {
	switch r := req.(type) {
	case events.ReleaseRequest:
		return string(r.Kind())
	case events.ResumeRequest:
		return string(events.LeaseResume)
	}
	return "request"
}

var _ error = (*refusal)(nil)
