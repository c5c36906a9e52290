package brokersvc

import (
	"context"
	"crypto/ecdh"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/mintproto"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// Minter is the part of broker.Store the mint service uses.
type Minter interface {
	Mint(ctx context.Context, r broker.MintRequest) (broker.Placeholder, broker.Grant, error)
}

var _ Minter = (*broker.Store)(nil)

// MintQueue is the queue group every broker replica's mint subscription joins: each request
// reaches one replica.
const MintQueue = "credential-broker"

// DefaultMintTimeout bounds one mint's writes to the grants bucket: a few KV requests, each
// answered in milliseconds; past it the client hears "unavailable" and retries (a retry is
// harmless: Mint is idempotent).
const DefaultMintTimeout = 5 * time.Second

// DefaultMintConcurrency is how many mints one replica serves at once.
const DefaultMintConcurrency = 16

// MintOptions configure NewMint.
type MintOptions struct {
	// NATS is the broker's connection. Required.
	NATS *nats.Conn
	// Subjects are the subjects of the installation's prefix.
	Subjects events.Subjects
	// Store mints the grants. Required.
	Store Minter
	// Bindings are the brokered keys and where each may go. Required.
	Bindings map[string]broker.Binding
	// Key opens the values requesters seal to the broker (mintproto.Seal): the broker's mint
	// key, broker.Sealer.MintKey. Required. Its public half is answered on the key subject.
	Key *ecdh.PrivateKey
	// Replies are the inboxes answers may go to (the zero Rule answers nobody): the plugin's,
	// and the workers' mint inbox (inbox.WorkersMintPrefix) for the dispatcher. Required.
	Replies inbox.Rule
	// Timeout bounds one mint (0: DefaultMintTimeout).
	Timeout time.Duration
	// Concurrency is how many mints run at once (0: DefaultMintConcurrency).
	Concurrency int
	// Registerer gets kubeclip_broker_mints_total (nil: not registered).
	Registerer prometheus.Registerer
	// Log gets one line per mint (ids, never the value or the placeholder).
	Log zerolog.Logger
}

// Mint is the mint service: a queue subscription on every mint subject, and one on the key
// subject answering the broker's public key.
type Mint struct {
	o       MintOptions
	subject mintproto.Subjects
	opener  *mintproto.Opener
	// keyReply is the key subject's answer, the same for every request.
	keyReply []byte
	mints    *prometheus.CounterVec
	ready    chan struct{}
}

// mintResults label kubeclip_broker_mints_total: "ok" and the codes of mintproto.
var mintResults = []string{"ok", string(mintproto.CodeInvalidRequest), string(mintproto.CodeUnknownKey), string(mintproto.CodeQuotaExceeded), string(mintproto.CodeUnavailable), "unanswerable"}

// NewMint checks o.
func NewMint(o MintOptions) (*Mint, error) {
	switch {
	case o.NATS == nil:
		return nil, errors.New("brokersvc.MintOptions.NATS is required")
	case o.Store == nil:
		return nil, errors.New("brokersvc.MintOptions.Store is required")
	case len(o.Bindings) == 0:
		return nil, errors.New("brokersvc.MintOptions.Bindings must name at least one brokered key")
	}
	opener, err := mintproto.NewOpener(o.Key)
	if err != nil {
		return nil, fmt.Errorf("brokersvc.MintOptions.Key: %w", err)
	}
	keyReply, err := json.Marshal(mintproto.KeyReply{PublicKey: base64.StdEncoding.EncodeToString(opener.PublicKey().Bytes())})
	if err != nil {
		return nil, err
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultMintTimeout
	}
	if o.Concurrency <= 0 {
		o.Concurrency = DefaultMintConcurrency
	}
	m := &Mint{o: o, subject: mintproto.NewSubjects(o.Subjects), opener: opener, keyReply: keyReply, ready: make(chan struct{})}
	m.mints = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kubeclip_broker_mints_total",
		Help: "Mint requests the credential broker answered, by result (ok, invalid_request, unknown_key, quota_exceeded, unavailable; unanswerable: a reply subject outside the client inboxes, dropped).",
	}, []string{"result"})
	for _, r := range mintResults {
		m.mints.WithLabelValues(r)
	}
	if o.Registerer != nil {
		if err := o.Registerer.Register(m.mints); err != nil {
			return nil, fmt.Errorf("registering kubeclip_broker_mints_total: %w", err)
		}
	}
	return m, nil
}

// Ready is closed once the subscription is in place.
func (m *Mint) Ready() <-chan struct{} { return m.ready }

// Run serves mint requests until ctx ends, then drains the subscription and waits for the
// mints in flight (each bounded by Timeout).
func (m *Mint) Run(ctx context.Context) error {
	msgs := make(chan *nats.Msg, m.o.Concurrency)
	sub, err := m.o.NATS.ChanQueueSubscribe(m.subject.MintFilter(), MintQueue, msgs)
	if err != nil {
		return fmt.Errorf("subscribing to %s: %w", m.subject.MintFilter(), err)
	}
	// The key's answer is constant and costs nothing: served on the connection's own goroutine.
	keySub, err := m.o.NATS.QueueSubscribe(m.subject.Key(), MintQueue, m.serveKey)
	if err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("subscribing to %s: %w", m.subject.Key(), err)
	}
	// The server has the subscriptions once a flush returns: from then on no request is lost.
	if err := m.o.NATS.FlushTimeout(m.o.Timeout); err != nil {
		_ = sub.Unsubscribe()
		_ = keySub.Unsubscribe()
		return fmt.Errorf("subscribing to %s: %w", m.subject.MintFilter(), err)
	}
	close(m.ready)
	var wg sync.WaitGroup
	for range m.o.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case msg := <-msgs:
					m.serve(context.WithoutCancel(ctx), msg)
				}
			}
		}()
	}
	<-ctx.Done()
	// Stop taking requests; those already delivered to this replica but not started get no
	// answer, and their clients retry (another replica, the same grant).
	_ = sub.Unsubscribe()
	_ = keySub.Unsubscribe()
	wg.Wait()
	return nil
}

