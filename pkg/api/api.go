// Package api is kubeclip's request/reply service for clients on core NATS (not JetStream:
// nothing here is worth keeping): `<prefix>.api.validate` gives pkg/policy's verdict on a
// provider config, so the Paperclip plugin shows exactly what an acquire would be refused for
// without a second implementation of the rules; `<prefix>.api.ping` tells which workers are up.
package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/inbox"
	"github.com/kubeclip/kubeclip/pkg/policy"
	"github.com/kubeclip/kubeclip/pkg/strictjson"
)

// QueueGroup spreads validate requests over a worker's replicas.
const QueueGroup = "kubeclip-api"

// maxRequestBytes bounds a validate request: a provider config is a few KiB.
const maxRequestBytes = events.DefaultMaxMsgSize

// ValidateSubject and PingSubject are the service's subjects under prefix.
func ValidateSubject(s events.Subjects) string { return s.Prefix() + ".api.validate" }

// PingSubject is answered by every worker replica.
func PingSubject(s events.Subjects) string { return s.Prefix() + ".api.ping" }

// ValidateRequest asks for the verdict on a provider config.
type ValidateRequest struct {
	Config json.RawMessage `json:"config"`
}

// ValidateReply is the verdict: the config's errors, each naming its field under "config.", and
// when it is valid the config with every default applied.
type ValidateReply struct {
	OK               bool           `json:"ok"`
	Errors           []FieldError   `json:"errors"`
	Warnings         []string       `json:"warnings"`
	NormalizedConfig *policy.Config `json:"normalizedConfig,omitempty"`
}

// FieldError is one refused field.
type FieldError struct {
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

// PingReply is one worker replica saying it is up.
type PingReply struct {
	Worker  string `json:"worker"`
	Replica string `json:"replica"`
	Version string `json:"version"`
}

// Validate is the verdict an acquire with cfg would get before anything reaches the cluster:
// the config parsed and checked as pkg/policy does, and the operator's policy (allowed
// namespace prefixes, reserved namespaces, adapter keys, egress bounds, the image allowlist)
// applied. The
// tenant namespace depends on the company, which a config alone does not name; it is checked
// with the config's companySlug when it sets one.
func Validate(raw json.RawMessage, op policy.Operator) ValidateReply {
	op = op.WithDefaults()
	cfg, err := policy.ParseConfig(raw)
	if err == nil {
		err = op.CheckConfig(cfg)
	}
	if err == nil {
		slug := cfg.CompanySlug
		if slug == "" {
			slug = "company"
		}
		err = op.CheckNamespace(cfg, cfg.NamespacePrefix+slug)
	}
	if err == nil {
		var adapter policy.AdapterDefaults
		if adapter, err = cfg.Adapter(cfg.AdapterType); err == nil {
			if _, ierr := op.ResolveImage("", adapter, cfg); ierr != nil {
				err = ierr
				if ine := (*policy.ImageNotAllowedError)(nil); errors.As(ierr, &ine) {
					err = &policy.ValidationError{Errors: []policy.FieldError{{Field: ine.Field, Message: ierr.Error()}}}
				}
			}
		}
	}
	if err != nil {
		return ValidateReply{Errors: fieldErrors(err), Warnings: []string{}}
	}
	return ValidateReply{OK: true, Errors: []FieldError{}, Warnings: []string{}, NormalizedConfig: &cfg}
}

func fieldErrors(err error) []FieldError {
	var ve *policy.ValidationError
	if !errors.As(err, &ve) {
		return []FieldError{{Field: "config", Message: err.Error()}}
	}
	out := make([]FieldError, len(ve.Errors))
	for i, fe := range ve.Errors {
		out[i] = FieldError{Field: configField(fe.Field), Message: fe.Message}
	}
	return out
}

// configField places a config-relative path under "config", as an acquire's failed event
// names it.
func configField(path string) string {
	switch {
	case path == "config":
		return path
	case strings.HasPrefix(path, "["):
		return "config" + path
	}
	return "config." + path
}

// ServeOptions are what both services need to answer.
type ServeOptions struct {
	Subjects events.Subjects
	// Replies are the inboxes the services answer into (pkg/inbox): a reply is published with
	// the worker's permissions wherever the requester says, so a request with any other reply
	// subject is dropped without an answer. The zero Rule allows nothing.
	Replies inbox.Rule
	Logger  zerolog.Logger
	// Observer counts dropped requests; nil means none.
	Observer Observer
}

// Observer is told about requests the services drop.
type Observer interface {
	// APIRequestDropped reports a request of service ("validate", "ping") dropped without an
	// answer, and why (DropReplyNotInbox).
	APIRequestDropped(service, reason string)
}

// logKeyReply is the log field of a dropped request's reply subject (beside events.LogKeySubject).
const logKeyReply = "reply"

// DropReplyNotInbox is the reason of a request whose reply subject is not a client's inbox.
const DropReplyNotInbox = "reply_not_inbox"

// Service names, in logs and metrics.
const (
	serviceValidate = "validate"
	servicePing     = "ping"
)

// answerable reports whether m may be answered: its reply subject is one of the rule's inboxes.
// Otherwise the request is counted and logged at debug, its subject and reply only (the payload
// is the requester's: a config may carry anything).
func (o ServeOptions) answerable(service string, m *nats.Msg) bool {
	if o.Replies.Allows(m.Reply) {
		return true
	}
	if o.Observer != nil {
		o.Observer.APIRequestDropped(service, DropReplyNotInbox)
	}
	o.Logger.Debug().Str(events.LogKeySubject, m.Subject).Str(logKeyReply, cut(m.Reply, maxFieldBytes)).
		Msg("dropped a request whose reply subject is not a client's inbox")
	return false
}

// registered returns sub once the server holds its interest, so that a service is answerable
// from any connection as soon as its Serve function returns; err is QueueSubscribe's.
func registered(nc *nats.Conn, sub *nats.Subscription, subject string, err error) (*nats.Subscription, error) {
	if err != nil {
		return nil, fmt.Errorf("subscribing to %s: %w", subject, err)
	}
	if err := nc.Flush(); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("registering %s with the server: %w", subject, err)
	}
	return sub, nil
}

