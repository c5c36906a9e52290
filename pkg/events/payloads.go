package events

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"time"
	"unicode"
	"unicode/utf8"
)

// maxIDLen bounds free-form ids (environment, agent, issue, provider lease) in payloads.
const maxIDLen = 256

// Event is a message of the contract: a lease request, a run event or a dispatch request.
// The set is closed; Publisher.Publish accepts exactly the types of this package.
type Event interface {
	// Type is the CloudEvents type, e.g. io.paperclip.run.log.v1.
	Type() string
	// IDs returns the company and run the event belongs to.
	IDs() (companyID, runID string)
	// address returns the subject, the message id and (logs only) the CloudEvents sequence.
	address(s Subjects) (address, error)
	// stamp returns the event with its time set to now when it has none.
	stamp(now time.Time) Event
	// eventTime is the time the event reports (zero for requests, which carry none).
	eventTime() time.Time
}

type address struct {
	subject string
	msgID   string
	stream  string
	seq     uint64 // CloudEvents sequence extension; 0 = none
}

// Phase is a run's Kubernetes pod phase as reported in created and status events.
type Phase string

// Run phases.
const (
	PhasePending   Phase = "Pending"
	PhaseRunning   Phase = "Running"
	PhaseSucceeded Phase = "Succeeded"
	PhaseFailed    Phase = "Failed"
)

func (p Phase) valid() bool {
	return p == PhasePending || p == PhaseRunning || p == PhaseSucceeded || p == PhaseFailed
}

// Outcome is how a run ended.
type Outcome string

// Run outcomes.
const (
	OutcomeSucceeded Outcome = "succeeded"
	OutcomeFailed    Outcome = "failed"
	OutcomeTimedOut  Outcome = "timed_out"
	OutcomeCancelled Outcome = "cancelled"
	// OutcomeReleased: an exec-capable lease (backends pod, sandbox-cr) ended by its release or
	// destroy, its normal end: it runs no command of its own, so nothing failed; the agent's
	// work is told by the result's exitCode and agent, from its recorded exec.
	OutcomeReleased Outcome = "released"
)

// Outcomes lists every outcome, in the order docs/schemas/run-result.json lists them.
func Outcomes() []Outcome {
	return []Outcome{OutcomeSucceeded, OutcomeFailed, OutcomeTimedOut, OutcomeCancelled, OutcomeReleased}
}

func (o Outcome) valid() bool { return slices.Contains(Outcomes(), o) }

// ReleaseState is what became of a run's workload after release or destroy.
type ReleaseState string

// Release states.
const (
	ReleaseStopped   ReleaseState = "stopped"
	ReleaseDestroyed ReleaseState = "destroyed"
)