// serveKey answers the broker's public key, into an allowed inbox only (as serve).
func (m *Mint) serveKey(msg *nats.Msg) {
	if !m.o.Replies.Allows(msg.Reply) {
		m.o.Log.Warn().Str(events.LogKeySubject, msg.Subject).Msg("a key request's reply subject is not an inbox the broker answers; dropped")
		return
	}
	if err := msg.Respond(m.keyReply); err != nil {
		m.o.Log.Warn().Err(err).Str(events.LogKeySubject, msg.Subject).Msg("answering a key request failed")
	}
}

// serve answers one request.
func (m *Mint) serve(ctx context.Context, msg *nats.Msg) {
	log := m.o.Log.With().Str(events.LogKeySubject, msg.Subject).Logger()
	if !m.o.Replies.Allows(msg.Reply) {
		// Answering anywhere but a client inbox would let a client have kubeclip publish a
		// placeholder onto a subject of its choice (pkg/inbox).
		m.mints.WithLabelValues("unanswerable").Inc()
		log.Warn().Msg("a mint request's reply subject is not a client inbox; dropped")
		return
	}
	ctx, cancel := context.WithTimeout(ctx, m.o.Timeout)
	defer cancel()
	reply := m.mint(ctx, log, msg)
	result := "ok"
	if reply.Error != nil {
		result = string(reply.Error.Code)
	}
	m.mints.WithLabelValues(result).Inc()
	data, err := json.Marshal(reply)
	if err != nil { // strings only: unreachable
		log.Error().Err(err).Msg("encoding a mint answer failed")
		return
	}
	if err := msg.Respond(data); err != nil {
		log.Warn().Err(err).Msg("answering a mint request failed")
	}
}

// mint decides one request's answer.
func (m *Mint) mint(ctx context.Context, log zerolog.Logger, msg *nats.Msg) mintproto.MintReply {
	fail := func(e *mintproto.Error) mintproto.MintReply { return mintproto.MintReply{Error: e} }
	company, run, err := m.subject.ParseMint(msg.Subject)
	if err != nil {
		return fail(mintproto.Invalid("subject", "must be %s with a company and run id as subject tokens", m.subject.MintFilter()))
	}
	log = log.With().Str(events.LogKeyTenant, company).Str(events.LogKeyRunID, run).Logger()
	req, err := mintproto.Decode(msg.Data)
	if err != nil {
		var e *mintproto.Error
		if errors.As(err, &e) {
			return fail(e)
		}
		return fail(mintproto.Invalid("", "request is not a mint request"))
	}
	if err := req.Validate(); err != nil {
		var e *mintproto.Error
		if errors.As(err, &e) {
			return fail(e)
		}
		return fail(mintproto.Invalid("", "request is not a mint request"))
	}
	binding, ok := m.o.Bindings[req.Key]
	if !ok {
		return fail(&mintproto.Error{Code: mintproto.CodeUnknownKey, Field: "key", Message: fmt.Sprintf("%q is not a brokered key (the broker's --bindings)", req.Key)})
	}
	value, err := m.opener.Open(req, mintproto.AAD(company, run, req.LeaseID, req.Key))
	if err != nil {
		var e *mintproto.Error
		if errors.As(err, &e) {
			return fail(e)
		}
		return fail(mintproto.Invalid("ciphertext", "does not open"))
	}
	br := broker.MintRequest{Company: company, Run: run, Lease: req.LeaseID, Key: req.Key, Binding: binding, Peer: req.Peer(), Value: string(value)}
	clear(value)
	if err := br.Validate(); err != nil {
		return fail(invalid(err))
	}
	p, g, err := m.o.Store.Mint(ctx, br)
	var qe *broker.QuotaError
	switch {
	case errors.As(err, &qe):
		log.Warn().Err(err).Msg("a mint was refused: the company holds its quota of grants")
		return fail(&mintproto.Error{Code: mintproto.CodeQuotaExceeded, Message: "kubeclip broker: " + qe.Error()})
	case err != nil:
		log.Warn().Err(err).Str("lease", req.LeaseID).Str("key", req.Key).Msg("a mint failed")
		return fail(&mintproto.Error{Code: mintproto.CodeUnavailable, Message: "kubeclip broker: the grant could not be stored now; retry (the broker's log says why)"})
	}
	log.Info().Str("lease", g.Lease).Str("key", g.Key).Str("grant", g.ID.String()).Msg("minted a placeholder")
	return mintproto.MintReply{Placeholder: p.Reveal(), GrantID: g.ID.String(), Hosts: g.Binding.Hosts}
}

// invalid is a validation error of broker.MintRequest as an answer naming its field.
func invalid(err error) *mintproto.Error {
	var fe *broker.FieldError
	if errors.As(err, &fe) {
		return mintproto.Invalid(mintField(fe.Field), "%s", fe.Reason)
	}
	if te, ok := events.AsTerminal(err); ok {
		return mintproto.Invalid(mintField(te.Field), "%v", te.Err)
	}
	return mintproto.Invalid("", "the request is not valid")
}

// mintField is a broker.MintRequest field's name in a mint request (the ids other than the
// lease come from the subject; the binding from the broker's own settings).
func mintField(f string) string {
	switch f {
	case "lease":
		return "leaseId"
	case "company", "run":
		return "subject"
	case "value":
		// The value's own rules (printable ASCII, its bound, no placeholder): it came sealed.
		return "ciphertext"
	}
	return f
}
