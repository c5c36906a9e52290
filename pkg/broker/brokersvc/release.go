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
// (events.BrokerReleaseConsumerConfig):
//
//   - status, Pending or Running, naming the pod's IP (events.RunStatusEvent.PodIP): the run's
//     grants are bound to it, and the run's grants minted later are born bound
//     (Store.BindRun), so a placeholder carried out of its pod is refused from any other
//     address (broker.ReasonWrongPeer). Every backend's run-watcher names its pod's IP: a Job's
//     pod, an exec pod, a Sandbox's pod, a warm pod bound to the run. A reusable lease's events
//     all go to the run that acquired it, whose id every mint of the lease names (the plugin's
//     lease metadata keeps it across resumes), and a retained lease keeps its pod and the
//     remembered peer across its releases; a lease suspended and resumed onto a new pod ends
//     the run's watch (its result forgets the peer), so the grants of its later runs are
//     unbound. A status that ends the run, or names no IP, binds nothing;
//   - released: the lease's grants (Store.Release by the event's providerLeaseId), so a lease's
//     placeholders stop resolving as soon as its release is confirmed;
//   - result: the run's grants (Store.ReleaseRun): the run ended, whatever its lease (a
//     reusable lease's next run mints its own);
//   - failed, for an acquire: the run's grants, minted for a lease that never came to be. A
//     failed release or resume leaves the lease, and its grants, as they were.
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
	case events.KindStatus:
		return r.bind(ctx, log, m.Data(), company, run)
	case events.KindReleased:
		var ev struct {
			ProviderLeaseID string `json:"providerLeaseId"`
		}
		if err := json.Unmarshal(m.Data(), &ev); err != nil {
			return events.Terminal(events.CodeInvalidRequest, "", fmt.Errorf("decoding a released event: %w", err))
		}
		if events.ValidateToken("providerLeaseId", ev.ProviderLeaseID) != nil {
			n, err = r.o.Store.ReleaseRun(ctx, company, run) // no lease to name: the run's
		} else {
			n, err = r.o.Store.Release(ctx, company, ev.ProviderLeaseID)
		}
	case events.KindResult:
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

// bind binds the run's grants to the pod a status event names.
func (r *Releaser) bind(ctx context.Context, log zerolog.Logger, data []byte, company, run string) error {
	var ev struct {
		Phase events.Phase `json:"phase"`
		PodIP string       `json:"podIp"`
	}
	if err := json.Unmarshal(data, &ev); err != nil {
		return events.Terminal(events.CodeInvalidRequest, "", fmt.Errorf("decoding a status event: %w", err))
	}
	if ev.PodIP == "" || (ev.Phase != events.PhasePending && ev.Phase != events.PhaseRunning) {
		// No pod yet; or the run's end, whose result releases its grants: a bind now would
		// only leave a remembered peer behind a redelivered result.
		return nil
	}
	peer, err := netip.ParseAddr(ev.PodIP)
	if err != nil {
		return events.Terminal(events.CodeInvalidRequest, "podIp", fmt.Errorf("decoding a status event's podIp: %w", err))
	}
	n, err := r.o.Store.BindRun(ctx, company, run, peer)
	if err != nil {
		return fmt.Errorf("binding the run's grants to its pod: %w", err)
	}
	log.Info().Int("grants", n).Str("peer", peer.String()).Msg("bound the run's grants to its pod")
	return nil
}
