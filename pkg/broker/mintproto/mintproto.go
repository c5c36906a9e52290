// Package mintproto is the credential broker's mint protocol (issue 27): how Paperclip's plugin
// hands a brokered key's real value to the broker and gets back the placeholder the pod
// carries instead. It is the one description of the subject and the JSON both sides follow, so
// the plugin (plugins/paperclip) can be written against it.
//
// The plugin sends a core NATS request (not JetStream: a real value is never stored in a
// stream) to <prefix>.broker.<companyId>.<runId>.mint with a MintRequest; the broker answers a
// MintReply into the request's inbox, and only into a client inbox (pkg/inbox: a request whose
// reply subject is anything else gets no answer). The company and run come from the subject
// alone, as on the exec subjects (pkg/execproto): that is what NATS permissions can restrict.
//
// The request carries a secret; the reply carries a placeholder. Neither is ever logged, put in
// an error, or stored anywhere but the grant (sealed): errors name fields, never values.
package mintproto

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/strictjson"
)

// OpMint is the mint subject's last token.
const OpMint = "mint"

// Subjects builds and parses the broker's subjects of one prefix.
type Subjects struct{ prefix string }

// NewSubjects returns the broker subjects under the prefix of s.
func NewSubjects(s events.Subjects) Subjects { return Subjects{prefix: s.Prefix()} }

// MintFilter matches every mint request: <prefix>.broker.*.*.mint (the broker's queue
// subscription, and its NATS user's subscribe permission).
func (s Subjects) MintFilter() string { return s.prefix + ".broker.*.*." + OpMint }

// Mint returns <prefix>.broker.<companyId>.<runId>.mint.
func (s Subjects) Mint(companyID, runID string) (string, error) {
	if err := events.Ref(companyID, runID).Validate(); err != nil {
		return "", err
	}
	return s.prefix + ".broker." + companyID + "." + runID + "." + OpMint, nil
}

// ParseMint splits <prefix>.broker.<companyId>.<runId>.mint.
func (s Subjects) ParseMint(subject string) (companyID, runID string, err error) {
	t := strings.Split(subject, ".")
	if len(t) != 5 || t[0] != s.prefix || t[1] != "broker" || t[4] != OpMint {
		return "", "", fmt.Errorf("parsing broker subject %q: %w", subject, events.ErrUnknownSubject)
	}
	if err := events.Ref(t[2], t[3]).Validate(); err != nil {
		return "", "", err
	}
	return t[2], t[3], nil
}

// MaxRequestBytes bounds a mint request's JSON: a value of at most broker.MaxValueBytes (4 KiB)
// and a few ids fit with room.
const MaxRequestBytes = 16 << 10

// MintRequest asks for the placeholder of one brokered key of one lease:
// <prefix>.broker.<companyId>.<runId>.mint.
type MintRequest struct {
	// LeaseID is the run's lease, the `created` event's providerLeaseId: a subject token of at
	// most events.MaxTokenLen bytes (it becomes one in the grant's key).
	LeaseID string `json:"leaseId"`
	// Key is the brokered key's name (ANTHROPIC_API_KEY); the operator's bindings say where
	// it may go.
	Key string `json:"key"`
	// Value is the key's real value. Secret: never logged, never quoted.
	Value string `json:"value"`
	// PeerIP is the lease's pod IP when the plugin knows it (the grant then resolves only
	// from that pod); empty: bound later.
	PeerIP string `json:"peerIp,omitempty"`
}

// String redacts the value, so a request formatted by mistake gives nothing away.
func (r MintRequest) String() string {
	return fmt.Sprintf("mint{leaseId:%q key:%q value:[redacted] peerIp:%q}", r.LeaseID, r.Key, r.PeerIP)
}

// Peer is PeerIP parsed (the zero Addr when empty). Call it after Validate.
func (r MintRequest) Peer() netip.Addr {
	a, _ := netip.ParseAddr(r.PeerIP)
	return a.Unmap()
}

