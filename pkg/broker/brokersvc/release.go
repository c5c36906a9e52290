package brokersvc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// Ender is the part of broker.Store the Releaser uses.
type Ender interface {
	Release(ctx context.Context, company, lease string) (int, error)
	ReleaseRun(ctx context.Context, company, run string) (int, error)
	BindRun(ctx context.Context, company, run string, peer netip.Addr) (int, error)
}

var _ Ender = (*broker.Store)(nil)

// ReleaserOptions configure NewReleaser.
type ReleaserOptions struct {
	// JetStream holds the run stream. Required.
	JetStream events.ConsumerMaker
	// Subjects are the subjects of the installation's prefix.
	Subjects events.Subjects
	// Store deletes the grants. Required.
	Store Ender
	// Log gets one line per release.
	Log zerolog.Logger
	// Consume tunes the consume loop (its Logger is Log).
	Consume events.ConsumeOptions
}

// Releaser binds grants to their pods and releases them as the run stream reports the pods and
// the ends of leases and runs, through the durable consumer every broker replica shares
// (events.BrokerReleaseConsumerConfig). It is the one place that decides a grant's pod:
//
//   - status, Pending or Running, naming the pod's IP (events.RunStatusEvent.PodIP): the run's
//     grants are bound to it, and the run's grants minted later are born bound
//     (Store.BindRun). Every backend's run-watcher names its pod's IP as soon as Kubernetes
//     assigns it, before the pod's agent can run anything: a Job's pod, an exec pod, a
//     Sandbox's pod, a warm pod bound to the run (pkg/runwatch TestStatusCarriesThePodIP). A
//     status that ends the run, or names no IP, binds nothing;
//   - resumed, naming the pod that serves a reusable lease now (events.RunResumedEvent.PodIP):
//     the same bind. A reusable lease's events all go to the run that acquired it, whose id
//     every mint of the lease names (the plugin's lease metadata keeps it across resumes). A
//     retained lease keeps its pod, and its resume names the same address; a lease suspended
//     and resumed onto a new pod ended the run's watch with its first pod (its result released
//     the run's grants and forgot the peer), so this event is the only one naming the new pod;
//   - released: the lease's grants (Store.Release by the event's providerLeaseId), so a lease's
//     placeholders stop resolving as soon as its release is confirmed;
//   - result: the run's grants (Store.ReleaseRun): the run ended, whatever its lease (a
//     reusable lease's next run mints its own);
//   - suspended: the same, and the remembered peer with them: the reusable lease's pod is gone,
//     and Kubernetes may give its address to another pod. A lease resumed onto a new pod and
//     suspended again has no result to say so (the run's watch ended with its first pod). The
//     next run's mints, after the resume, are bound to the pod its resumed event names;
//   - failed, for an acquire: the run's grants, minted for a lease that never came to be. A
//     failed release or resume leaves the lease, and its grants, as they were.
//
// A grant bound to no pod resolves from no address (broker.ReasonUnbound): a call that comes
// before its binding waits for it a moment (proxy.Options.BindWait), so a placeholder carried
// out of its pod before the binding is of no use elsewhere, and once bound a request from any
// other address is refused (broker.ReasonWrongPeer).
//
// Binds and deletes are idempotent, so a redelivered event is harmless; a store error is retried by the
// consume loop (events.Consume), and an event that does not decode is dropped as terminal.
type Releaser struct {
	o     ReleaserOptions
	ready chan struct{}
}

// NewReleaser checks o.
func NewReleaser(o ReleaserOptions) (*Releaser, error) {
	switch {
	case o.JetStream == nil:
		return nil, errors.New("brokersvc.ReleaserOptions.JetStream is required")
	case o.Store == nil:
		return nil, errors.New("brokersvc.ReleaserOptions.Store is required")
	}
	o.Consume.Logger = o.Log
	return &Releaser{o: o, ready: make(chan struct{})}, nil
}

// Ready is closed once the consumer exists: from then on no end of a lease is missed.
func (r *Releaser) Ready() <-chan struct{} { return r.ready }

