// Package mintproto is the credential broker's mint protocol (issue 27): how Paperclip's plugin
// hands a brokered key's real value to the broker and gets back the placeholder the pod
// carries instead. It is the one description of the subject and the JSON both sides follow, so
// the plugin (plugins/paperclip) can be written against it.
//
// A requester (the plugin; the dispatcher for a run's Secret, pkg/broker/mintclient) first asks
// the broker's public key, a core NATS request to <prefix>.broker.key answered with a KeyReply,
// then sends a core NATS request (not JetStream: a value is never stored in a stream) to
// <prefix>.broker.<companyId>.<runId>.mint with a MintRequest whose value is sealed to that key
// (seal.go); the broker answers a MintReply into the request's inbox, and only into an inbox it
// answers (pkg/inbox: a request whose reply subject is anything else gets no answer). The
// company and run come from the subject alone, as on the exec subjects (pkg/execproto): that is
// what NATS permissions can restrict.
//
// Why the key is asked over NATS and not set by the operator on every requester: only the
// broker's NATS user may subscribe to the key subject (nats-auth.conf; tests/natsauth pins it),
// the same trust that already decides who receives mint requests, so whoever answers the key
// request is whoever would receive the mint anyway; and the key follows the broker's sealing key
// (broker.Sealer.MintKey) through a rotation with no second setting to keep in step. A requester
// asks it before its mints (one round trip), never caching it past them, so a rotated key is
// never stale.
//
// The request carries a sealed secret; the reply carries a placeholder. Neither is ever logged,
// put in an error, or stored anywhere but the grant (sealed): errors name fields, never values.
package mintproto

import (
	"bytes"
	"crypto/ecdh"
	"encoding/base64"
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

// OpKey is the key subject's last token: <prefix>.broker.key.
const OpKey = "key"

// Subjects builds and parses the broker's subjects of one prefix.
type Subjects struct{ prefix string }

// NewSubjects returns the broker subjects under the prefix of s.
func NewSubjects(s events.Subjects) Subjects { return Subjects{prefix: s.Prefix()} }

// MintFilter matches every mint request: <prefix>.broker.*.*.mint (the broker's queue
// subscription, and its NATS user's subscribe permission).
func (s Subjects) MintFilter() string { return s.prefix + ".broker.*.*." + OpMint }

// Key returns <prefix>.broker.key, where the broker answers its public key (KeyReply).
func (s Subjects) Key() string { return s.prefix + ".broker." + OpKey }

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
// sealed and in base64 (4/3 of it, plus the tag), a key, a nonce and a few ids fit with room.
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
	// EphemeralKey, Nonce and Ciphertext are the key's real value sealed to the broker (Seal,
	// with AAD of the subject's company and run, LeaseID and Key), each base64. There is no
	// field for the value in clear: a value never crosses NATS readable.
	EphemeralKey string `json:"ephemeralKey"`
	Nonce        string `json:"nonce"`
	Ciphertext   string `json:"ciphertext"`
	// PeerIP is the lease's pod IP when the plugin knows it (the grant then resolves only
	// from that pod); empty: bound later.
	PeerIP string `json:"peerIp,omitempty"`
}

// String leaves the sealed value out: it opens only under the broker's key, but a log has no
// use for it.
func (r MintRequest) String() string {
	return fmt.Sprintf("mint{leaseId:%q key:%q value:[sealed] peerIp:%q}", r.LeaseID, r.Key, r.PeerIP)
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
	if _, err := r.sealed(); err != nil {
		return err
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
			field := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
			if field == "value" {
				return MintRequest{}, Invalid(field, "a value is never sent in clear: seal it to the broker's key (%s) and send ephemeralKey, nonce and ciphertext", "mintproto.Seal")
			}
			return MintRequest{}, Invalid(field, "is not a field of a mint request")
		default:
			return MintRequest{}, Invalid("", "request is not a JSON object")
		}
	}
	return r, nil
}

// KeyReply is the broker's answer on the key subject: its X25519 public key, or an error.
type KeyReply struct {
	// PublicKey is the key mint values are sealed to, base64 (standard) of KeyLen bytes.
	PublicKey string `json:"publicKey,omitempty"`
	Error     *Error `json:"error,omitempty"`
}

// ParseKeyReply reads the broker's key answer: its public key, or the broker's refusal (an
// *Error), or an error saying the answer is malformed.
func ParseKeyReply(data []byte) (*ecdh.PublicKey, error) {
	var r KeyReply
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, errors.New("the broker's key answer is not JSON")
	}
	if r.Error != nil {
		return nil, r.Error
	}
	raw, err := base64.StdEncoding.DecodeString(r.PublicKey)
	if err != nil || len(raw) != KeyLen {
		return nil, errors.New("the broker's key answer holds no X25519 public key")
	}
	k, err := ecdh.X25519().NewPublicKey(raw)
	if err != nil {
		return nil, errors.New("the broker's key answer holds no X25519 public key")
	}
	return k, nil
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
