package events_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/pkg/events"
)

const acquireSubject = "paperclip.lease.c1.acquire"

func validAcquire() map[string]any {
	return map[string]any{
		"runId":         "r1",
		"companyId":     "c1",
		"environmentId": "env-1",
		"agentId":       "agent-1",
		"config":        map[string]any{"inCluster": true},
	}
}

func encode(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestDecodeAcquire(t *testing.T) {
	with := func(k string, v any) []byte {
		m := validAcquire()
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		return encode(t, m)
	}
	tests := []struct {
		name      string
		subject   string
		data      []byte
		wantField string // "" with wantMsg "" means success
		wantMsg   string
	}{
		{name: "valid", data: encode(t, validAcquire())},
		{name: "unknown fields are tolerated", data: with("futureField", map[string]any{"x": 1})},
		{name: "optional fields", data: encode(t, map[string]any{
			"runId": "r1", "companyId": "c1", "environmentId": "e", "agentId": "a", "config": map[string]any{},
			"issueId": "i", "adapterType": "claude_local", "executionWorkspaceSettings": map[string]any{"mode": "shared"},
			"requestedExpiresAt": "2026-08-24T12:00:00Z",
		})},
		{name: "malformed JSON", data: []byte(`{"runId": "r1",`), wantMsg: "not valid JSON"},
		{name: "not an object", data: []byte(`[1,2]`), wantMsg: "must be a JSON object"},
		{name: "empty payload", data: nil, wantMsg: "payload is empty"},
		{name: "oversized payload", data: []byte(`{"x":"` + strings.Repeat("a", events.DefaultMaxMsgSize) + `"}`), wantMsg: "more than the 1048576-byte limit"},
		{name: "runId wrong type", data: with("runId", 42), wantField: "runId", wantMsg: "must be a string, not number"},
		{name: "runId missing", data: with("runId", nil), wantField: "runId", wantMsg: "must not be empty"},
		{name: "runId with a dot", data: with("runId", "r.1"), wantField: "runId", wantMsg: "'.'"},
		{name: "companyId missing", data: with("companyId", nil), wantField: "companyId", wantMsg: "must not be empty"},
		{name: "companyId differs from subject", data: with("companyId", "c2"), wantField: "companyId", wantMsg: `subject names company "c1"`},
		{name: "environmentId missing", data: with("environmentId", nil), wantField: "environmentId", wantMsg: "must not be empty"},
		{name: "agentId missing", data: with("agentId", nil), wantField: "agentId", wantMsg: "must not be empty"},
		{name: "agentId wrong type", data: with("agentId", true), wantField: "agentId", wantMsg: "must be a string, not bool"},
		{name: "config missing", data: with("config", nil), wantField: "config", wantMsg: "is required"},
		{name: "config null", data: []byte(`{"runId":"r1","companyId":"c1","environmentId":"e","agentId":"a","config":null}`), wantField: "config", wantMsg: "is required"},
		{name: "config not an object", data: with("config", []any{1}), wantField: "config", wantMsg: "must be a JSON object"},
		{name: "config a string", data: with("config", "{}"), wantField: "config", wantMsg: "must be a JSON object"},
		{name: "workspace settings not an object", data: with("executionWorkspaceSettings", "x"), wantField: "executionWorkspaceSettings", wantMsg: "must be a JSON object"},
		{name: "requestedExpiresAt not RFC 3339", data: with("requestedExpiresAt", "tomorrow"), wantField: "requestedExpiresAt", wantMsg: "RFC 3339"},
		{name: "requestedExpiresAt wrong type", data: with("requestedExpiresAt", 17), wantField: "requestedExpiresAt", wantMsg: "must be a string"},
		// Issue 8.13: encoding/json lets the last of two keys win and fills fields from keys in
		// any case, so a payload could carry a companyId other than the one a reviewer reads.
		{name: "duplicate key", data: []byte(`{"runId":"r1","companyId":"c1","environmentId":"e","agentId":"a","config":{},"companyId":"c1"}`), wantField: "companyId", wantMsg: "duplicate key"},
		{name: "case-variant duplicate", data: []byte(`{"runId":"r1","companyId":"c1","environmentId":"e","agentId":"a","config":{},"COMPANYID":"c2"}`), wantField: "COMPANYID", wantMsg: "only in case"},
		{name: "lone case variant of a field", data: []byte(`{"runId":"r1","COMPANYID":"c1","environmentId":"e","agentId":"a","config":{}}`), wantField: "COMPANYID", wantMsg: `did you mean "companyId"`},
		{name: "duplicate key inside config", data: []byte(`{"runId":"r1","companyId":"c1","environmentId":"e","agentId":"a","config":{"backend":"job","backend":"sandbox-cr"}}`), wantField: "config.backend", wantMsg: "duplicate key"},
		{name: "release subject", subject: "paperclip.lease.c1.release", data: encode(t, validAcquire()), wantMsg: "not an acquire"},
		{name: "foreign subject", subject: "other.lease.c1.acquire", data: encode(t, validAcquire()), wantMsg: "unknown subject"},
	}
	var s events.Subjects
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			subject := tc.subject
			if subject == "" {
				subject = acquireSubject
			}
			req, err := s.DecodeAcquire(subject, tc.data)
			if tc.wantField == "" && tc.wantMsg == "" {
				if err != nil {
					t.Fatalf("DecodeAcquire: %v", err)
				}
				if req.RunID != "r1" || req.CompanyID != "c1" {
					t.Errorf("decoded ids (%q, %q)", req.RunID, req.CompanyID)
				}
				return
			}
			te, ok := events.AsTerminal(err)
			if !ok {
				t.Fatalf("got %v, want a TerminalError", err)
			}
			if te.Code != events.CodeInvalidRequest {
				t.Errorf("code = %q, want invalid_request", te.Code)
			}
			if te.Field != tc.wantField {
				t.Errorf("field = %q, want %q (error: %v)", te.Field, tc.wantField, err)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("message %q does not contain %q", err, tc.wantMsg)
			}
			if tc.wantField != "" && !strings.HasPrefix(err.Error(), tc.wantField+": ") {
				t.Errorf("message %q does not start with the field name", err)
			}
		})
	}
}