// Result and status reasons. The Kubernetes causes are passed on as Kubernetes words them (the
// ones listed are those kubeclip acts on; others may appear); the rest are kubeclip's own.
const (
	ReasonOOMKilled                  = "OOMKilled"
	ReasonDeadlineExceeded           = "DeadlineExceeded"
	ReasonImagePullBackOff           = "ImagePullBackOff"
	ReasonErrImageNeverPull          = "ErrImageNeverPull"
	ReasonUnschedulable              = "Unschedulable"
	ReasonCreateContainerConfigError = "CreateContainerConfigError"
	ReasonEvicted                    = "Evicted"

	// ReasonCompleted: the agent exited 0.
	ReasonCompleted = "Completed"
	// ReasonError: the agent exited non-zero and its runtime gave no reason.
	ReasonError = "Error"
	// ReasonPodFailed: the pod failed without a reason of its own.
	ReasonPodFailed = "PodFailed"
	// ReasonInitContainerFailed: an init container (sandboxd's installer) exited non-zero.
	ReasonInitContainerFailed = "InitContainerFailed"
	// ReasonSuspended, with phase Pending: the run's Job is suspended.
	ReasonSuspended = "Suspended"
	// ReasonPodDeleted: the run's pod was deleted before the run finished, by something other
	// than its lease's release (a Job's pod: its Job's next condition decides; an exec-capable
	// lease's pod: the run failed).
	ReasonPodDeleted = "PodDeleted"
	// ReasonJobDeleted, with outcome cancelled: the run's workload was deleted (released or
	// destroyed) before the run finished.
	ReasonJobDeleted = "JobDeleted"
	// ReasonWorkloadLost: the run's workload disappeared while no run-watcher followed it.
	ReasonWorkloadLost = "WorkloadLost"
	// ReasonQuotaExceeded: the tenant's ResourceQuota refused the run's pod.
	ReasonQuotaExceeded = "QuotaExceeded"
	// ReasonReady, with phase Running: an exec-capable lease's pod is ready and accepts exec.
	ReasonReady = "Ready"
	// ReasonReleasing, with phase Running: an exec-capable lease's release or destroy has begun;
	// its pod ends once its commands finish (or are cancelled, with cancelActiveWork).
	ReasonReleasing = "Releasing"
	// ReasonReleased, with phase Succeeded and outcome released: an exec-capable lease ended by
	// its release or destroy after its agent's recorded exec had finished (or with none).
	ReasonReleased = "Released"
	// ReasonCommandCancelled, with outcome cancelled: an exec-capable lease's release or destroy
	// cut its agent's recorded exec short (cancelActiveWork, or the release's grace ran out).
	ReasonCommandCancelled = "CommandCancelled"
)

// AgentResult is what the agent's own transcript (Claude Code stream-json) says about a run:
// the `agent` object of result and exec events. pkg/streamjson fills it from the log.
type AgentResult struct {
	// SessionID is the Claude session to resume; empty when none was reported or when the
	// session is poisoned (claude_poisoned_previous_message_id) and must not be resumed.
	SessionID string `json:"sessionId"`
	// Model is the model named by the init event, else by the result event.
	Model string `json:"model"`
	// Usage is nil when the run produced no result event.
	Usage *AgentUsage `json:"usage,omitempty"`
	// CostUSD is the result event's total_cost_usd when it is a number.
	CostUSD *float64 `json:"costUsd,omitempty"`
	// Summary is the result text, else the assistant text blocks joined by blank lines, trimmed.
	Summary string `json:"summary"`
	// IsError reports a failed run: the result says so, the exit code is non-zero without a
	// successful result, or the stream ended without a result event.
	IsError bool `json:"isError"`
	// ErrorCode classifies the failure (or a refusal); empty when there is nothing to say.
	ErrorCode string `json:"errorCode,omitempty"`
}

// AgentUsage is the token accounting inside AgentResult.
type AgentUsage struct {
	InputTokens       int64 `json:"inputTokens"`
	OutputTokens      int64 `json:"outputTokens"`
	CachedInputTokens int64 `json:"cachedInputTokens"`
}

// ---- lease requests (Paperclip → kubeclip, stream <PREFIX>_LEASES) ----

// AcquireRequest asks for a run's workload: <prefix>.lease.<companyId>.acquire.
type AcquireRequest struct {
	RunID         string `json:"runId"`
	CompanyID     string `json:"companyId"`
	EnvironmentID string `json:"environmentId"`
	AgentID       string `json:"agentId"`
	IssueID       string `json:"issueId,omitempty"`
	AdapterType   string `json:"adapterType,omitempty"`
	// ExecutionWorkspaceSettings is passed through as the raw JSON object Paperclip sent.
	ExecutionWorkspaceSettings json.RawMessage `json:"executionWorkspaceSettings,omitempty"`
	// RequestedExpiresAt is an RFC 3339 time: when Paperclip wants the lease to end (pkg/lease
	// bounds it).
	RequestedExpiresAt string `json:"requestedExpiresAt,omitempty"`
	// Config is the provider config object, validated by pkg/policy.
	Config json.RawMessage `json:"config"`
	// ReuseLease asks for a reusable lease: the host's environment config says reuseLease
	// (docs/reuse.md, The host's rules), and the lease keeps its workspace and the agent's home on a
	// volume of its own between the agent's runs. Only backend pod keeps one.
	ReuseLease bool `json:"reuseLease,omitempty"`
}

