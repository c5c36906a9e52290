package broker

import (
	"errors"
	"net/http"
)

// Reason is why the broker refused a request: the "reason" label of
// kubeclip_broker_refusals_total and the key of the refusal table.
type Reason string

// The reasons. Their statuses and messages are in refusals, the one table that says what each
// means.
const (
	// ReasonMalformed: a header value starts like a placeholder but is not one.
	ReasonMalformed Reason = "malformed"
	// ReasonMissing: a request to a bound host carries no placeholder in any header the broker
	// swaps. It is refused, not passed through: only a request the broker can attribute to a
	// grant is forwarded, so metering and budgets cannot be walked around with a key of the
	// agent's own.
	ReasonMissing Reason = "missing"
	// ReasonUnknown: no grant has this id, or its secret part is wrong (one answer for both, so
	// a guesser learns nothing about which ids exist).
	ReasonUnknown Reason = "unknown"
	// ReasonReleased: the grant was deleted (its lease was released) or expired.
	ReasonReleased Reason = "released"
	// ReasonWrongHost: the grant's key is not bound to the host the request went to.
	ReasonWrongHost Reason = "wrong_host"
	// ReasonWrongHeader: the placeholder came in a header its binding does not allow.
	ReasonWrongHeader Reason = "wrong_header"
	// ReasonWrongPeer: the grant is bound to its pod's IP and the request came from another.
	ReasonWrongPeer Reason = "wrong_peer"
	// ReasonUnbound: the grant is bound to no pod yet (kubeclip has not seen its run's pod's
	// address: Store.BindRun), and the binding did not arrive while the request waited for it.
	// Until it is bound a grant resolves from no address at all, so a placeholder carried out
	// of its pod before the binding is of no use elsewhere either.
	ReasonUnbound Reason = "unbound"
	// ReasonMixed: one request carries placeholders of different leases, so it belongs to no
	// single run to meter it against.
	ReasonMixed Reason = "mixed"
	// ReasonMisdirected: the HTTP Host differs from the TLS server name the connection was
	// made for.
	ReasonMisdirected Reason = "misdirected"
	// ReasonUnavailable: this replica cannot decide (its grant cache has not loaded, or its
	// watch ended, or the grant does not open under its sealing key). It fails closed.
	ReasonUnavailable Reason = "unavailable"
)

// refusal is what a reason means to the client: the HTTP status and the message (after
// "kubeclip broker: "). Messages name the reason and never a value.
type refusal struct {
	status  int
	message string
}

var refusals = map[Reason]refusal{
	ReasonMalformed:   {http.StatusUnauthorized, "the credential is not a well-formed kubeclip placeholder"},
	ReasonMissing:     {http.StatusUnauthorized, "the request carries no kubeclip placeholder in x-api-key, Authorization, api-key or x-goog-api-key; this host is reached only with the placeholder kubeclip put in the environment"},
	ReasonUnknown:     {http.StatusUnauthorized, "unknown placeholder"},
	ReasonReleased:    {http.StatusUnauthorized, "the placeholder's lease was released (or its grant expired); it no longer works"},
	ReasonWrongHost:   {http.StatusForbidden, "the placeholder's key is not bound to this host"},
	ReasonWrongHeader: {http.StatusForbidden, "the placeholder's key may not be sent in this header"},
	ReasonWrongPeer:   {http.StatusForbidden, "the placeholder belongs to another pod"},
	ReasonUnbound:     {http.StatusServiceUnavailable, "the placeholder's pod is not known to kubeclip yet (its run's pod address has not been reported); retry shortly"},
	ReasonMixed:       {http.StatusForbidden, "the request carries placeholders of different leases"},
	ReasonMisdirected: {http.StatusMisdirectedRequest, "the request's Host is not the server name its connection was made for"},
	ReasonUnavailable: {http.StatusServiceUnavailable, "the broker cannot check placeholders right now; retry shortly"},
}

// Reasons lists every reason, for metrics that start every label at zero.
func Reasons() []Reason {
	return []Reason{
		ReasonMalformed, ReasonMissing, ReasonUnknown, ReasonReleased, ReasonWrongHost,
		ReasonWrongHeader, ReasonWrongPeer, ReasonUnbound, ReasonMixed, ReasonMisdirected, ReasonUnavailable,
	}
}

// Status is the HTTP status a refusal for r answers with (500 for a reason not in the table).
func (r Reason) Status() int {
	if f, ok := refusals[r]; ok {
		return f.status
	}
	return http.StatusInternalServerError
}

// Message is the client's explanation of a refusal for r, prefixed "kubeclip broker: ".
func (r Reason) Message() string {
	if f, ok := refusals[r]; ok {
		return "kubeclip broker: " + f.message
	}
	return "kubeclip broker: refused (" + string(r) + ")"
}

// RefusedError is Resolve's refusal; find it with errors.As (or RefusalReason).
type RefusedError struct {
	Reason Reason
}

func (e *RefusedError) Error() string { return e.Reason.Message() }

func refuse(r Reason) error { return &RefusedError{Reason: r} }

// RefusalReason is err's refusal reason, if err is (or wraps) a *RefusedError.
func RefusalReason(err error) (Reason, bool) {
	var re *RefusedError
	if errors.As(err, &re) {
		return re.Reason, true
	}
	return "", false
}
