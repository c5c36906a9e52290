package events

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// DefaultPrefix is the subject prefix Paperclip uses unless configured otherwise.
const DefaultPrefix = "paperclip"

// MaxTokenLen caps a company or run id in a subject. Paperclip's ids are 36-character UUIDs;
// the cap keeps subjects, message ids and KV keys small whatever a client sends.
const MaxTokenLen = 128

// maxPrefixLen keeps stream names (upper(prefix)+"_LEASES") well inside NATS limits.
const maxPrefixLen = 32

// Work subjects are kubeclip-internal and do not follow the configurable prefix: only kubeclip
// publishes and consumes them.
const (
	WorkStream        = "KUBECLIP_WORK"
	workSubjectPrefix = "kubeclip.dispatch"
)

// ErrInvalidToken is wrapped by every error about a company or run id that cannot be a subject
// token.
var ErrInvalidToken = errors.New("not a valid subject token")

// ErrUnknownSubject is wrapped by the parsers for a subject outside the contract.
var ErrUnknownSubject = errors.New("unknown subject")

// LeaseKind names a lease request subject's last token.
type LeaseKind string

// Lease request kinds.
const (
	LeaseAcquire LeaseKind = "acquire"
	LeaseRelease LeaseKind = "release"
	LeaseDestroy LeaseKind = "destroy"
	// LeaseResume resumes a reusable lease (ResumeRequest).
	LeaseResume LeaseKind = "resume"
)

func (k LeaseKind) valid() bool {
	return k == LeaseAcquire || k == LeaseRelease || k == LeaseDestroy || k == LeaseResume
}

// RunKind names a run event subject's last token.
type RunKind string

// Run event kinds.
const (
	KindCreated  RunKind = "created"
	KindStatus   RunKind = "status"
	KindLog      RunKind = "log"
	KindResult   RunKind = "result"
	KindReleased RunKind = "released"
	KindFailed   RunKind = "failed"
	// KindExec carries a recorded exec's output and end (docs/exec.md).
	KindExec RunKind = "exec"
)

// RunKinds lists every run event kind.
func RunKinds() []RunKind {
	return []RunKind{KindCreated, KindStatus, KindLog, KindResult, KindReleased, KindFailed, KindExec, KindSuspended, KindResumed, KindUsage}
}

func (k RunKind) valid() bool {
	for _, r := range RunKinds() {
		if k == r {
			return true
		}
	}
	return false
}

// ValidateToken checks that value can be a NATS subject token: non-empty, at most MaxTokenLen
// bytes of UTF-8, without whitespace, control characters, '.', '*' or '>'. The error is a
// TerminalError (CodeInvalidRequest) naming field and wraps ErrInvalidToken.
func ValidateToken(field, value string) error {
	reason := ""
	switch {
	case value == "":
		reason = "must not be empty"
	case len(value) > MaxTokenLen:
		reason = fmt.Sprintf("must be at most %d bytes, got %d", MaxTokenLen, len(value))
	case !utf8.ValidString(value):
		reason = "must be valid UTF-8"
	default:
		for _, r := range value {
			switch {
			case r == '.' || r == '*' || r == '>':
				reason = fmt.Sprintf("must not contain %q", r)
			case unicode.IsSpace(r) || unicode.IsControl(r):
				reason = "must not contain whitespace or control characters"
			}
			if reason != "" {
				break
			}
		}
	}
	if reason == "" {
		return nil
	}
	return Terminal(CodeInvalidRequest, field, fmt.Errorf("%w: %s", ErrInvalidToken, reason))
}

// Subjects builds and parses the contract's subjects for one prefix. The zero value uses
// DefaultPrefix.
type Subjects struct {
	prefix string
}

// NewSubjects returns the subjects for prefix ("" means DefaultPrefix). A prefix is one subject
// token of ASCII letters, digits, '-' and '_', at most 32 bytes, because stream names are
// derived from it.
func NewSubjects(prefix string) (Subjects, error) {
	if prefix == "" {
		return Subjects{prefix: DefaultPrefix}, nil
	}
	if len(prefix) > maxPrefixLen {
		return Subjects{}, fmt.Errorf("subject prefix %q: must be at most %d bytes", prefix, maxPrefixLen)
	}
	for _, r := range prefix {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return Subjects{}, fmt.Errorf("subject prefix %q: must contain only letters, digits, '-' and '_'", prefix)
		}
	}
	return Subjects{prefix: prefix}, nil
}

// Prefix returns the subject prefix.
func (s Subjects) Prefix() string {
	if s.prefix == "" {
		return DefaultPrefix
	}
	return s.prefix
}

// LeaseStream is the name of the lease request stream, e.g. PAPERCLIP_LEASES.
func (s Subjects) LeaseStream() string { return strings.ToUpper(s.Prefix()) + "_LEASES" }

// RunStream is the name of the run event stream, e.g. PAPERCLIP_RUNS.
func (s Subjects) RunStream() string { return strings.ToUpper(s.Prefix()) + "_RUNS" }

// LeaseAll matches every lease request: <prefix>.lease.>.
func (s Subjects) LeaseAll() string { return s.Prefix() + ".lease.>" }

