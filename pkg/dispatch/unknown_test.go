package dispatch

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/pipelinetest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// TestUnknownLeaseRequests: a release or destroy of a lease kubeclip does not know (a run with
// no record; company B naming company A's run and lease ids) is answered `released` destroyed
// with unknown set, naming the lease the request named, and a resume of one `failed`
// lease_not_found naming runId, each with its request's id. Nothing anywhere changes: no record
// is written for the unknown run, and A's lease stays created with its pod, with no released of
// its own. Paperclip's host sweeps the leases its own restart stranded and releases or destroys
// each; an answer that is not a receipt leaves its lease pending cleanup, retried and then left for
// an operator.
func TestUnknownLeaseRequests(t *testing.T) {
	e := startReuseEnv(t)
	victim := e.acquire(t, "pod")
	e.next(t, victim, events.KindCreated, 0)
	before := e.record(t, victim)
	if err := waitReadyFor(t, e.cs, before); err != nil {
		t.Fatal(err)
	}
	pod, _ := e.pod(t, before)

	b := pipelinetest.NewID("co")
	tests := []struct {
		name  string
		ref   events.RunRef
		lease string
	}{
		{"no record", events.Ref(pipelinetest.NewID("co"), pipelinetest.NewID("run")), "kc-nothing-here"},
		{"another company's run", events.Ref(b, victim.RunID), before.WorkloadName},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			// A reusable lease's release names itself; the destroy after it names nothing.
			e.publish(t, events.ReleaseRequest{RunID: tc.ref.RunID, CompanyID: tc.ref.CompanyID, ProviderLeaseID: tc.lease, ReleaseID: "3"})
			kind, ev, seq := e.answer(t, tc.ref, 0)
			releaseMs := time.Since(start).Milliseconds()
			checkUnknownReceipt(t, "release", kind, ev, tc.lease, "3")

			start = time.Now()
			e.publish(t, events.ReleaseRequest{RunID: tc.ref.RunID, CompanyID: tc.ref.CompanyID, ProviderLeaseID: tc.lease, Destroy: true, CancelActiveWork: true})
			kind, ev, seq = e.answer(t, tc.ref, seq)
			destroyMs := time.Since(start).Milliseconds()
			checkUnknownReceipt(t, "destroy", kind, ev, tc.lease, "")

			start = time.Now()
			e.publish(t, events.ResumeRequest{RunID: tc.ref.RunID, CompanyID: tc.ref.CompanyID, ProviderLeaseID: tc.lease, ResumeID: "r9"})
			kind, ev, _ = e.answer(t, tc.ref, seq)
			resumeMs := time.Since(start).Milliseconds()
			if kind != events.KindFailed || ev["code"] != string(events.CodeLeaseNotFound) || ev["field"] != "runId" || ev["request"] != string(events.LeaseResume) || ev["requestId"] != "r9" {
				t.Errorf("resume: %s %v, want failed lease_not_found naming runId, request resume, requestId r9", kind, ev)
			}
			t.Logf("answered_ms release %d destroy %d resume %d", releaseMs, destroyMs, resumeMs)

			// A destroy handled again (its request under another message id): answered the same,
			// changing nothing.
			e.publish(t, events.ReleaseRequest{RunID: tc.ref.RunID, CompanyID: tc.ref.CompanyID, ProviderLeaseID: tc.lease, Destroy: true}, jetstream.WithMsgID(tc.ref.MsgID("destroy.again")))
			e.drained(t)
			if _, _, err := e.records.Get(t.Context(), tc.ref); !errors.Is(err, lease.ErrNotFound) {
				t.Errorf("the unknown run's record after its requests: %v, want none", err)
			}
		})
	}

	after := e.record(t, victim)
	if after.State != lease.StateCreated || after.Generation != before.Generation || after.Resumes != before.Resumes || after.Ending != before.Ending {
		t.Errorf("company A's lease moved: %+v, was %+v", after, before)
	}
	if p, ok := e.pod(t, after); !ok || p.UID != pod.UID || p.DeletionTimestamp != nil {
		t.Errorf("company A's pod after company B's requests: present %v, want the same pod, not deleted", ok)
	}
	if e.has(t, victim, events.KindReleased) {
		t.Error("company A's run has a released event")
	}
}

// checkUnknownReceipt checks a release's answer for a lease kubeclip does not know.
func checkUnknownReceipt(t *testing.T, what string, kind events.RunKind, ev map[string]any, lease, releaseID string) {
	t.Helper()
	gotID, _ := ev["releaseId"].(string)
	if kind != events.KindReleased || ev["state"] != string(events.ReleaseDestroyed) || ev["unknown"] != true || ev["providerLeaseId"] != lease || gotID != releaseID {
		t.Errorf("%s: %s %v, want released destroyed, unknown, providerLeaseId %s, releaseId %q", what, kind, ev, lease, releaseID)
	}
}

// answer waits for the run's first released or failed event after seq and returns its kind,
// payload and sequence.
func (e *reuseEnv) answer(t *testing.T, ref events.RunRef, after uint64) (events.RunKind, map[string]any, uint64) {
	t.Helper()
	stream, err := e.js.Stream(t.Context(), e.s.RunStream())
	if err != nil {
		t.Fatal(err)
	}
	var kind events.RunKind
	var got map[string]any
	var seq uint64
	eventually(t, "an answer for run "+ref.RunID, func() bool {
		for _, k := range []events.RunKind{events.KindReleased, events.KindFailed} {
			subj, err := e.s.Run(ref.CompanyID, ref.RunID, k)
			if err != nil {
				t.Fatal(err)
			}
			m, err := stream.GetLastMsgForSubject(t.Context(), subj)
			if err != nil || m.Sequence <= after || (seq != 0 && m.Sequence > seq) {
				continue // none yet, or after the other kind's answer
			}
			var ev map[string]any
			if json.Unmarshal(m.Data, &ev) == nil {
				kind, got, seq = k, ev, m.Sequence
			}
		}
		return seq != 0
	})
	return kind, got, seq
}

// has reports whether the run's stream holds an event of kind.
func (e *reuseEnv) has(t *testing.T, ref events.RunRef, kind events.RunKind) bool {
	t.Helper()
	subj, err := e.s.Run(ref.CompanyID, ref.RunID, kind)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := e.js.Stream(t.Context(), e.s.RunStream())
	if err != nil {
		t.Fatal(err)
	}
	_, err = stream.GetLastMsgForSubject(t.Context(), subj)
	return err == nil
}
