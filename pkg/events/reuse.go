package events

import (
	"fmt"
	"net/netip"
	"time"
)

// A reusable lease serves its agent's runs one after another (docs/reuse.md, The host's rules): the
// host's release keeps it, and the host resumes it for the next run. Its events go to the run
// that acquired it, whose id names the lease for as long as it lives: suspended when its idle
// window is over, resumed for each later run.

// Run event kinds of a reusable lease.
const (
	KindSuspended RunKind = "suspended"
	KindResumed   RunKind = "resumed"
)

// ResumedFrom is what a resume found: a retained lease's pod, which serves at once, or a
// suspended lease's volume, which a new pod mounted.
type ResumedFrom string

// What a resume found.
const (
	ResumedFromRetained  ResumedFrom = "retained"
	ResumedFromSuspended ResumedFrom = "suspended"
)

// RunSuspendedEvent reports that a released reusable lease stayed idle for the operator's
// window: the pod of its generation was deleted, its volume kept. One per generation:
// <prefix>.run.<c>.<r>.suspended.
type RunSuspendedEvent struct {
	RunID           string    `json:"runId"`
	CompanyID       string    `json:"companyId"`
	At              time.Time `json:"at"`
	ProviderLeaseID string    `json:"providerLeaseId"`
	// Generation numbers the lease's pods: 0 the first, one more for each resume of a
	// suspended lease.
	Generation int `json:"generation"`
	// VolumeClaim is the PersistentVolumeClaim kept for the next resume.
	VolumeClaim string `json:"volumeClaim"`
}

// Type implements Event.
func (RunSuspendedEvent) Type() string { return runType(KindSuspended) }

// IDs implements Event.
func (e RunSuspendedEvent) IDs() (string, string) { return e.CompanyID, e.RunID }

func (e RunSuspendedEvent) address(s Subjects) (address, error) {
	if e.Generation < 0 {
		return address{}, InvalidRequest("generation", "must be at least 0, got %d", e.Generation)
	}
	if e.VolumeClaim == "" {
		return address{}, InvalidRequest("volumeClaim", "must not be empty: a suspended lease keeps its volume")
	}
	return runAddress(s, e.CompanyID, e.RunID, KindSuspended, Ref(e.CompanyID, e.RunID).MsgID(fmt.Sprintf("suspended.%d", e.Generation)), 0)
}

func (e RunSuspendedEvent) stamp(now time.Time) Event { e.At = stampTime(e.At, now); return e }
func (e RunSuspendedEvent) eventTime() time.Time      { return e.At }

// RunResumedEvent reports that the host resumed a reusable lease for a later run and that it
// is ready to run commands: at once when it was retained, once a new pod on its volume is ready
// when it was suspended. One per resume: <prefix>.run.<c>.<r>.resumed.
type RunResumedEvent struct {
	RunID           string      `json:"runId"`
	CompanyID       string      `json:"companyId"`
	At              time.Time   `json:"at"`
	ProviderLeaseID string      `json:"providerLeaseId"`
	From            ResumedFrom `json:"from"`
	// Generation is the generation of the pod that serves the lease now.
	Generation int `json:"generation"`
	// Resumes counts the lease's resumes, this one included.
	Resumes int `json:"resumes"`
	// ResumeID is the resume request's resumeId: the answer to that request (a repeated
	// resume of a lease already resumed answers with the same count under its own id).
	ResumeID string `json:"resumeId,omitempty"`
	// ExpiresAt is the lease's expiry from this resume on (lease.Record.ExpiresAt): each resume
	// renews it by the lease's run deadline, and the dispatcher's sweep suspends a lease still in
	// use past it. It is what the plugin answers the host (expiresAt), as `created`'s is for the
	// acquire. Absent for a lease with no run deadline (one acquired before kubeclip kept one).
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
	// PodIP is the IP of the pod that serves the lease now. The credential broker binds the
	// grants of the lease's runs to it, as it binds them to a status event's podIp: a lease
	// resumed onto a new pod gets no status event for it, since the run-watcher's watch of the
	// run ended with its first pod (pkg/broker/brokersvc.Releaser).
	PodIP string `json:"podIp,omitempty"`
}

// Type implements Event.
func (RunResumedEvent) Type() string { return runType(KindResumed) }

// IDs implements Event.
func (e RunResumedEvent) IDs() (string, string) { return e.CompanyID, e.RunID }

func (e RunResumedEvent) address(s Subjects) (address, error) {
	switch {
	case e.From != ResumedFromRetained && e.From != ResumedFromSuspended:
		return address{}, InvalidRequest("from", "must be retained or suspended, got %q", e.From)
	case e.Generation < 0:
		return address{}, InvalidRequest("generation", "must be at least 0, got %d", e.Generation)
	case e.Resumes < 1:
		return address{}, InvalidRequest("resumes", "must be at least 1, got %d", e.Resumes)
	}
	if e.PodIP != "" {
		if _, err := netip.ParseAddr(e.PodIP); err != nil {
			return address{}, InvalidRequest("podIp", "must be an IP address, got %q", e.PodIP)
		}
	}
	return runAddress(s, e.CompanyID, e.RunID, KindResumed, Ref(e.CompanyID, e.RunID).MsgID(withRequestID(fmt.Sprintf("resumed.%d", e.Resumes), e.ResumeID)), 0)
}

func (e RunResumedEvent) stamp(now time.Time) Event { e.At = stampTime(e.At, now); return e }
func (e RunResumedEvent) eventTime() time.Time      { return e.At }

var (
	_ Event = RunSuspendedEvent{}
	_ Event = RunResumedEvent{}
)