// Validate checks the request and returns a TerminalError (CodeInvalidRequest) naming the first
// offending field, in field order. The config's content is pkg/policy's business; here it only
// has to be a JSON object.
func (r AcquireRequest) Validate() error {
	if err := validateIDs(r.CompanyID, r.RunID); err != nil {
		return err
	}
	if err := validateID("environmentId", r.EnvironmentID); err != nil {
		return err
	}
	if err := validateID("agentId", r.AgentID); err != nil {
		return err
	}
	if r.IssueID != "" {
		if err := validateID("issueId", r.IssueID); err != nil {
			return err
		}
	}
	if r.AdapterType != "" {
		if err := validateID("adapterType", r.AdapterType); err != nil {
			return err
		}
	}
	if len(r.ExecutionWorkspaceSettings) > 0 && !isJSONNull(r.ExecutionWorkspaceSettings) && !isJSONObject(r.ExecutionWorkspaceSettings) {
		return InvalidRequest("executionWorkspaceSettings", "must be a JSON object")
	}
	if r.RequestedExpiresAt != "" {
		if _, err := time.Parse(time.RFC3339, r.RequestedExpiresAt); err != nil {
			return InvalidRequest("requestedExpiresAt", "must be an RFC 3339 time, got %q", truncate(r.RequestedExpiresAt, 64))
		}
	}
	if len(r.Config) == 0 || isJSONNull(r.Config) {
		return InvalidRequest("config", "is required")
	}
	if !isJSONObject(r.Config) {
		return InvalidRequest("config", "must be a JSON object")
	}
	return nil
}

// Type implements Event.
func (AcquireRequest) Type() string { return "io.paperclip.lease.acquire.v1" }

// IDs implements Event.
func (r AcquireRequest) IDs() (string, string) { return r.CompanyID, r.RunID }

func (r AcquireRequest) address(s Subjects) (address, error) {
	if err := r.Validate(); err != nil {
		return address{}, err
	}
	subj, err := s.Lease(r.CompanyID, LeaseAcquire)
	return address{subject: subj, msgID: Ref(r.CompanyID, r.RunID).MsgID("acquire"), stream: s.LeaseStream()}, err
}

func (r AcquireRequest) stamp(time.Time) Event { return r }
func (AcquireRequest) eventTime() time.Time    { return time.Time{} }

// ReleaseRequest stops (release) or deletes (destroy) a run's workload:
// <prefix>.lease.<companyId>.release and <prefix>.lease.<companyId>.destroy share this payload.
type ReleaseRequest struct {
	RunID            string `json:"runId"`
	CompanyID        string `json:"companyId"`
	ProviderLeaseID  string `json:"providerLeaseId,omitempty"`
	CancelActiveWork bool   `json:"cancelActiveWork,omitempty"`
	// ReleaseID, when set, names this release among the lease's releases (a reusable lease is
	// released once per run of its agent, resume after resume): the message id is then the
	// lease's and this id, so JetStream keeps each run's release and drops only a repeat of one.
	// Without it the message id is the lease's alone, as for a lease released once.
	ReleaseID string `json:"releaseId,omitempty"`
	// Destroy selects the .destroy subject. It is not part of the payload: the decoder sets it
	// from the subject.
	Destroy bool `json:"-"`
}

// Validate checks the request like AcquireRequest.Validate. ProviderLeaseID may be empty: a
// requester whose acquire timed out never heard the lease's name, and still has to end it.
func (r ReleaseRequest) Validate() error {
	if err := validateIDs(r.CompanyID, r.RunID); err != nil {
		return err
	}
	if r.ReleaseID != "" {
		if err := validateID("releaseId", r.ReleaseID); err != nil {
			return err
		}
	}
	if r.ProviderLeaseID == "" {
		return nil
	}
	return validateID("providerLeaseId", r.ProviderLeaseID)
}