// RunAll matches every run event: <prefix>.run.>.
func (s Subjects) RunAll() string { return s.Prefix() + ".run.>" }

// RunKindFilter matches one kind of run event for every run: <prefix>.run.*.*.<kind>.
func (s Subjects) RunKindFilter(kind RunKind) string {
	return s.Prefix() + ".run.*.*." + string(kind)
}

// LeaseFilter matches one kind of lease request for every company: <prefix>.lease.*.<kind>.
func (s Subjects) LeaseFilter(kind LeaseKind) string {
	return s.Prefix() + ".lease.*." + string(kind)
}

// Lease returns <prefix>.lease.<companyId>.<kind>.
func (s Subjects) Lease(companyID string, kind LeaseKind) (string, error) {
	if !kind.valid() {
		return "", fmt.Errorf("lease kind %q: %w", kind, ErrUnknownSubject)
	}
	if err := ValidateToken("companyId", companyID); err != nil {
		return "", err
	}
	return s.Prefix() + ".lease." + companyID + "." + string(kind), nil
}

// Run returns <prefix>.run.<companyId>.<runId>.<kind>.
func (s Subjects) Run(companyID, runID string, kind RunKind) (string, error) {
	if !kind.valid() {
		return "", fmt.Errorf("run event kind %q: %w", kind, ErrUnknownSubject)
	}
	if err := validateIDs(companyID, runID); err != nil {
		return "", err
	}
	return s.Prefix() + ".run." + companyID + "." + runID + "." + string(kind), nil
}

// RunFilter matches every event of one run: <prefix>.run.<companyId>.<runId>.*.
func (s Subjects) RunFilter(companyID, runID string) (string, error) {
	if err := validateIDs(companyID, runID); err != nil {
		return "", err
	}
	return s.Prefix() + ".run." + companyID + "." + runID + ".*", nil
}

// AnyCompanyRunFilter matches every event of one run whatever its company:
// <prefix>.run.*.<runId>.*; for a reader that knows only the run id.
func (s Subjects) AnyCompanyRunFilter(runID string) (string, error) {
	if err := ValidateToken("runId", runID); err != nil {
		return "", err
	}
	return s.Prefix() + ".run.*." + runID + ".*", nil
}

// ParseLeaseSubject splits <prefix>.lease.<companyId>.<kind>.
func (s Subjects) ParseLeaseSubject(subject string) (companyID string, kind LeaseKind, err error) {
	t := strings.Split(subject, ".")
	if len(t) != 4 || t[0] != s.Prefix() || t[1] != "lease" || !LeaseKind(t[3]).valid() {
		return "", "", fmt.Errorf("parsing lease subject %q: %w", subject, ErrUnknownSubject)
	}
	if err := ValidateToken("companyId", t[2]); err != nil {
		return "", "", err
	}
	return t[2], LeaseKind(t[3]), nil
}

// ParseRunSubject splits <prefix>.run.<companyId>.<runId>.<kind>.
func (s Subjects) ParseRunSubject(subject string) (companyID, runID string, kind RunKind, err error) {
	t := strings.Split(subject, ".")
	if len(t) != 5 || t[0] != s.Prefix() || t[1] != "run" || !RunKind(t[4]).valid() {
		return "", "", "", fmt.Errorf("parsing run subject %q: %w", subject, ErrUnknownSubject)
	}
	if err := validateIDs(t[2], t[3]); err != nil {
		return "", "", "", err
	}
	return t[2], t[3], RunKind(t[4]), nil
}

// DispatchSubject returns kubeclip.dispatch.<companyId>.<runId>.
func DispatchSubject(companyID, runID string) (string, error) {
	if err := validateIDs(companyID, runID); err != nil {
		return "", err
	}
	return workSubjectPrefix + "." + companyID + "." + runID, nil
}

// DispatchAll matches every dispatch request: kubeclip.dispatch.>.
func DispatchAll() string { return workSubjectPrefix + ".>" }

// ParseDispatchSubject splits kubeclip.dispatch.<companyId>.<runId>.
func ParseDispatchSubject(subject string) (companyID, runID string, err error) {
	rest, ok := strings.CutPrefix(subject, workSubjectPrefix+".")
	t := strings.Split(rest, ".")
	if !ok || len(t) != 2 {
		return "", "", fmt.Errorf("parsing dispatch subject %q: %w", subject, ErrUnknownSubject)
	}
	if err := validateIDs(t[0], t[1]); err != nil {
		return "", "", err
	}
	return t[0], t[1], nil
}

// idsFromSubject extracts what ids a contract subject carries, whatever its prefix; used for
// log fields only.
func idsFromSubject(subject string) (companyID, runID string) {
	t := strings.Split(subject, ".")
	switch {
	case len(t) == 4 && t[1] == "lease":
		return t[2], ""
	case len(t) == 5 && t[1] == "run":
		return t[2], t[3]
	case len(t) == 4 && t[0] == "kubeclip" && t[1] == "dispatch":
		return t[2], t[3]
	}
	return "", ""
}

func validateIDs(companyID, runID string) error {
	if err := ValidateToken("companyId", companyID); err != nil {
		return err
	}
	return ValidateToken("runId", runID)
}
