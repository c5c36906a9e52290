package broker

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/kubeclip/kubeclip/pkg/broker/ca"
	"github.com/kubeclip/kubeclip/pkg/events"
)

// Header is a request header the broker swaps a placeholder in. The set is closed: these are
// the headers the model APIs read a key from, and a header outside it is forwarded as it is.
type Header string

// The headers.
const (
	// HeaderXAPIKey is Anthropic's x-api-key: the whole value is the key.
	HeaderXAPIKey Header = "x-api-key"
	// HeaderAuthorization is "Authorization: Bearer <key>" (OpenAI; Anthropic's auth token).
	HeaderAuthorization Header = "authorization"
	// HeaderAPIKey is Azure OpenAI's api-key: the whole value is the key.
	HeaderAPIKey Header = "api-key"
	// HeaderGoogAPIKey is Gemini's x-goog-api-key: the whole value is the key.
	HeaderGoogAPIKey Header = "x-goog-api-key"
)

// Headers lists every header the broker swaps in, in the order the proxy looks at them.
func Headers() []Header {
	return []Header{HeaderXAPIKey, HeaderAuthorization, HeaderAPIKey, HeaderGoogAPIKey}
}

func (h Header) valid() bool { return slices.Contains(Headers(), h) }

const bearer = "Bearer "

// Credential is the credential in a value of header h: after "Bearer " (any case) for
// Authorization, the whole value otherwise. ok is false for an Authorization value of another
// scheme.
func (h Header) Credential(value string) (cred string, ok bool) {
	if h != HeaderAuthorization {
		return value, true
	}
	if len(value) < len(bearer) || !strings.EqualFold(value[:len(bearer)], bearer) {
		return "", false
	}
	return value[len(bearer):], true
}

// WithCredential is the value of header h carrying cred.
func (h Header) WithCredential(cred string) string {
	if h == HeaderAuthorization {
		return bearer + cred
	}
	return cred
}

// Binding is where a key may go: the hosts it may reach and the headers it may be sent in. The
// operator declares one per brokered key (ANTHROPIC_API_KEY → api.anthropic.com, x-api-key or
// Authorization).
type Binding struct {
	Hosts   []string `json:"hosts"`
	Headers []Header `json:"headers"`
}

// maxBindingHosts bounds a binding's hosts, so a grant's size is bounded (grantRecordBytes).
const maxBindingHosts = 8

// canonical checks b and returns it with canonical hosts (ca.CanonicalHost) and no repeats.
func (b Binding) canonical() (Binding, error) {
	if len(b.Hosts) == 0 || len(b.Hosts) > maxBindingHosts {
		return Binding{}, fieldErr("binding.hosts", "must name 1 to %d hosts, got %d", maxBindingHosts, len(b.Hosts))
	}
	out := Binding{}
	for _, h := range b.Hosts {
		c, err := ca.CanonicalHost(h)
		if err != nil {
			return Binding{}, &FieldError{Field: "binding.hosts", Reason: err.Error(), sep: ": "}
		}
		if !slices.Contains(out.Hosts, c) {
			out.Hosts = append(out.Hosts, c)
		}
	}
	if len(b.Headers) == 0 {
		return Binding{}, fieldErr("binding.headers", "must name at least one of %v", Headers())
	}
	for _, h := range b.Headers {
		if !h.valid() {
			return Binding{}, &FieldError{Field: "binding.headers", Reason: fmt.Sprintf("%q is not one of %v", h, Headers()), sep: ": "}
		}
		if !slices.Contains(out.Headers, h) {
			out.Headers = append(out.Headers, h)
		}
	}
	return out, nil
}

// Grant is what a placeholder stands for, without its secrets: whose it is and where it may go.
type Grant struct {
	ID      GrantID
	Company string
	Run     string
	Lease   string
	// Key is the brokered key's name (ANTHROPIC_API_KEY).
	Key     string
	Binding Binding
	// Peer is the IP of the pod the grant is bound to; the zero Addr until its run's pod is
	// known (Store.BindRun; a grant minted after that is born bound), and until then no peer
	// may use it (Cache.Resolve: ReasonUnbound; Cache.ResolveWait waits for the binding).
	Peer    netip.Addr
	Created time.Time
}

// MaxValueBytes bounds a real value: API keys are around a hundred bytes; the bound keeps a
// grant's record small (grantRecordBytes) whatever an operator pastes.
const MaxValueBytes = 4096