// Kind returns LeaseRelease or LeaseDestroy.
func (r ReleaseRequest) Kind() LeaseKind {
	if r.Destroy {
		return LeaseDestroy
	}
	return LeaseRelease
}

// Type implements Event.
func (r ReleaseRequest) Type() string { return "io.paperclip.lease." + string(r.Kind()) + ".v1" }

// IDs implements Event.
func (r ReleaseRequest) IDs() (string, string) { return r.CompanyID, r.RunID }

func (r ReleaseRequest) address(s Subjects) (address, error) {
	if err := r.Validate(); err != nil {
		return address{}, err
	}
	subj, err := s.Lease(r.CompanyID, r.Kind())
	id := string(r.Kind())
	if r.ReleaseID != "" {
		id += "." + r.ReleaseID
	}
	return address{subject: subj, msgID: Ref(r.CompanyID, r.RunID).MsgID(id), stream: s.LeaseStream()}, err
}

func (r ReleaseRequest) stamp(time.Time) Event { return r }
func (ReleaseRequest) eventTime() time.Time    { return time.Time{} }

// ResumeRequest resumes a reusable lease for a later run of its agent:
// <prefix>.lease.<companyId>.resume. RunID is the run that acquired the lease (its record's
// key), ProviderLeaseID the lease's name, both as the acquire's answer gave them.
type ResumeRequest struct {
	RunID           string `json:"runId"`
	CompanyID       string `json:"companyId"`
	ProviderLeaseID string `json:"providerLeaseId"`
	// ResumeID names this resume, chosen by the requester: a lease is resumed once per run of
	// its agent, so the message id is the lease's and this id (JetStream drops a repeat of the
	// same resume within its duplicate window, and keeps the next run's).
	ResumeID string `json:"resumeId"`
}

// Validate checks the request like ReleaseRequest.Validate; the lease name and the resume id
// are required.
func (r ResumeRequest) Validate() error {
	if err := validateIDs(r.CompanyID, r.RunID); err != nil {
		return err
	}
	if err := validateID("providerLeaseId", r.ProviderLeaseID); err != nil {
		return err
	}
	return validateID("resumeId", r.ResumeID)
}

// Type implements Event.
func (ResumeRequest) Type() string { return "io.paperclip.lease.resume.v1" }

// IDs implements Event.
func (r ResumeRequest) IDs() (string, string) { return r.CompanyID, r.RunID }

func (r ResumeRequest) address(s Subjects) (address, error) {
	if err := r.Validate(); err != nil {
		return address{}, err
	}
	subj, err := s.Lease(r.CompanyID, LeaseResume)
	return address{subject: subj, msgID: Ref(r.CompanyID, r.RunID).MsgID("resume." + r.ResumeID), stream: s.LeaseStream()}, err
}

func (r ResumeRequest) stamp(time.Time) Event { return r }
func (ResumeRequest) eventTime() time.Time    { return time.Time{} }

// ---- dispatch (tenant-worker → dispatcher, stream KUBECLIP_WORK) ----

// DispatchRequest is a validated acquire whose tenant namespace has been applied:
// kubeclip.dispatch.<companyId>.<runId>. The acquire's fields are inlined.
type DispatchRequest struct {
	AcquireRequest
	// Namespace is the tenant namespace the run goes into.
	Namespace string `json:"namespace"`
	// Plan is what the tenant-worker decided of the lease (pkg/lease Plan.Encode): the one
	// authority for it, which the dispatcher takes as it is (lease.Decode) instead of deriving
	// it again from the request. Opaque here: pkg/lease owns its shape.
	Plan json.RawMessage `json:"plan"`
}

