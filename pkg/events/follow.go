package events

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrStopFollowing is returned by a Follow callback to end Follow without an error.
var ErrStopFollowing = errors.New("stop following")

// OrderedConsumerMaker is the part of jetstream.JetStream Follow needs.
type OrderedConsumerMaker interface {
	OrderedConsumer(ctx context.Context, stream string, cfg jetstream.OrderedConsumerConfig) (jetstream.Consumer, error)
}

var _ OrderedConsumerMaker = (jetstream.JetStream)(nil)

// FollowOptions selects where Follow starts; by default at the run's first event.
type FollowOptions struct {
	// StartSeq starts at this stream sequence.
	StartSeq uint64
	// StartTime starts at the first event stored at or after this time (ignored with StartSeq).
	StartTime time.Time
}

// Received is one run event as Follow delivers it.
type Received struct {
	// Event is the decoded payload (RunCreatedEvent, RunLogEvent, ...); nil when Err is set.
	Event Event
	// Err says why the message could not be decoded.
	Err error
	// Subject and StreamSeq locate the message in the run stream; Published is when the stream
	// stored it.
	Subject   string
	StreamSeq uint64
	Published time.Time
	// Pending is how many of the run's events the stream held after this one when it was
	// delivered: 0 means the reader has caught up with the history.
	Pending uint64
}

// Follow delivers a run's events, its history first and then live, to fn in stream order, with
// an ordered consumer (nothing to clean up, nothing acked). It returns nil when fn returns
// ErrStopFollowing, fn's other errors as they are, and ctx.Err() when ctx ends. An empty
// companyID follows the run whatever company it belongs to.
//
// A Paperclip consumer that restarts rebuilds its view of a run by following it from the start,
// or from the StreamSeq after the last event it applied: events are applied idempotently, log
// chunks come in seq order and the result comes once.
func Follow(ctx context.Context, js OrderedConsumerMaker, s Subjects, companyID, runID string, opts FollowOptions, fn func(Received) error) error {
	filter, err := s.RunFilter(companyID, runID)
	if companyID == "" {
		filter, err = s.AnyCompanyRunFilter(runID)
	}
	if err != nil {
		return err
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}, DeliverPolicy: jetstream.DeliverAllPolicy}
	switch {
	case opts.StartSeq > 0:
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, opts.StartSeq
	case !opts.StartTime.IsZero():
		start := opts.StartTime
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &start
	}
	cons, err := js.OrderedConsumer(ctx, s.RunStream(), cfg)
	if err != nil {
		return fmt.Errorf("following run %s: %w", runID, err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("following run %s: %w", runID, err)
	}
	defer it.Stop()
	var subj followedSubject
	for {
		m, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("following run %s: %w", runID, err)
		}
		if m.Subject() != subj.subject {
			subj = parseFollowedSubject(s, m.Subject())
		}
		if subj.err != nil || m.Headers().Get(HeaderType) != subj.ceType {
			continue // stored on a run subject by JetStream for someone's reply, not kubeclip's
		}
		r := Received{Subject: m.Subject()}
		if meta, err := m.Metadata(); err == nil {
			r.StreamSeq, r.Published, r.Pending = meta.Sequence.Stream, meta.Timestamp, meta.NumPending
		}
		r.Event, r.Err = decodeRunEvent(subj.companyID, subj.runID, subj.kind, m.Data())
		if err := fn(r); err != nil {
			if errors.Is(err, ErrStopFollowing) {
				return nil
			}
			return err
		}
	}
}

// followedSubject is a run subject parsed for Follow, with the ce-type its events carry (see
// IsRunEvent). A run's messages come on a handful of subjects, mostly one after the other on
// its log subject: Follow parses a subject only when it differs from the previous message's.
type followedSubject struct {
	subject, companyID, runID string
	kind                      RunKind
	ceType                    string
	err                       error
}

func parseFollowedSubject(s Subjects, subject string) followedSubject {
	f := followedSubject{subject: subject}
	f.companyID, f.runID, f.kind, f.err = s.ParseRunSubject(subject)
	if f.err == nil {
		f.ceType = EncodeHeaderValue(runType(f.kind))
	}
	return f
}