// Validate checks what the broker checks before it looks at its bindings; the error is an
// *Error naming the field and never quoting the value. (The value's own rules, printable ASCII
// of at most 4 KiB and no placeholder, are broker.MintRequest's.)
func (r MintRequest) Validate() error {
	if err := events.ValidateToken("leaseId", r.LeaseID); err != nil {
		return Invalid("leaseId", "%v", errors.Unwrap(err))
	}
	if r.Key == "" {
		return Invalid("key", "must name a brokered key")
	}
	if r.Value == "" {
		return Invalid("value", "must not be empty")
	}
	if r.PeerIP != "" {
		if _, err := netip.ParseAddr(r.PeerIP); err != nil {
			return Invalid("peerIp", "must be an IP address")
		}
	}
	return nil
}

// Decode reads a mint request strictly: at most MaxRequestBytes, valid JSON, no key twice or
// spelled unlike its field, no unknown field. Errors are *Error naming the field; they never
// quote the document (it holds a secret).
func Decode(data []byte) (MintRequest, error) {
	var r MintRequest
	if len(data) > MaxRequestBytes {
		return r, Invalid("", "request is %d bytes, more than the %d-byte limit", len(data), MaxRequestBytes)
	}
	var keyErr *strictjson.KeyError
	if err := strictjson.Check(data, &r, ""); err != nil {
		if errors.As(err, &keyErr) {
			return r, Invalid(keyErr.Path, "%s", keyErr.Reason)
		}
		return r, Invalid("", "request is not a valid JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		var typeErr *json.UnmarshalTypeError
		switch {
		case errors.As(err, &typeErr) && typeErr.Field == "":
			return MintRequest{}, Invalid("", "request is not a JSON object")
		case errors.As(err, &typeErr):
			return MintRequest{}, Invalid(typeErr.Field, "must be a %s", typeErr.Type)
		case strings.HasPrefix(err.Error(), "json: unknown field "):
			// encoding/json's only way to say it; the field's name is the client's key, no value.
			return MintRequest{}, Invalid(strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`), "is not a field of a mint request")
		default:
			return MintRequest{}, Invalid("", "request is not a JSON object")
		}
	}
	return r, nil
}

// MintReply is the broker's answer: the placeholder, or an error.
type MintReply struct {
	// Placeholder is what the pod's environment carries instead of the value. Secret (it is
	// half of the key to the value): the plugin puts it in the run's Secret and execute
	// environments only.
	Placeholder string `json:"placeholder,omitempty"`
	// GrantID names the grant (not secret): the same for a repeated mint of the lease's key.
	GrantID string `json:"grantId,omitempty"`
	// Hosts are the hosts the key is bound to (the pod's hostAliases point them at the broker).
	Hosts []string `json:"hosts,omitempty"`
	Error *Error   `json:"error,omitempty"`
}

// Code classifies a refused mint.
type Code string

// The codes.
const (
	// CodeInvalidRequest: the request is malformed; Field names what.
	CodeInvalidRequest Code = "invalid_request"
	// CodeUnknownKey: the key is not brokered (no binding names it).
	CodeUnknownKey Code = "unknown_key"
	// CodeQuotaExceeded: the company holds its quota of grants (the message names the budget).
	CodeQuotaExceeded Code = "quota_exceeded"
	// CodeUnavailable: the broker could not store the grant now; retry.
	CodeUnavailable Code = "unavailable"
)

// Error is a refused mint. Message names the field or the budget, never a value.
type Error struct {
	Code    Code   `json:"code"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

func (e *Error) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("mint %s: %s: %s", e.Code, e.Field, e.Message)
	}
	return fmt.Sprintf("mint %s: %s", e.Code, e.Message)
}

// Invalid is a CodeInvalidRequest naming field.
func Invalid(field, format string, args ...any) *Error {
	return &Error{Code: CodeInvalidRequest, Field: field, Message: fmt.Sprintf(format, args...)}
}
