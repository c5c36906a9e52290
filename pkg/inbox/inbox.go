// Package inbox decides where a kubeclip responder may answer. NATS lets any client choose its
// request's reply subject and never checks it against the requester's permissions: a responder
// that publishes wherever it is told acts with its own permissions on the requester's behalf (a
// reply to $JS.API.STREAM.PURGE.… purges a stream). So every responder answers only into an
// inbox, a subject under one of the client users' inbox prefixes (nats-auth.conf gives each
// client user its own, nats.CustomInboxPrefix and nats.js' inboxPrefix set them), and drops a
// request with any other reply subject without answering it.
package inbox

import (
	"fmt"
	"strings"
)

// Prefixes of the client users' inboxes, as nats-auth.conf grants them: Paperclip's plugin and
// the kubeclip CLI. The workers use their own prefixes, which no responder ever answers into.
const (
	PaperclipPrefix = "_INBOX_paperclip"
	CLIPrefix       = "_INBOX_cli"
	// WorkersPrefix is the tenant-worker's, dispatcher's and run-watcher's (user kubeclip).
	WorkersPrefix = "_INBOX_kubeclip"
	// ExecWorkerPrefix is the exec-worker's (user exec-worker).
	ExecWorkerPrefix = "_INBOX_exec"
	// BrokerPrefix is the credential broker's (user broker).
	BrokerPrefix = "_INBOX_broker"
	// WorkersMintPrefix is where the credential broker answers the dispatcher's mint and key
	// requests (pkg/broker/mintclient; user kubeclip subscribes, user broker publishes). Not
	// WorkersPrefix: no responder may answer there (a client could name it as its reply subject
	// and have a worker's own request answered), so the broker's answers to the workers get an
	// inbox of their own, where nothing but its answers is ever awaited, each under a random
	// token no client sees.
	WorkersMintPrefix = "_INBOX_kubeclip_mint"
	// StatusPrefix is `kubeclip status`'s under the read-only operator user status. It sends no
	// request to a responder, only to JetStream, so no responder answers into it.
	StatusPrefix = "_INBOX_status"
)

// DefaultClientPrefixes are the inboxes a responder answers into unless the operator says
// otherwise (KUBECLIP_CLIENT_INBOX_PREFIXES).
func DefaultClientPrefixes() []string { return []string{PaperclipPrefix, CLIPrefix} }

// Rule is the set of inbox prefixes replies may go to. The zero Rule allows nothing.
type Rule struct {
	prefixes []string
}

// NewRule checks each prefix: one or more subject tokens, no wildcard, not a system subject
// ($JS, $KV, $SYS…), and none may be kubeclip's own workers' prefix.
func NewRule(prefixes []string) (Rule, error) {
	if len(prefixes) == 0 {
		return Rule{}, fmt.Errorf("no client inbox prefix")
	}
	out := make([]string, 0, len(prefixes))
	for _, p := range prefixes {
		if err := checkPrefix(p); err != nil {
			return Rule{}, err
		}
		out = append(out, p+".")
	}
	return Rule{prefixes: out}, nil
}

// MustRule is NewRule for prefixes known to be valid (constants); it panics otherwise.
func MustRule(prefixes ...string) Rule {
	r, err := NewRule(prefixes)
	if err != nil {
		panic(err)
	}
	return r
}

func checkPrefix(p string) error {
	switch {
	case p == "":
		return fmt.Errorf("client inbox prefix is empty")
	case strings.HasPrefix(p, "$"):
		return fmt.Errorf("client inbox prefix %q is a system subject", p)
	case p == WorkersPrefix || p == ExecWorkerPrefix || p == BrokerPrefix:
		return fmt.Errorf("client inbox prefix %q is a kubeclip worker's own", p)
	}
	for _, tok := range strings.Split(p, ".") {
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n*>") {
			return fmt.Errorf("client inbox prefix %q is not a literal subject", p)
		}
	}
	return nil
}

// Allows reports whether reply is a subject under one of the rule's prefixes: the prefix, a dot,
// then one or more non-empty literal tokens.
func (r Rule) Allows(reply string) bool {
	for _, p := range r.prefixes {
		rest, ok := strings.CutPrefix(reply, p)
		if ok && literal(rest) {
			return true
		}
	}
	return false
}

// literal reports whether s is one or more non-empty tokens without wildcards or whitespace.
func literal(s string) bool {
	if s == "" {
		return false
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" || tok == "*" || tok == ">" || strings.ContainsAny(tok, " \t\r\n") {
			return false
		}
	}
	return true
}