func TestDecodeRelease(t *testing.T) {
	var s events.Subjects
	data := []byte(`{"runId":"r1","companyId":"c1","providerLeaseId":"pc-01j9","cancelActiveWork":true}`)
	got, err := s.DecodeRelease("paperclip.lease.c1.destroy", data)
	if err != nil {
		t.Fatal(err)
	}
	want := events.ReleaseRequest{RunID: "r1", CompanyID: "c1", ProviderLeaseID: "pc-01j9", CancelActiveWork: true, Destroy: true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	got, err = s.DecodeRelease("paperclip.lease.c1.release", data)
	if err != nil || got.Destroy || got.Kind() != events.LeaseRelease {
		t.Errorf("release: got %+v, %v", got, err)
	}
	// A requester whose acquire timed out never heard the lease's name and still ends it.
	if _, err = s.DecodeRelease("paperclip.lease.c1.release", []byte(`{"runId":"r1","companyId":"c1"}`)); err != nil {
		t.Errorf("release without providerLeaseId: %v", err)
	}
	_, err = s.DecodeRelease("paperclip.lease.c1.release", []byte(`{"runId":"r1","companyId":"c1","providerLeaseId":"pc\u0001"}`))
	if te, ok := events.AsTerminal(err); !ok || te.Field != "providerLeaseId" {
		t.Errorf("providerLeaseId with a control character: got %v", err)
	}
	_, err = s.DecodeRelease("paperclip.lease.c1.acquire", data)
	if _, ok := events.AsTerminal(err); !ok {
		t.Errorf("acquire subject: got %v, want a TerminalError", err)
	}
}

func TestDecodeDispatch(t *testing.T) {
	m := validAcquire()
	m["namespace"] = "paperclip-c1"
	m["plan"] = map[string]any{"namespace": "paperclip-c1"}
	got, err := events.DecodeDispatch("kubeclip.dispatch.c1.r1", encode(t, m))
	if err != nil {
		t.Fatal(err)
	}
	if got.Namespace != "paperclip-c1" || got.RunID != "r1" || string(got.Config) != `{"inCluster":true}` {
		t.Errorf("decoded %+v", got)
	}
	_, err = events.DecodeDispatch("kubeclip.dispatch.c1.r2", encode(t, m))
	if te, ok := events.AsTerminal(err); !ok || te.Field != "runId" {
		t.Errorf("run mismatch: got %v", err)
	}
	m["namespace"] = "Paperclip_C1"
	_, err = events.DecodeDispatch("kubeclip.dispatch.c1.r1", encode(t, m))
	if te, ok := events.AsTerminal(err); !ok || te.Field != "namespace" {
		t.Errorf("bad namespace: got %v", err)
	}
	// A dispatch without the tenant-worker's plan is refused: the dispatcher derives none.
	m["namespace"] = "paperclip-c1"
	delete(m, "plan")
	_, err = events.DecodeDispatch("kubeclip.dispatch.c1.r1", encode(t, m))
	if te, ok := events.AsTerminal(err); !ok || te.Field != "plan" {
		t.Errorf("no plan: got %v", err)
	}
}

func TestDecodeRunEvent(t *testing.T) {
	var s events.Subjects
	ev, err := s.DecodeRunEvent("paperclip.run.c1.r1.status",
		[]byte(`{"runId":"r1","companyId":"c1","at":"2026-08-24T10:30:00Z","phase":"Running","podName":"p"}`))
	if err != nil {
		t.Fatal(err)
	}
	st, ok := ev.(events.RunStatusEvent)
	if !ok || st.Phase != events.PhaseRunning || st.PodName != "p" {
		t.Errorf("decoded %#v", ev)
	}
	_, err = s.DecodeRunEvent("paperclip.run.c1.r2.status", []byte(`{"runId":"r1","companyId":"c1","phase":"Running"}`))
	if te, ok := events.AsTerminal(err); !ok || te.Field != "runId" {
		t.Errorf("run mismatch: got %v", err)
	}
}

func TestTerminalErrors(t *testing.T) {
	base := errors.New("boom")
	err := events.Terminal("no_such_code", "x", base)
	te, ok := events.AsTerminal(err)
	if !ok || te.Code != events.CodeInternal || !errors.Is(err, base) || err.Error() != "x: boom" {
		t.Errorf("Terminal with an unknown code: %#v", te)
	}
	wrapped := errors.Join(errors.New("context"), events.Terminalf(events.CodeInvalidConfig, "config.egressMode", "must be cilium or standard"))
	te, ok = events.AsTerminal(wrapped)
	if !ok || te.Code != events.CodeInvalidConfig || te.Field != "config.egressMode" {
		t.Errorf("AsTerminal through a wrapper: %#v", te)
	}
	if _, ok := events.AsTerminal(base); ok {
		t.Errorf("a plain error is not terminal")
	}
	failed := events.NewRunFailed(events.Ref("c1", "r1"), events.LeaseAcquire, wrapped)
	if failed.Code != events.CodeInvalidConfig || failed.Field != "config.egressMode" || !strings.Contains(failed.Message, "config.egressMode: must be cilium or standard") {
		t.Errorf("NewRunFailed = %+v", failed)
	}
	// Issue 8.13: what failed inside kubeclip or the cluster stays in the logs; the tenant reads
	// what the code means.
	internals := []error{
		base,
		events.Terminal(events.CodeInternal, "", errors.New(`secrets "pc-1-env" is forbidden: User "system:serviceaccount:kubeclip:dispatcher" cannot get`)),
		&events.RetryableError{Code: events.CodeBackendUnavailable, Err: errors.New("dial tcp 10.96.0.1:443: connect: connection refused")},
	}
	for _, err := range internals {
		f := events.NewRunFailed(events.Ref("c1", "r1"), events.LeaseAcquire, err)
		if strings.Contains(f.Message, "boom") || strings.Contains(f.Message, "10.96") || strings.Contains(f.Message, "pc-1-env") || !strings.Contains(f.Message, "kubeclip's logs") {
			t.Errorf("NewRunFailed(%v).Message = %q, want the code's description without internals", err, f.Message)
		}
	}
	quota := &events.TerminalError{Code: events.CodeQuotaExceeded, Field: "config.defaultResources", Err: errors.New("detail"), Message: "ResourceQuota q refuses it"}
	if f := events.NewRunFailed(events.Ref("c1", "r1"), events.LeaseAcquire, quota); f.Message != "config.defaultResources: ResourceQuota q refuses it" {
		t.Errorf("NewRunFailed(quota).Message = %q", f.Message)
	}
}

// A refused request's failed event fits in one message however much of the request its field and
// message quote. An acquire well under the 1 MiB limit, with two 200 kB keys, once made a 1.2 MB
// event that could not be published: the requester never heard why its acquire failed.
func TestRunFailedFitsOneMessage(t *testing.T) {
	var s events.Subjects
	key := strings.Repeat("\xff", 200_000) // each byte decodes to U+FFFD, three bytes
	_, err := s.DecodeAcquire(acquireSubject, []byte(`{"runId":"r1","companyId":"c1","`+key+`":1,"`+key+`":2}`))
	if _, ok := events.AsTerminal(err); !ok {
		t.Fatalf("DecodeAcquire = %v, want a TerminalError", err)
	}
	failed := events.NewRunFailed(events.Ref("c1", "r1"), events.LeaseAcquire, err)
	if _, err := newPublisher(t, noPublish{}).Msg(failed); err != nil {
		t.Fatalf("building the failed event: %v", err)
	}
	if failed.Code != events.CodeInvalidRequest || !strings.HasSuffix(failed.Message, "…") {
		t.Errorf("failed event = %s %q…, want invalid_request with a cut message", failed.Code, failed.Message[:64])
	}
}
