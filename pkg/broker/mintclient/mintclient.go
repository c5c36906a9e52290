// Package mintclient is the Go side of the credential broker's mint protocol
// (pkg/broker/mintproto; issue 27): it asks the broker's public key, seals each brokered key's
// real value to it and gets back the lease's placeholder. The dispatcher uses it for a run's
// Secret, so a brokered key's real value never reaches the Secret, the pod, or NATS in clear;
// the plugin's twin is plugins/paperclip/src/broker.ts.
//
// It fails closed: a broker that does not answer or refuses gives an *Error naming the key
// and the reason, never a value, and nothing to put in the Secret. Meaning says what that
// error means for a dispatch.
package mintclient

import (
	"context"
	"crypto/ecdh"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/broker/mintproto"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
)

// DefaultTimeout bounds one request to the broker: a mint is a few KV writes there (its own
// bound is 5 s, brokersvc.DefaultMintTimeout), so past 10 s it is not coming. The plugin waits
// as long (MINT_TIMEOUT_MS).
const DefaultTimeout = 10 * time.Second

// Options configure New.
type Options struct {
	// NATS is the requester's connection (the dispatcher's, user kubeclip). Required.
	NATS *nats.Conn
	// Subjects are the subjects of the installation's prefix.
	Subjects events.Subjects
	// InboxPrefix is where the broker's answers come (default inbox.WorkersMintPrefix; the
	// requester's user must subscribe there and the broker must answer there).
	InboxPrefix string
	// Timeout bounds each request (default DefaultTimeout).
	Timeout time.Duration
}

// Client mints placeholders.
type Client struct {
	o        Options
	subjects mintproto.Subjects
}

