package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/config"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// leaseUsage is the help of `kubeclip lease`.
const leaseUsage = `kubeclip lease shows a lease's state, and resumes or destroys a reusable lease.

Usage:
  kubeclip lease show    --company ID --run ID
  kubeclip lease resume  --company ID --run ID [--lease NAME] [--timeout D]
  kubeclip lease destroy --company ID --run ID [--lease NAME] [--timeout D]

A lease is named by the run that acquired it (--run), for all the runs that resume it, and by its
providerLeaseId (--lease; empty: read from the run's created event).

show prints the lease record (state, reusable, generation, resumes, volume claim, when it was
retained and suspended, its expiry, backend and workload) and the run's last event of each kind
that tells the lease's life. resume and destroy publish the request Paperclip's plugin publishes
and wait for kubeclip's answer, which they print: resumed, or released {destroyed}. A refusal
prints kubeclip's failed event and exits 1 with its code and field.
`

// defaultAnswerTimeout bounds the wait for the answer to a lease request: the dispatcher's own
// bound on a release or resume (--release-timeout, 2m) and a margin for its queue.
const defaultAnswerTimeout = 3 * time.Minute

// runLease dispatches `kubeclip lease <show|resume|destroy> [flags]`.
func runLease(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" {
		fmt.Fprint(stdout, leaseUsage)
		if len(args) == 0 {
			return &app.UsageError{Err: errors.New("lease needs a subcommand: show, resume or destroy")}
		}
		return nil
	}
	switch sub, rest := args[0], args[1:]; sub {
	case "show":
		return runLeaseShow(ctx, rest, lookupEnv, stdout)
	case "resume":
		return runLeaseResume(ctx, rest, lookupEnv, stdout)
	case "destroy":
		return releaseLease(ctx, "kubeclip lease destroy", rest, lookupEnv, stdout, true)
	default:
		fmt.Fprint(stdout, leaseUsage)
		return &app.UsageError{Err: fmt.Errorf("unknown lease subcommand %q", sub)}
	}
}

// flagValue is a flag's value, for required.
type flagValue struct{ name, value string }

// required refuses empty required flags, naming each with its environment variable.
func required(fs *config.Set, flags ...flagValue) error {
	var missing []string
	for _, f := range flags {
		if f.value == "" {
			missing = append(missing, fs.Names(f.name))
		}
	}
	switch len(missing) {
	case 0:
		return nil
	case 1:
		return &app.UsageError{Err: fmt.Errorf("%s is required", missing[0])}
	}
	return &app.UsageError{Err: fmt.Errorf("%s are required", strings.Join(missing, " and "))}
}

func runLeaseShow(ctx context.Context, args []string, lookupEnv config.LookupEnv, stdout io.Writer) error {
	var c client
	var ref events.RunRef
	fs := config.New("kubeclip lease show", lookupEnv)
	c.bind(fs)
	fs.String(&ref.CompanyID, "company", "KUBECLIP_COMPANY", "", "company id (required)")
	fs.String(&ref.RunID, "run", "KUBECLIP_RUN", "", "id of the run that acquired the lease (required)")
	if err := parse(fs, args, stdout, leaseUsage); err != nil {
		return err
	}
	if err := required(fs, flagValue{"company", ref.CompanyID}, flagValue{"run", ref.RunID}); err != nil {
		return err
	}
	if err := ref.Validate(); err != nil {
		return &app.UsageError{Err: err}
	}
	nc, js, s, err := c.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	v, err := readLease(ctx, js, s, ref)
	if err != nil {
		return err
	}
	v.write(stdout, time.Now())
	return nil
}

// leaseView is what `kubeclip lease show` prints.
type leaseView struct {
	Ref events.RunRef
	// Record is the lease record; nil when the bucket no longer holds it (its TTL) or never did.
	Record *lease.Record
	// Events are the run's last event of each kind in leaseKinds, in stream order.
	Events []events.Received
}

// The lease's state is its record's, not a reading of its events: the run stream cannot tell a
// reusable lease's release (retained, its pod kept) from any other lease's (released {stopped}
// both), has no event for the states in between (suspending, resuming, releasing: a resume
// stuck on its pod would look suspended), and says destroyed for a collected lease. So show
// reads the record (the CLI's NATS user may read the lease bucket, nothing else of the
// workers': nats-auth.conf) and the events beside it.