// Validate checks the embedded acquire, the namespace (a DNS-1123 label) and that a plan is
// there (an object; pkg/lease decodes it).
func (r DispatchRequest) Validate() error {
	if err := r.AcquireRequest.Validate(); err != nil {
		return err
	}
	if !isDNSLabel(r.Namespace) {
		return InvalidRequest("namespace", "must be a DNS-1123 label (lowercase alphanumerics and '-', at most 63), got %q", truncate(r.Namespace, 64))
	}
	if t := bytes.TrimSpace(r.Plan); len(t) == 0 || t[0] != '{' {
		return InvalidRequest("plan", "must be the tenant-worker's plan, a JSON object")
	}
	return nil
}

// Type implements Event.
func (DispatchRequest) Type() string { return "io.kubeclip.dispatch.v1" }

// IDs implements Event.
func (r DispatchRequest) IDs() (string, string) { return r.CompanyID, r.RunID }

func (r DispatchRequest) address(Subjects) (address, error) {
	if err := r.Validate(); err != nil {
		return address{}, err
	}
	subj, err := DispatchSubject(r.CompanyID, r.RunID)
	return address{subject: subj, msgID: Ref(r.CompanyID, r.RunID).MsgID("dispatch"), stream: WorkStream}, err
}

func (r DispatchRequest) stamp(time.Time) Event { return r }
func (DispatchRequest) eventTime() time.Time    { return time.Time{} }

// ---- run events (kubeclip → Paperclip, stream <PREFIX>_RUNS) ----

// RunCreatedEvent reports that a run's workload exists: <prefix>.run.<c>.<r>.created.
type RunCreatedEvent struct {
	RunID           string     `json:"runId"`
	CompanyID       string     `json:"companyId"`
	At              time.Time  `json:"at"`
	ProviderLeaseID string     `json:"providerLeaseId"`
	Namespace       string     `json:"namespace"`
	WorkloadName    string     `json:"workloadName"`
	SecretName      string     `json:"secretName"`
	Backend         string     `json:"backend"`
	PodName         string     `json:"podName,omitempty"`
	Phase           Phase      `json:"phase"`
	ExpiresAt       *time.Time `json:"expiresAt,omitempty"`
	// Warm is true when the lease got a warm pod (ready to run commands at once), absent when
	// its workload was created for it.
	Warm bool `json:"warm,omitempty"`
}

// Type implements Event.
func (RunCreatedEvent) Type() string { return runType(KindCreated) }

// IDs implements Event.
func (e RunCreatedEvent) IDs() (string, string) { return e.CompanyID, e.RunID }

func (e RunCreatedEvent) address(s Subjects) (address, error) {
	if !e.Phase.valid() {
		return address{}, InvalidRequest("phase", "must be one of Pending, Running, Succeeded, Failed, got %q", e.Phase)
	}
	return runAddress(s, e.CompanyID, e.RunID, KindCreated, Ref(e.CompanyID, e.RunID).MsgID("created"), 0)
}

func (e RunCreatedEvent) stamp(now time.Time) Event { e.At = stampTime(e.At, now); return e }
func (e RunCreatedEvent) eventTime() time.Time      { return e.At }

// RunStatusEvent reports a phase change: <prefix>.run.<c>.<r>.status.
type RunStatusEvent struct {
	RunID     string    `json:"runId"`
	CompanyID string    `json:"companyId"`
	At        time.Time `json:"at"`
	Phase     Phase     `json:"phase"`
	Reason    string    `json:"reason,omitempty"`
	Message   string    `json:"message,omitempty"`
	PodName   string    `json:"podName,omitempty"`
	// PodIP is the run's pod's IP once Kubernetes assigned one: the credential broker binds the
	// run's grants to it (pkg/broker/brokersvc.Releaser), so a placeholder carried out of the
	// pod is refused from any other address. A status whose phase and reason did not change is
	// published again when the IP first becomes known or changes.
	PodIP string `json:"podIp,omitempty"`
}

// Type implements Event.
func (RunStatusEvent) Type() string { return runType(KindStatus) }

// IDs implements Event.
func (e RunStatusEvent) IDs() (string, string) { return e.CompanyID, e.RunID }

