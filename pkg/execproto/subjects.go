package execproto

import (
	"fmt"
	"strings"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execspec"
)

// QueueGroup is the queue group every exec-worker subscribes to the request subjects in: each
// request reaches one replica.
const QueueGroup = "kubeclip-exec"

// Op names a request subject's last token.
type Op string

// The requests a client sends.
const (
	OpStart  Op = "start"
	OpAttach Op = "attach"
	OpSignal Op = "signal"
)

// Ops lists every request op.
func Ops() []Op { return []Op{OpStart, OpAttach, OpSignal} }

func (o Op) valid() bool { return o == OpStart || o == OpAttach || o == OpSignal }

// Subjects builds and parses the exec subjects of one prefix.
type Subjects struct{ prefix string }

// NewSubjects returns the exec subjects under the prefix of s.
func NewSubjects(s events.Subjects) Subjects { return Subjects{prefix: s.Prefix()} }

// RequestFilter matches one op's requests for every run: <prefix>.exec.*.*.<op>.
func (s Subjects) RequestFilter(op Op) string { return s.prefix + ".exec.*.*." + string(op) }

// Request returns <prefix>.exec.<companyId>.<runId>.<op>.
func (s Subjects) Request(companyID, runID string, op Op) (string, error) {
	if !op.valid() {
		return "", fmt.Errorf("exec op %q: %w", op, events.ErrUnknownSubject)
	}
	if err := events.Ref(companyID, runID).Validate(); err != nil {
		return "", err
	}
	return s.prefix + ".exec." + companyID + "." + runID + "." + string(op), nil
}

// IO returns the subject a client sends an exec's stdin, acks and close to, while the session
// named session serves it: <prefix>.exec.<companyId>.<runId>.io.<execId>.<session>. Each stream
// of an exec (its client's, after every takeover; an observer's) has its own, so acks and stdin
// reach the session they are meant for. Clients take it from `started` and never build it.
func (s Subjects) IO(companyID, runID, execID, session string) (string, error) {
	base, err := s.Control(companyID, runID, execID)
	if err != nil {
		return "", err
	}
	if !execspec.ValidID(session) {
		return "", InvalidRequest("session", "must be %s", execspec.IDRule)
	}
	return base + "." + session, nil
}

// Control returns the subject exec-workers tell each other about an exec's streams on (a
// takeover): <prefix>.exec.<companyId>.<runId>.io.<execId>.
func (s Subjects) Control(companyID, runID, execID string) (string, error) {
	if err := events.Ref(companyID, runID).Validate(); err != nil {
		return "", err
	}
	if !execspec.ValidID(execID) {
		return "", InvalidRequest("execId", "must be %s", execspec.IDRule)
	}
	return s.prefix + ".exec." + companyID + "." + runID + ".io." + execID, nil
}

// ParseRequest splits <prefix>.exec.<companyId>.<runId>.<op>. The company and run come from
// the subject only: that is what NATS permissions can restrict.
func (s Subjects) ParseRequest(subject string) (companyID, runID string, op Op, err error) {
	t := strings.Split(subject, ".")
	if len(t) != 5 || t[0] != s.prefix || t[1] != "exec" || !Op(t[4]).valid() {
		return "", "", "", fmt.Errorf("parsing exec subject %q: %w", subject, events.ErrUnknownSubject)
	}
	if err := events.Ref(t[2], t[3]).Validate(); err != nil {
		return "", "", "", err
	}
	return t[2], t[3], Op(t[4]), nil
}
