package ops

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"

	"github.com/nats-io/nats.go"
)

// NATSProbes probes NATS permissions on a connection of their own, made with the worker's
// credentials and inbox prefix: the server tells a permission violation only asynchronously
// (nats.ErrPermissionViolation in the error handler), and this connection's handler is the
// probes' alone.
//
// A publish is probed with a request that no stream captures and no one answers: the server
// answers "no responders" when the publish was allowed; JetStream API subjects (STREAM.INFO,
// CONSUMER.INFO) are read-only requests that JetStream answers. A subscription is probed with
// subscribe, flush, unsubscribe.
type NATSProbes struct {
	dial func(opts ...nats.Option) (*nats.Conn, error)

	mu      sync.Mutex
	nc      *nats.Conn
	waiters map[string][]chan struct{} // "publish <subject>" or "subscribe <subject>"
}

// NewNATSProbes returns probes that connect with dial, which must apply the worker's
// credentials and inbox prefix and then opts. Close the probes when the self-check ended.
func NewNATSProbes(dial func(opts ...nats.Option) (*nats.Conn, error)) *NATSProbes {
	return &NATSProbes{dial: dial, waiters: map[string][]chan struct{}{}}
}

// Close closes the probes' connection.
func (p *NATSProbes) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.nc != nil {
		p.nc.Close()
		p.nc = nil
	}
}

// Publish is the permission to publish to subject, which no stream may capture (or a JetStream
// API subject that only reads).
func (p *NATSProbes) Publish(subject string) Permission {
	return Permission{Kind: PermissionNATS, Name: "publish " + subject, Probe: func(ctx context.Context) (bool, error) {
		return p.probePublish(ctx, subject)
	}}
}

// Subscribe is the permission to subscribe to subject (without a queue group: a probe in the
// worker's queue group could take a request from the worker).
func (p *NATSProbes) Subscribe(subject string) Permission {
	return Permission{Kind: PermissionNATS, Name: "subscribe " + subject, Probe: func(ctx context.Context) (bool, error) {
		return p.probeSubscribe(ctx, subject)
	}}
}

// violationRe finds the operation and subject in the server's permissions violation, such as
// `Permissions Violation for Publish to "x.y"` or `... for Subscription to "x.>" using queue "q"`.
var violationRe = regexp.MustCompile(`(?i)for (Publish|Subscription) to "([^"]+)"`)

// violation is the connection's error handler: it wakes the probes waiting on the subject.
func (p *NATSProbes) violation(_ *nats.Conn, _ *nats.Subscription, err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	m := violationRe.FindStringSubmatch(err.Error())
	if m == nil {
		return
	}
	key := "publish " + m[2]
	if m[1] == "Subscription" || m[1] == "subscription" {
		key = "subscribe " + m[2]
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ch := range p.waiters[key] {
		close(ch)
	}
	delete(p.waiters, key)
}

// conn returns the probes' connection, connecting when there is none (or it was closed), and a
// channel closed when the server reports a violation of key.
func (p *NATSProbes) conn(key string) (*nats.Conn, chan struct{}, func(), error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.nc == nil || p.nc.IsClosed() {
		nc, err := p.dial(nats.PermissionErrOnSubscribe(true), nats.ErrorHandler(p.violation))
		if err != nil {
			return nil, nil, nil, fmt.Errorf("connecting to NATS: %w", err)
		}
		p.nc = nc
	}
	ch := make(chan struct{})
	p.waiters[key] = append(p.waiters[key], ch)
	done := func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		ws := p.waiters[key]
		for i, w := range ws {
			if w == ch {
				p.waiters[key] = append(ws[:i:i], ws[i+1:]...)
				break
			}
		}
		if len(p.waiters[key]) == 0 {
			delete(p.waiters, key)
		}
	}
	return p.nc, ch, done, nil
}

func (p *NATSProbes) probePublish(ctx context.Context, subject string) (bool, error) {
	ctx, cancel := probeContext(ctx)
	defer cancel()
	nc, denied, done, err := p.conn("publish " + subject)
	if err != nil {
		return false, err
	}
	defer done()
	answered := make(chan error, 1)
	go func() {
		_, err := nc.RequestWithContext(ctx, subject, nil)
		answered <- err
	}()
	select {
	case <-denied:
		return false, nil
	case err := <-answered:
		switch {
		case err == nil, errors.Is(err, nats.ErrNoResponders):
			return true, nil
		case ctx.Err() != nil:
			return false, fmt.Errorf("no answer and no permissions violation for publish to %s: %w", subject, err)
		}
		return false, fmt.Errorf("publishing to %s: %w", subject, err)
	}
}

func (p *NATSProbes) probeSubscribe(ctx context.Context, subject string) (bool, error) {
	ctx, cancel := probeContext(ctx) // a flush needs a deadline
	defer cancel()
	nc, _, done, err := p.conn("subscribe " + subject)
	if err != nil {
		return false, err
	}
	defer done()
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		return false, fmt.Errorf("subscribing to %s: %w", subject, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	// The server handles the SUB before the PING of the flush and answers in order, and the
	// client records a violation on the subscription as it reads it: after the PONG the
	// subscription knows (nats.PermissionErrOnSubscribe).
	if err := nc.FlushWithContext(ctx); err != nil {
		return false, fmt.Errorf("subscribing to %s: %w", subject, err)
	}
	if _, err := sub.NextMsg(0); errors.Is(err, nats.ErrPermissionViolation) {
		return false, nil
	}
	return true, nil
}

// probeContext bounds a probe by DefaultProbeTimeout unless ctx has a deadline already.
func probeContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, DefaultProbeTimeout)
}
