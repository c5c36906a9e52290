package brokersvc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// Ender is the part of broker.Store the Releaser uses.
type Ender interface {
	Release(ctx context.Context, company, lease string) (int, error)
	ReleaseRun(ctx context.Context, company, run string) (int, error)
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

// Releaser releases grants as the run stream reports the ends of leases and runs, through the
// durable consumer every broker replica shares (events.BrokerReleaseConsumerConfig):
//
//   - released: the lease's grants (Store.Release by the event's providerLeaseId), so a lease's
//     placeholders stop resolving as soon as its release is confirmed;
//   - result: the run's grants (Store.ReleaseRun): the run ended, whatever its lease (a
//     reusable lease's next run mints its own);
//   - failed, for an acquire: the run's grants, minted for a lease that never came to be. A
//     failed release or resume leaves the lease, and its grants, as they were.
//
// Deletes are idempotent, so a redelivered event is harmless; a store error is retried by the
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