// readLease reads ref's lease record and the run's last events; an error when neither exists.
func readLease(ctx context.Context, js jetstream.JetStream, s events.Subjects, ref events.RunRef) (leaseView, error) {
	v := leaseView{Ref: ref}
	kv, err := js.KeyValue(ctx, lease.Bucket)
	if err != nil {
		return v, fmt.Errorf("opening the lease records (bucket %s; the cli user reads it, deploy/kustomize/base/nats-auth.conf): %w", lease.Bucket, err)
	}
	rec, _, err := lease.Records{KV: kv}.Get(ctx, ref)
	switch {
	case errors.Is(err, lease.ErrNotFound):
	case err != nil:
		return v, err
	default:
		v.Record = &rec
	}
	stream, err := js.Stream(ctx, s.RunStream())
	if err != nil {
		return v, fmt.Errorf("opening stream %s: %w", s.RunStream(), err)
	}
	for _, read := range leaseKinds {
		r, ok, err := read(ctx, stream, s, ref)
		if err != nil {
			return v, err
		}
		if ok {
			v.Events = append(v.Events, r)
		}
	}
	slices.SortFunc(v.Events, func(a, b events.Received) int { return cmp.Compare(a.StreamSeq, b.StreamSeq) })
	if v.Record == nil && len(v.Events) == 0 {
		return v, fmt.Errorf("company %s has no lease for run %s", ref.CompanyID, ref.RunID)
	}
	return v, nil
}

// lastEventReader reads a run's last event of one kind.
type lastEventReader func(context.Context, jetstream.Stream, events.Subjects, events.RunRef) (events.Received, bool, error)

// leaseKinds are the run events that tell a lease's life, as show prints them.
var leaseKinds = []lastEventReader{
	lastEvent[events.RunCreatedEvent], lastEvent[events.RunStatusEvent], lastEvent[events.RunResultEvent],
	lastEvent[events.RunReleasedEvent], lastEvent[events.RunSuspendedEvent], lastEvent[events.RunResumedEvent],
	lastEvent[events.RunFailedEvent],
}

// lastEvent reads ref's last event of E's kind; false when there is none, or when the subject's
// last message is not kubeclip's (events.LastRunEvent).
func lastEvent[E events.Event](ctx context.Context, stream jetstream.Stream, s events.Subjects, ref events.RunRef) (events.Received, bool, error) {
	last, err := events.LastRunEvent[E](ctx, stream, s, ref)
	if err != nil || !last.Ours {
		return events.Received{}, false, err
	}
	return events.Received{Event: last.Event, StreamSeq: last.Seq}, true, nil
}

// write prints v for a person, times relative to now.
func (v leaseView) write(w io.Writer, now time.Time) {
	field := func(name, format string, args ...any) {
		fmt.Fprintf(w, "%-11s %s\n", name, fmt.Sprintf(format, args...))
	}
	when := func(t time.Time) string {
		return fmt.Sprintf("%s (%s ago)", t.UTC().Format(time.RFC3339), now.Sub(t).Round(time.Second))
	}
	if r := v.Record; r != nil {
		field("lease", "%s (run %s of company %s)", orNone(r.WorkloadName), r.RunID, r.CompanyID)
		state := string(r.State)
		switch {
		case r.Collected:
			state += " (collected: suspended past the maximum age)"
		case r.State == lease.StateFailed && r.Failure != "":
			state += " (" + string(r.Failure) + ")"
		case r.State == lease.StateReleasing && r.Ending != "":
			state += " (" + string(r.Ending) + ")"
		}
		field("state", "%s", state)
		field("reusable", "%s", yesNo(r.Reusable))
		field("backend", "%s, namespace %s", orNone(r.Backend), orNone(r.Namespace))
		if r.Reusable {
			field("volume", "%s", orNone(r.VolumeClaim))
			field("generation", "%d (resumes %d)", r.Generation, r.Resumes)
		}
		field("created", "%s", when(r.CreatedAt))
		if r.RetainedAt != nil {
			field("retained", "%s", when(*r.RetainedAt))
		}
		if r.SuspendedAt != nil {
			field("suspended", "%s", when(*r.SuspendedAt))
		}
		expires := "never"
		if r.ExpiresAt != nil {
			expires = r.ExpiresAt.UTC().Format(time.RFC3339)
		}
		field("expires", "%s", expires)
	} else {
		field("lease", "no record of run %s of company %s (its bucket keeps one for a limited time); its events:", v.Ref.RunID, v.Ref.CompanyID)
	}
	if len(v.Events) == 0 {
		return
	}
	fmt.Fprintln(w, "last events:")
	p := printer{w: w}
	for _, r := range v.Events {
		p.print(r)
	}
}

func orNone(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
