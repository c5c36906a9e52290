package events

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// JetStreamPublisher is the part of jetstream.JetStream the Publisher needs.
type JetStreamPublisher interface {
	PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}

var _ JetStreamPublisher = (jetstream.JetStream)(nil)

// PublisherOptions configures a Publisher.
type PublisherOptions struct {
	// JS publishes the messages; required.
	JS JetStreamPublisher
	// Subjects carries the prefix; the zero value means DefaultPrefix.
	Subjects Subjects
	// Now stamps events that carry no time and sets ce-time; defaults to time.Now.
	Now func() time.Time
	// Observer is told about every Publish call (metrics); nil means none.
	Observer PublishObserver
}

// Publisher publishes contract events with their subject, message id and CloudEvents headers.
// It is safe for concurrent use.
type Publisher struct {
	js       JetStreamPublisher
	subjects Subjects
	now      func() time.Time
	observer PublishObserver
}

// NewPublisher validates opts and returns a Publisher.
func NewPublisher(opts PublisherOptions) (*Publisher, error) {
	if opts.JS == nil {
		return nil, errors.New("events: PublisherOptions.JS is required")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Publisher{js: opts.JS, subjects: opts.Subjects, now: opts.Now, observer: opts.Observer}, nil
}

// Msg builds the NATS message for ev without publishing it: subject, JSON body, Nats-Msg-Id
// and the CloudEvents headers. An event that fails validation is an error (a TerminalError when
// it is about a field).
func (p *Publisher) Msg(ev Event) (*nats.Msg, error) {
	msg, _, err := p.build(ev)
	return msg, err
}

func (p *Publisher) build(ev Event) (*nats.Msg, address, error) {
	if ev == nil {
		return nil, address{}, errors.New("events: nil event")
	}
	now := p.now()
	ev = ev.stamp(now)
	addr, err := ev.address(p.subjects)
	if err != nil {
		return nil, address{}, fmt.Errorf("addressing %s event: %w", ev.Type(), err)
	}
	data, err := marshal(ev)
	if err != nil {
		return nil, address{}, fmt.Errorf("encoding %s event: %w", ev.Type(), err)
	}
	if len(data) > DefaultMaxMsgSize {
		return nil, address{}, fmt.Errorf("encoding %s event: payload is %d bytes, more than the %d-byte limit", ev.Type(), len(data), DefaultMaxMsgSize)
	}
	t := ev.eventTime()
	if t.IsZero() {
		t = now
	}
	msg := nats.NewMsg(addr.subject)
	msg.Data = data
	setCEHeaders(msg.Header, ev, addr, t)
	return msg, addr, nil
}

// Publish publishes ev and waits for the stream's acknowledgement. The message id makes a
// republished event a no-op inside the stream's duplicate window (PubAck.Duplicate reports it),
// and the expected-stream check refuses to store an event in a stream other than the contract's.
//
// opts add publish expectations, such as jetstream.WithExpectLastSequencePerSubject, which the
// run-watcher uses to fence a run's log against a second writer.
func (p *Publisher) Publish(ctx context.Context, ev Event, opts ...jetstream.PublishOpt) (ack *jetstream.PubAck, err error) {
	if p.observer != nil {
		defer p.observe(ev, time.Now(), &ack, &err)
	}
	msg, addr, err := p.build(ev)
	if err != nil {
		return nil, err
	}
	opts = append([]jetstream.PublishOpt{jetstream.WithMsgID(addr.msgID), jetstream.WithExpectStream(addr.stream)}, opts...)
	ack, err = p.js.PublishMsg(ctx, msg, opts...)
	if err != nil {
		return nil, fmt.Errorf("publishing %s: %w", msg.Subject, err)
	}
	return ack, nil
}

// observe reports a finished Publish to the observer.
func (p *Publisher) observe(ev Event, start time.Time, ack **jetstream.PubAck, err *error) {
	pub := Publication{Event: ev, Err: *err, Duration: time.Since(start)}
	if ev != nil {
		if addr, aerr := ev.address(p.subjects); aerr == nil {
			pub.Subject = addr.subject
		}
	}
	if *ack != nil {
		pub.Duplicate = (*ack).Duplicate
	}
	p.observer.EventPublished(pub)
}