// Run creates the consumer and releases until ctx ends, then drains (events.Consume).
func (r *Releaser) Run(ctx context.Context) error {
	cons, err := events.EnsureConsumer(ctx, r.o.JetStream, r.o.Subjects.RunStream(), events.BrokerReleaseConsumerConfig(r.o.Subjects))
	if err != nil {
		return err
	}
	close(r.ready)
	return events.Consume(ctx, cons, r.handle, r.o.Consume)
}

// handle releases what one event ends.
func (r *Releaser) handle(ctx context.Context, m jetstream.Msg) error {
	company, run, kind, err := r.o.Subjects.ParseRunSubject(m.Subject())
	if err != nil {
		return events.Terminal(events.CodeInvalidRequest, "", err)
	}
	log := r.o.Log.With().Str(events.LogKeyTenant, company).Str(events.LogKeyRunID, run).Str("kind", string(kind)).Logger()
	var n int
	switch kind {
	case events.KindStatus, events.KindResumed:
		return r.bind(ctx, log, kind, m.Data(), company, run)
	case events.KindReleased:
		var ev struct {
			ProviderLeaseID string `json:"providerLeaseId"`
			Unknown         bool   `json:"unknown"`
		}
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			return events.Terminal(events.CodeInvalidRequest, "", fmt.Errorf("decoding a released event: %w", err))
		}
		if ev.Unknown {
			// The receipt of a release of a lease the company did not have: nothing ended, and
			// the lease id it echoes may be one of the company's live leases, misnamed.
			return nil
		}
		if events.ValidateToken("providerLeaseId", ev.ProviderLeaseID) != nil {
			n, err = r.o.Store.ReleaseRun(ctx, company, run) // no lease to name: the run's
		} else {
			n, err = r.o.Store.Release(ctx, company, ev.ProviderLeaseID)
		}
	case events.KindResult, events.KindSuspended:
		n, err = r.o.Store.ReleaseRun(ctx, company, run)
	case events.KindFailed:
		var ev struct {
			Request events.LeaseKind `json:"request"`
		}
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			return events.Terminal(events.CodeInvalidRequest, "", fmt.Errorf("decoding a failed event: %w", err))
		}
		if ev.Request != events.LeaseAcquire {
			return nil
		}
		n, err = r.o.Store.ReleaseRun(ctx, company, run)
	default:
		return nil // not an end (the consumer's filter takes none)
	}
	if err != nil {
		return fmt.Errorf("releasing the grants the %s event ends: %w", kind, err)
	}
	if n > 0 {
		log.Info().Int("grants", n).Msg("released grants")
	}
	return nil
}

// bind binds the run's grants to the pod a status or resumed event names.
func (r *Releaser) bind(ctx context.Context, log zerolog.Logger, kind events.RunKind, data []byte, company, run string) error {
	var ev struct {
		Phase events.Phase `json:"phase"`
		PodIP string       `json:"podIp"`
	}
	if err := json.Unmarshal(data, &ev); err != nil {
		return events.Terminal(events.CodeInvalidRequest, "", fmt.Errorf("decoding a %s event: %w", kind, err))
	}
	if ev.PodIP == "" {
		return nil // no pod yet (or a resumed event from a dispatcher before podIp)
	}
	if kind == events.KindStatus && ev.Phase != events.PhasePending && ev.Phase != events.PhaseRunning {
		// The run's end, whose result releases its grants: a bind now would only leave a
		// remembered peer behind a redelivered result.
		return nil
	}
	peer, err := netip.ParseAddr(ev.PodIP)
	if err != nil {
		return events.Terminal(events.CodeInvalidRequest, "podIp", fmt.Errorf("decoding a %s event's podIp: %w", kind, err))
	}
	n, err := r.o.Store.BindRun(ctx, company, run, peer)
	if err != nil {
		return fmt.Errorf("binding the run's grants to its pod: %w", err)
	}
	log.Info().Int("grants", n).Str("peer", peer.String()).Msg("bound the run's grants to its pod")
	return nil
}