// address: the message id is <runId>.status.<phase>, plus .<reason> when there is one, plus
// .ip-<podIp> when the pod's IP is known, so a Pending run that starts failing to pull its image
// (or whose pod got its IP) is reported although its phase did not change, while a republished
// status is deduplicated.
func (e RunStatusEvent) address(s Subjects) (address, error) {
	if !e.Phase.valid() {
		return address{}, InvalidRequest("phase", "must be one of Pending, Running, Succeeded, Failed, got %q", e.Phase)
	}
	id := Ref(e.CompanyID, e.RunID).MsgID("status." + string(e.Phase))
	if e.Reason != "" {
		id += "." + idSafe(e.Reason)
	}
	if e.PodIP != "" {
		if _, err := netip.ParseAddr(e.PodIP); err != nil {
			return address{}, InvalidRequest("podIp", "must be an IP address, got %q", e.PodIP)
		}
		id += ".ip-" + idSafe(e.PodIP)
	}
	return runAddress(s, e.CompanyID, e.RunID, KindStatus, id, 0)
}

func (e RunStatusEvent) stamp(now time.Time) Event { e.At = stampTime(e.At, now); return e }
func (e RunStatusEvent) eventTime() time.Time      { return e.At }

// LogLine is one line of container output.
type LogLine struct {
	// TS is the Kubernetes log timestamp, RFC 3339 with nanoseconds, as the kubelet wrote it.
	TS string `json:"ts"`
	// Text is the line without its timestamp and newline. A Job's log is stdout and stderr
	// combined; Kubernetes does not say which stream a line came from.
	Text string `json:"text"`
	// Partial marks every piece but the last of a line longer than one event can carry: the
	// pieces share TS and are consecutive; concatenate Text up to and including the first
	// piece without Partial.
	Partial bool `json:"partial,omitempty"`
}

// RunLogEvent carries a batch of log lines: <prefix>.run.<c>.<r>.log. Seq counts a run's log
// events from 1 without gaps; an event encodes to at most MaxLogEventBytes (the run-watcher's
// batcher splits longer lines into Partial pieces).
type RunLogEvent struct {
	RunID     string    `json:"runId"`
	CompanyID string    `json:"companyId"`
	At        time.Time `json:"at"`
	Seq       uint64    `json:"seq"`
	Pod       string    `json:"pod"`
	Container string    `json:"container"`
	Lines     []LogLine `json:"lines"`
	// LogStopped names the budget (BudgetRun, BudgetCompany) that stopped the run's log: set on
	// the last log event, which carries no lines. The run goes on and gets its result; its
	// later log lines are not stored.
	LogStopped BudgetKind `json:"logStopped,omitempty"`
}

// Type implements Event.
func (RunLogEvent) Type() string { return runType(KindLog) }

// IDs implements Event.
func (e RunLogEvent) IDs() (string, string) { return e.CompanyID, e.RunID }

func (e RunLogEvent) address(s Subjects) (address, error) {
	if e.Seq == 0 {
		return address{}, InvalidRequest("seq", "must be at least 1")
	}
	return runAddress(s, e.CompanyID, e.RunID, KindLog, Ref(e.CompanyID, e.RunID).MsgID(fmt.Sprintf("log.%d", e.Seq)), e.Seq)
}

func (e RunLogEvent) stamp(now time.Time) Event {
	e.At = stampTime(e.At, now)
	if e.Lines == nil {
		e.Lines = []LogLine{}
	}
	return e
}
func (e RunLogEvent) eventTime() time.Time { return e.At }

// RunResultEvent reports how a run ended, exactly once per run: <prefix>.run.<c>.<r>.result.
type RunResultEvent struct {
	RunID     string       `json:"runId"`
	CompanyID string       `json:"companyId"`
	At        time.Time    `json:"at"`
	Outcome   Outcome      `json:"outcome"`
	ExitCode  *int         `json:"exitCode,omitempty"`
	Reason    string       `json:"reason,omitempty"`
	Message   string       `json:"message,omitempty"`
	Agent     *AgentResult `json:"agent,omitempty"`
}