// ServeValidate answers validate requests in the queue group until the subscription is drained
// with the connection. A request that is not a JSON object with a config gets an error naming
// the request's field; the config's content is never logged. A request whose reply subject is
// not a client's inbox is dropped (ServeOptions.Replies).
func ServeValidate(nc *nats.Conn, o ServeOptions, op policy.Operator) (*nats.Subscription, error) {
	subject := ValidateSubject(o.Subjects)
	sub, err := nc.QueueSubscribe(subject, QueueGroup, func(m *nats.Msg) {
		if !o.answerable(serviceValidate, m) {
			return
		}
		reply := validateMsg(m.Data, op)
		data, err := json.Marshal(reply)
		if err == nil {
			err = m.Respond(data)
		}
		if err != nil {
			o.Logger.Warn().Err(err).Msg("answering a validate request failed")
		}
	})
	return registered(nc, sub, subject, err)
}

func validateMsg(data []byte, op policy.Operator) ValidateReply {
	refuse := func(field, msg string) ValidateReply {
		return ValidateReply{Errors: []FieldError{{Field: field, Message: msg}}, Warnings: []string{}}
	}
	if len(data) > maxRequestBytes {
		return refuse("", fmt.Sprintf("request is %d bytes, more than the %d-byte limit", len(data), maxRequestBytes))
	}
	var keyErr *strictjson.KeyError
	if err := strictjson.CheckKeys(data, ""); errors.As(err, &keyErr) {
		return refuse(keyErr.Path, keyErr.Reason)
	} else if err != nil {
		return refuse("", "request is not valid JSON")
	}
	var req ValidateRequest
	if err := strictjson.CheckFields(data, &req, ""); errors.As(err, &keyErr) {
		return refuse(keyErr.Path, keyErr.Reason)
	}
	if err := json.Unmarshal(data, &req); err != nil || len(req.Config) == 0 || string(req.Config) == "null" {
		return refuse("config", "the request must be an object with a config object")
	}
	return bounded(Validate(req.Config, op))
}

// maxReplyErrors bounds the errors of one reply: a config of a thousand unknown keys must not
// make a reply bigger than a NATS message. The first ones name what to fix.
const maxReplyErrors = 50

// An error's field and message can quote the config (a refused key's path): each is cut to
// these sizes, so that the reply fits in a message whatever the request held.
const (
	maxFieldBytes   = 1 << 10
	maxMessageBytes = 4 << 10
)

// bounded keeps the first maxReplyErrors errors, each cut to size, and says how many more there
// were.
func bounded(r ValidateReply) ValidateReply {
	if more := len(r.Errors) - maxReplyErrors; more > 0 {
		r.Errors = append(r.Errors[:maxReplyErrors:maxReplyErrors], FieldError{Message: fmt.Sprintf("and %d more errors", more)})
	}
	for i, e := range r.Errors {
		r.Errors[i] = FieldError{Field: cut(e.Field, maxFieldBytes), Message: cut(e.Message, maxMessageBytes)}
	}
	return r
}

// cut shortens s to at most n bytes on a rune boundary, marking the cut.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// ServePing answers every ping with this replica's name, until the connection is drained. A
// ping whose reply subject is not a client's inbox is dropped (ServeOptions.Replies).
func ServePing(nc *nats.Conn, o ServeOptions, reply PingReply) (*nats.Subscription, error) {
	data, err := json.Marshal(reply)
	if err != nil {
		return nil, fmt.Errorf("encoding the ping reply: %w", err)
	}
	subject := PingSubject(o.Subjects)
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		if o.answerable(servicePing, m) {
			_ = m.Respond(data)
		}
	})
	return registered(nc, sub, subject, err)
}