// maxKeyNameLen bounds a key's name, as events.MaxTokenLen bounds ids.
const maxKeyNameLen = events.MaxTokenLen

// MintRequest is a grant to mint: its owner, the key's name and binding, the real value, and
// the pod's IP when it is already known.
type MintRequest struct {
	Company string
	Run     string
	Lease   string
	Key     string
	Binding Binding
	Peer    netip.Addr
	// Value is the real value. It goes into a header, so it must be printable ASCII.
	Value string
}

// FieldError is a MintRequest's refusal: the field (company, run, lease, key, value,
// binding.hosts, binding.headers) and why, never the field's value when it is secret. The ids'
// refusals are events.ValidateToken's TerminalError, which names its field too.
type FieldError struct {
	Field  string
	Reason string
	sep    string
}

func (e *FieldError) Error() string {
	if e.sep == "" {
		return e.Field + " " + e.Reason
	}
	return e.Field + e.sep + e.Reason
}

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Validate checks r as Mint does, before any write. Errors name the field (a *FieldError, or
// for the ids an events.TerminalError) and never quote the value.
func (r MintRequest) Validate() error {
	_, err := r.validate()
	return err
}

// validate checks r and returns its binding canonical. Errors name the field and never quote
// the value.
func (r MintRequest) validate() (Binding, error) {
	for _, f := range []struct{ name, value string }{{"company", r.Company}, {"run", r.Run}, {"lease", r.Lease}} {
		if err := events.ValidateToken(f.name, f.value); err != nil {
			return Binding{}, err
		}
	}
	if err := validateKeyName(r.Key); err != nil {
		return Binding{}, err
	}
	if err := validateValue(r.Value); err != nil {
		return Binding{}, err
	}
	return r.Binding.canonical()
}

// validateKeyName checks an environment variable's name: [A-Za-z_][A-Za-z0-9_]*.
func validateKeyName(k string) error {
	if k == "" || len(k) > maxKeyNameLen {
		return fieldErr("key", "must be 1 to %d bytes, got %d", maxKeyNameLen, len(k))
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if !(c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9') {
			return &FieldError{Field: "key", Reason: fmt.Sprintf("%q must be an environment variable name ([A-Za-z_][A-Za-z0-9_]*)", k)}
		}
	}
	return nil
}

// validateValue checks a real value without ever quoting it.
func validateValue(v string) error {
	if v == "" || len(v) > MaxValueBytes {
		return fieldErr("value", "must be 1 to %d bytes, got %d", MaxValueBytes, len(v))
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x21 || v[i] > 0x7e {
			return fieldErr("value", "must be printable ASCII without spaces (it goes into a header); byte %d is not", i)
		}
	}
	if LooksLikePlaceholder(v) {
		return fieldErr("value", "is a kubeclip placeholder, not a real key")
	}
	return nil
}

// record is a grant as the bucket stores it: the grant, the SHA-256 of its placeholder's
// secret part (what Resolve compares), its value sealed for its id, and the secret part sealed
// too (SealedSecret: what a repeated Mint answers with; neither the bucket alone nor the sealing
// key alone yields a placeholder).
type record struct {
	ID         string  `json:"id"`
	Company    string  `json:"company"`
	Run        string  `json:"run"`
	Lease      string  `json:"lease"`
	Key        string  `json:"key"`
	Binding    Binding `json:"binding"`
	Peer       string  `json:"peer,omitempty"`
	SecretHash []byte  `json:"secretHash"`
	Sealed     []byte  `json:"sealed"`
	// SealedSecret is the placeholder's secret part, sealed for the id like the value.
	SealedSecret []byte    `json:"sealedSecret"`
	Created      time.Time `json:"created"`
}

// grant is the record's grant; the error names what is wrong with a record that does not
// decode into one.
func (r record) grant() (Grant, error) {
	id, ok := parseGrantID(r.ID)
	if !ok {
		return Grant{}, fmt.Errorf("id %q is not a grant id", r.ID)
	}
	var peer netip.Addr
	if r.Peer != "" {
		var err error
		if peer, err = netip.ParseAddr(r.Peer); err != nil {
			return Grant{}, fmt.Errorf("peer: %w", err)
		}
	}
	if len(r.SecretHash) != 32 || len(r.Sealed) == 0 {
		return Grant{}, fmt.Errorf("secretHash or sealed missing")
	}
	return Grant{ID: id, Company: r.Company, Run: r.Run, Lease: r.Lease, Key: r.Key, Binding: r.Binding, Peer: peer, Created: r.Created}, nil
}