// Type implements Event.
func (RunResultEvent) Type() string { return runType(KindResult) }

// IDs implements Event.
func (e RunResultEvent) IDs() (string, string) { return e.CompanyID, e.RunID }

func (e RunResultEvent) address(s Subjects) (address, error) {
	if !e.Outcome.valid() {
		return address{}, InvalidRequest("outcome", "must be one of %v, got %q", Outcomes(), truncate(string(e.Outcome), 16))
	}
	return runAddress(s, e.CompanyID, e.RunID, KindResult, Ref(e.CompanyID, e.RunID).MsgID("result"), 0)
}

func (e RunResultEvent) stamp(now time.Time) Event { e.At = stampTime(e.At, now); return e }
func (e RunResultEvent) eventTime() time.Time      { return e.At }

// RunReleasedEvent confirms a release or destroy: <prefix>.run.<c>.<r>.released.
type RunReleasedEvent struct {
	RunID           string       `json:"runId"`
	CompanyID       string       `json:"companyId"`
	At              time.Time    `json:"at"`
	ProviderLeaseID string       `json:"providerLeaseId"`
	State           ReleaseState `json:"state"`
	// ReleaseID is the release request's releaseId, when it named itself (a reusable lease is
	// released once per run): the answer to that release.
	ReleaseID string `json:"releaseId,omitempty"`
	// Unknown marks the receipt of a release or destroy of a lease the company does not have
	// (no lease for the run: never acquired, another company's, or its record expired): nothing
	// was there, so nothing was ended, and ProviderLeaseID is the request's, echoed. State is
	// then destroyed: no lease of that run can be resumed. Paperclip's host releases the leases
	// its own restart stranded, and keeps one it got no receipt for pending cleanup.
	Unknown bool `json:"unknown,omitempty"`
}

// Type implements Event.
func (RunReleasedEvent) Type() string { return runType(KindReleased) }

// IDs implements Event.
func (e RunReleasedEvent) IDs() (string, string) { return e.CompanyID, e.RunID }

func (e RunReleasedEvent) address(s Subjects) (address, error) {
	if e.State != ReleaseStopped && e.State != ReleaseDestroyed {
		return address{}, InvalidRequest("state", "must be stopped or destroyed, got %q", e.State)
	}
	return runAddress(s, e.CompanyID, e.RunID, KindReleased, Ref(e.CompanyID, e.RunID).MsgID(withRequestID("released."+string(e.State), e.ReleaseID)), 0)
}

func (e RunReleasedEvent) stamp(now time.Time) Event { e.At = stampTime(e.At, now); return e }
func (e RunReleasedEvent) eventTime() time.Time      { return e.At }

// RunFailedEvent reports that a request could not be carried out: <prefix>.run.<c>.<r>.failed.
type RunFailedEvent struct {
	RunID     string    `json:"runId"`
	CompanyID string    `json:"companyId"`
	At        time.Time `json:"at"`
	Code      Code      `json:"code"`
	// Message explains the failure and names the offending field; it never holds a secret.
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
	// Request is the lease request that failed: acquire, release or destroy. A run can have
	// one failed event per request kind (an acquire that failed, then a refused release).
	Request LeaseKind `json:"request"`
	// RequestID is the id the failed request named itself with (a resume's resumeId, a
	// release's releaseId): the answer to that request, among the run's other failures.
	RequestID string `json:"requestId,omitempty"`
}

// A failed event's field and message can quote what the client sent (the path of a refused key,
// every unknown field of a config), so NewRunFailed cuts them to these sizes: the event has to fit
// in one message whatever the request held, or the requester never hears why it failed.
const (
	maxFailedField   = 1 << 10
	maxFailedMessage = 16 << 10
)