// New checks o.
func New(o Options) (*Client, error) {
	if o.NATS == nil {
		return nil, errors.New("mintclient.Options.NATS is required")
	}
	if o.InboxPrefix == "" {
		o.InboxPrefix = inbox.WorkersMintPrefix
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	return &Client{o: o, subjects: mintproto.NewSubjects(o.Subjects)}, nil
}

// Lease names the grant a mint is for: the run's company and run (the mint subject's tokens)
// and its lease (the created event's providerLeaseId).
type Lease struct {
	CompanyID, RunID, LeaseID string
}

// Error is a brokered key the broker gave no placeholder for. It names the key and the reason,
// never the value.
type Error struct {
	// Key is the brokered key's name.
	Key string
	// Refusal is the broker's answer when it refused (nil: it did not answer, or not sensibly).
	Refusal *mintproto.Error
	// Reason says what went wrong when the broker did not refuse.
	Reason string
}

func (e *Error) Error() string {
	reason := e.Reason
	if e.Refusal != nil {
		reason = "the broker refused (" + e.Refusal.Error() + ")"
	}
	return fmt.Sprintf("%s: is brokered but the credential broker gave no placeholder for it: %s; nothing was created (a brokered key never goes into a run's Secret as its real value)", e.Key, reason)
}

// Placeholders returns env with each of keys' non-empty values replaced by the lease's
// placeholder for it (env itself is not changed). A value that already is a placeholder is
// kept. Another key holding a brokered key's value gets the same placeholder: the value is
// what must not reach the pod, whatever its name (as the plugin does). It asks the broker's
// key once, then mints each key; the first failure is an *Error and nothing is returned.
func (c *Client) Placeholders(ctx context.Context, lease Lease, keys []string, env map[string]string) (map[string]string, error) {
	var todo []string
	for _, k := range keys {
		if v := env[k]; v != "" && !isPlaceholder(v) {
			todo = append(todo, k)
		}
	}
	if len(todo) == 0 {
		return env, nil
	}
	pub, err := c.Key(ctx)
	if err != nil {
		return nil, &Error{Key: todo[0], Reason: err.Error()}
	}
	out := maps.Clone(env)
	byValue := make(map[string]string, len(todo))
	for _, k := range todo {
		r, err := c.Mint(ctx, pub, lease, k, env[k])
		if err != nil {
			return nil, err
		}
		out[k] = r.Placeholder
		if _, ok := byValue[env[k]]; !ok {
			byValue[env[k]] = r.Placeholder
		}
	}
	for k, v := range env {
		if p, ok := byValue[v]; ok && !slices.Contains(keys, k) {
			out[k] = p
		}
	}
	return out, nil
}

// Key asks the broker's public key (mintproto: the key subject).
func (c *Client) Key(ctx context.Context) (*ecdh.PublicKey, error) {
	data, err := c.request(ctx, c.subjects.Key(), nil)
	if err != nil {
		return nil, err
	}
	k, err := mintproto.ParseKeyReply(data)
	if err != nil {
		var refusal *mintproto.Error
		if errors.As(err, &refusal) {
			return nil, fmt.Errorf("the broker refused its key (%w)", refusal)
		}
		return nil, err
	}
	return k, nil
}

// Mint seals value to pub for the lease's key and returns the broker's answer; a refusal or a
// broker that does not answer is an *Error naming key.
func (c *Client) Mint(ctx context.Context, pub *ecdh.PublicKey, lease Lease, key, value string) (mintproto.MintReply, error) {
	subject, err := c.subjects.Mint(lease.CompanyID, lease.RunID)
	if err != nil {
		return mintproto.MintReply{}, &Error{Key: key, Reason: "the run's ids make no mint subject: " + err.Error()}
	}
	sealed, err := mintproto.Seal(pub, mintproto.AAD(lease.CompanyID, lease.RunID, lease.LeaseID, key), []byte(value))
	if err != nil {
		return mintproto.MintReply{}, &Error{Key: key, Reason: err.Error()}
	}
	body, err := json.Marshal(mintproto.MintRequest{LeaseID: lease.LeaseID, Key: key, EphemeralKey: sealed.EphemeralKey, Nonce: sealed.Nonce, Ciphertext: sealed.Ciphertext})
	if err != nil {
		return mintproto.MintReply{}, &Error{Key: key, Reason: "encoding the request failed"}
	}
	data, err := c.request(ctx, subject, body)
	if err != nil {
		return mintproto.MintReply{}, &Error{Key: key, Reason: err.Error()}
	}
	var r mintproto.MintReply
	if err := json.Unmarshal(data, &r); err != nil {
		return r, &Error{Key: key, Reason: "the broker's answer is not a mint reply"}
	}
	if r.Error != nil {
		return r, &Error{Key: key, Refusal: r.Error}
	}
	if !isPlaceholder(r.Placeholder) {
		return r, &Error{Key: key, Reason: "the broker's answer holds no well-formed placeholder"}
	}
	return r, nil
}

// request sends one core NATS request whose answer comes to a fresh inbox under InboxPrefix
// (the connection's own inbox prefix is one no responder answers into). Errors say what
// happened, never the payload.
func (c *Client) request(ctx context.Context, subject string, body []byte) ([]byte, error) {
	var token [16]byte
	if _, err := rand.Read(token[:]); err != nil {
		return nil, fmt.Errorf("drawing an inbox: %w", err)
	}
	reply := c.o.InboxPrefix + "." + hex.EncodeToString(token[:])
	sub, err := c.o.NATS.SubscribeSync(reply)
	if err != nil {
		return nil, fmt.Errorf("subscribing to the broker's answer: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := sub.AutoUnsubscribe(1); err != nil {
		return nil, fmt.Errorf("subscribing to the broker's answer: %w", err)
	}
	if err := c.o.NATS.PublishRequest(subject, reply, body); err != nil {
		return nil, fmt.Errorf("sending the request: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, c.o.Timeout)
	defer cancel()
	msg, err := sub.NextMsgWithContext(ctx)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		// The server's own answer to a request nobody is subscribed to.
		return nil, errors.New("no broker answers (it is down or not deployed)")
	case errors.Is(err, context.DeadlineExceeded):
		return nil, fmt.Errorf("the broker did not answer within %s", c.o.Timeout)
	case err != nil:
		return nil, fmt.Errorf("waiting for the broker's answer: %w", err)
	}
	return msg.Data, nil
}

// Meaning is what a mint error means for a dispatch, decided here once: every failure ends the
// dispatch at once, before anything is created (the Secret is rendered first), with a message
// that names the key and never a value. A broker that does not answer is not retried by
// redelivery: like the plugin's execute, a brokered run fails closed and its caller (Paperclip)
// decides whether to run again; a redelivery would hold the lease's dispatch for minutes of
// backoff behind a broker that is down. A company over its grant quota is its quota; anything
// else is the installation's (a key the dispatcher's --brokered-keys names but the broker's
// bindings do not, a broker down).
func Meaning(err error) error {
	var e *Error
	if err == nil || !errors.As(err, &e) {
		return err
	}
	msg := e.Error()
	switch {
	case e.Refusal != nil && e.Refusal.Code == mintproto.CodeQuotaExceeded:
		return &events.TerminalError{Code: events.CodeQuotaExceeded, Err: err, Message: msg}
	case e.Refusal == nil, e.Refusal.Code == mintproto.CodeUnavailable:
		return &events.TerminalError{Code: events.CodeBackendUnavailable, Err: err, Message: msg}
	}
	return &events.TerminalError{Code: events.CodeInternal, Err: err, Message: msg}
}

func isPlaceholder(v string) bool {
	_, err := broker.ParsePlaceholder(v)
	return err == nil
}