// NewRunFailed builds the failed event of request for err: a TerminalError's code and field,
// else CodeInternal.
func NewRunFailed(ref RunRef, request LeaseKind, err error) RunFailedEvent {
	ev := RunFailedEvent{RunID: ref.RunID, CompanyID: ref.CompanyID, Code: CodeInternal, Request: request}
	if err == nil {
		ev.Message = "unknown failure"
		return ev
	}
	te, ok := AsTerminal(err)
	if !ok {
		te = &TerminalError{Code: CodeInternal, Err: err}
	}
	ev.Code, ev.Field, ev.Message = te.Code, truncate(te.Field, maxFailedField), truncate(te.Public(), maxFailedMessage)
	return ev
}

// Type implements Event.
func (RunFailedEvent) Type() string { return runType(KindFailed) }

// IDs implements Event.
func (e RunFailedEvent) IDs() (string, string) { return e.CompanyID, e.RunID }

func (e RunFailedEvent) address(s Subjects) (address, error) {
	if !e.Code.Valid() {
		return address{}, InvalidRequest("code", "must be a documented failure code, got %q", e.Code)
	}
	if !e.Request.valid() {
		return address{}, InvalidRequest("request", "must be acquire, release, destroy or resume, got %q", e.Request)
	}
	return runAddress(s, e.CompanyID, e.RunID, KindFailed, Ref(e.CompanyID, e.RunID).MsgID(withRequestID("failed."+string(e.Request), e.RequestID)), 0)
}

func (e RunFailedEvent) stamp(now time.Time) Event { e.At = stampTime(e.At, now); return e }
func (e RunFailedEvent) eventTime() time.Time      { return e.At }

// Compile-time checks that every payload is an Event.
var (
	_ Event = AcquireRequest{}
	_ Event = ReleaseRequest{}
	_ Event = DispatchRequest{}
	_ Event = RunCreatedEvent{}
	_ Event = RunStatusEvent{}
	_ Event = RunLogEvent{}
	_ Event = RunResultEvent{}
	_ Event = RunReleasedEvent{}
	_ Event = RunFailedEvent{}
	_ Event = RunExecEvent{}
)

func runType(k RunKind) string { return "io.paperclip.run." + string(k) + ".v1" }

func runAddress(s Subjects, companyID, runID string, kind RunKind, msgID string, seq uint64) (address, error) {
	subj, err := s.Run(companyID, runID, kind)
	if err != nil {
		return address{}, err
	}
	return address{subject: subj, msgID: msgID, stream: s.RunStream(), seq: seq}, nil
}

func stampTime(t, now time.Time) time.Time {
	if t.IsZero() {
		return now.UTC()
	}
	return t
}

// validateID checks a free-form id: non-empty, bounded, no control characters.
// withRequestID is an answer's message id suffix: one per request id, so the answer to each of
// a reusable lease's repeated requests is kept, and a repeat of one request answers once.
func withRequestID(suffix, id string) string {
	if id == "" {
		return suffix
	}
	return suffix + "." + id
}

func validateID(field, v string) error {
	switch {
	case v == "":
		return InvalidRequest(field, "must not be empty")
	case len(v) > maxIDLen:
		return InvalidRequest(field, "must be at most %d bytes, got %d", maxIDLen, len(v))
	case !utf8.ValidString(v):
		return InvalidRequest(field, "must be valid UTF-8")
	}
	for _, r := range v {
		if unicode.IsControl(r) {
			return InvalidRequest(field, "must not contain control characters")
		}
	}
	return nil
}

func isJSONObject(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '{' && json.Valid(raw)
}

func isJSONNull(raw json.RawMessage) bool {
	return bytes.Equal(bytes.TrimSpace(raw), []byte("null"))
}

func isDNSLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		if !alnum && (c != '-' || i == 0 || i == len(s)-1) {
			return false
		}
	}
	return true
}

// idSafe maps a free-form string (a Kubernetes reason) to message-id-safe characters.
func idSafe(s string) string {
	b := []byte(truncate(s, 64))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i] = '_'
		}
	}
	return string(b)
}

// truncate keeps error messages that quote client input short.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
