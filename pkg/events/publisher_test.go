package events_test

import (
	"context"
	"encoding/json"
	"net/url"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
)

func ptr[T any](v T) *T { return &v }

var eventAt = time.Date(2026, 8, 24, 10, 29, 59, 500000000, time.UTC)

type sample struct {
	ev          events.Event
	wantSubject string
	wantID      string
	wantType    string
	wantTime    time.Time
	wantSeq     string
}

// samples holds one event of every type, with what its message must look like.
func samples() []sample {
	acquire := events.AcquireRequest{
		RunID: "r1", CompanyID: "c1", EnvironmentID: "env-1", AgentID: "agent-1",
		AdapterType: "claude_local", Config: json.RawMessage(`{"inCluster":true}`),
	}
	return []sample{
		{ev: acquire, wantSubject: "paperclip.lease.c1.acquire", wantID: "c1.r1.acquire", wantType: "io.paperclip.lease.acquire.v1", wantTime: fixedNow},
		{ev: events.ReleaseRequest{RunID: "r1", CompanyID: "c1", ProviderLeaseID: "pc-1"}, wantSubject: "paperclip.lease.c1.release", wantID: "c1.r1.release", wantType: "io.paperclip.lease.release.v1", wantTime: fixedNow},
		{ev: events.ReleaseRequest{RunID: "r1", CompanyID: "c1", ProviderLeaseID: "pc-1", Destroy: true}, wantSubject: "paperclip.lease.c1.destroy", wantID: "c1.r1.destroy", wantType: "io.paperclip.lease.destroy.v1", wantTime: fixedNow},
		{ev: events.DispatchRequest{AcquireRequest: acquire, Namespace: "paperclip-c1", Plan: json.RawMessage(`{}`)}, wantSubject: "kubeclip.dispatch.c1.r1", wantID: "c1.r1.dispatch", wantType: "io.kubeclip.dispatch.v1", wantTime: fixedNow},
		{ev: events.RunCreatedEvent{RunID: "r1", CompanyID: "c1", At: eventAt, ProviderLeaseID: "pc-1", Namespace: "paperclip-c1", WorkloadName: "pc-1", SecretName: "pc-1-env", Backend: "job", Phase: events.PhasePending}, wantSubject: "paperclip.run.c1.r1.created", wantID: "c1.r1.created", wantType: "io.paperclip.run.created.v1", wantTime: eventAt},
		{ev: events.RunStatusEvent{RunID: "r1", CompanyID: "c1", Phase: events.PhasePending, Reason: events.ReasonImagePullBackOff}, wantSubject: "paperclip.run.c1.r1.status", wantID: "c1.r1.status.Pending.ImagePullBackOff", wantType: "io.paperclip.run.status.v1", wantTime: fixedNow},
		{ev: events.RunStatusEvent{RunID: "r1", CompanyID: "c1", Phase: events.PhaseRunning}, wantSubject: "paperclip.run.c1.r1.status", wantID: "c1.r1.status.Running", wantType: "io.paperclip.run.status.v1", wantTime: fixedNow},
		{ev: events.RunStatusEvent{RunID: "r1", CompanyID: "c1", Phase: events.PhaseRunning, PodIP: "10.244.0.17"}, wantSubject: "paperclip.run.c1.r1.status", wantID: "c1.r1.status.Running.ip-10_244_0_17", wantType: "io.paperclip.run.status.v1", wantTime: fixedNow},
		{ev: events.RunStatusEvent{RunID: "r1", CompanyID: "c1", Phase: events.PhaseRunning, Reason: events.ReasonReady, PodIP: "fd00::11"}, wantSubject: "paperclip.run.c1.r1.status", wantID: "c1.r1.status.Running.Ready.ip-fd00__11", wantType: "io.paperclip.run.status.v1", wantTime: fixedNow},
		{ev: events.RunLogEvent{RunID: "r1", CompanyID: "c1", At: eventAt, Seq: 7, Pod: "p", Container: "agent", Lines: []events.LogLine{{TS: "2026-08-24T10:29:59.123456789Z", Text: "hello <world> & more"}}}, wantSubject: "paperclip.run.c1.r1.log", wantID: "c1.r1.log.7", wantType: "io.paperclip.run.log.v1", wantTime: eventAt, wantSeq: "00000000000000000007"},
		{ev: events.RunResultEvent{RunID: "r1", CompanyID: "c1", Outcome: events.OutcomeFailed, ExitCode: ptr(137), Reason: events.ReasonOOMKilled, Agent: &events.AgentResult{SessionID: "s", Model: "m", IsError: true, ErrorCode: "claude_truncated"}}, wantSubject: "paperclip.run.c1.r1.result", wantID: "c1.r1.result", wantType: "io.paperclip.run.result.v1", wantTime: fixedNow},
		{ev: events.RunReleasedEvent{RunID: "r1", CompanyID: "c1", ProviderLeaseID: "pc-1", State: events.ReleaseDestroyed}, wantSubject: "paperclip.run.c1.r1.released", wantID: "c1.r1.released.destroyed", wantType: "io.paperclip.run.released.v1", wantTime: fixedNow},
		{ev: events.NewRunFailed(events.Ref("c1", "r1"), events.LeaseAcquire, events.Terminalf(events.CodeInvalidConfig, "config.backend", "must be job or sandbox-cr")), wantSubject: "paperclip.run.c1.r1.failed", wantID: "c1.r1.failed.acquire", wantType: "io.paperclip.run.failed.v1", wantTime: fixedNow},
		{ev: events.RunExecEvent{RunID: "r1", CompanyID: "c1", ExecID: "01K3X", Seq: 3, Command: "claude", Stream: events.ExecStderr, Text: "warn"}, wantSubject: "paperclip.run.c1.r1.exec", wantID: "c1.r1.exec.01K3X.3", wantType: "io.paperclip.run.exec.v1", wantTime: fixedNow},
		{ev: events.RunExecEvent{RunID: "r1", CompanyID: "c1", ExecID: "01K3X", Seq: 4, Command: "claude", Exit: &events.ExecExit{ExitCode: ptr(0)}}, wantSubject: "paperclip.run.c1.r1.exec", wantID: "c1.r1.exec.01K3X.4", wantType: "io.paperclip.run.exec.v1", wantTime: fixedNow},
		{ev: events.RunSuspendedEvent{RunID: "r1", CompanyID: "c1", ProviderLeaseID: "pc-1", VolumeClaim: "pc-1-home"}, wantSubject: "paperclip.run.c1.r1.suspended", wantID: "c1.r1.suspended.0", wantType: "io.paperclip.run.suspended.v1", wantTime: fixedNow},
		{ev: events.RunSuspendedEvent{RunID: "r1", CompanyID: "c1", ProviderLeaseID: "pc-1", Generation: 1, VolumeClaim: "pc-1-home"}, wantSubject: "paperclip.run.c1.r1.suspended", wantID: "c1.r1.suspended.1", wantType: "io.paperclip.run.suspended.v1", wantTime: fixedNow},
		{ev: events.RunResumedEvent{RunID: "r1", CompanyID: "c1", At: eventAt, ProviderLeaseID: "pc-1", From: events.ResumedFromRetained, Resumes: 1}, wantSubject: "paperclip.run.c1.r1.resumed", wantID: "c1.r1.resumed.1", wantType: "io.paperclip.run.resumed.v1", wantTime: eventAt},
		{ev: events.RunResumedEvent{RunID: "r1", CompanyID: "c1", ProviderLeaseID: "pc-1", From: events.ResumedFromSuspended, Generation: 1, Resumes: 2}, wantSubject: "paperclip.run.c1.r1.resumed", wantID: "c1.r1.resumed.2", wantType: "io.paperclip.run.resumed.v1", wantTime: fixedNow},
		{ev: usageSample(), wantSubject: "paperclip.run.c1.r1.usage", wantID: "c1.r1.usage.01K3M.2", wantType: "io.paperclip.run.usage.v1", wantTime: eventAt},
	}
}

func usageSample() events.RunUsageEvent {
	return events.RunUsageEvent{RunID: "r1", CompanyID: "c1", At: eventAt, Meter: "01K3M", Seq: 2, Usage: []events.ModelUsage{
		{Key: "ANTHROPIC_API_KEY", Host: "api.anthropic.com", Format: events.UsageFormatAnthropicMessages, Calls: 3, InputTokens: 25, OutputTokens: 17, CacheReadTokens: 3, Unmetered: map[string]int64{"failed": 1}},
	}}
}

// usageWith is usageSample with its row changed by edit.
func usageWith(edit func(*events.RunUsageEvent)) events.RunUsageEvent {
	ev := usageSample()
	ev.Usage = append([]events.ModelUsage(nil), ev.Usage...)
	edit(&ev)
	return ev
}

func newPublisher(t *testing.T, js events.JetStreamPublisher) *events.Publisher {
	t.Helper()
	p, err := events.NewPublisher(events.PublisherOptions{JS: js, Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// wantHeader is the exact header set a sample's message carries.
func (s sample) wantHeader() nats.Header {
	h := nats.Header{
		"Nats-Msg-Id":        {s.wantID},
		"ce-specversion":     {"1.0"},
		"ce-type":            {s.wantType},
		"ce-source":          {"/companies/c1/runs/r1"},
		"ce-id":              {s.wantID},
		"ce-time":            {s.wantTime.Format(time.RFC3339Nano)},
		"ce-subject":         {s.wantSubject},
		"ce-datacontenttype": {"application/json"},
	}
	if s.wantSeq != "" {
		h["ce-sequence"] = []string{s.wantSeq}
	}
	return h
}

func TestPublisherMsgHeaders(t *testing.T) {
	p := newPublisher(t, noPublish{})
	for _, s := range samples() {
		t.Run(s.wantID, func(t *testing.T) {
			msg, err := p.Msg(s.ev)
			if err != nil {
				t.Fatal(err)
			}
			if msg.Subject != s.wantSubject {
				t.Errorf("subject = %q, want %q", msg.Subject, s.wantSubject)
			}
			if diff := cmp.Diff(s.wantHeader(), msg.Header); diff != "" {
				t.Errorf("headers (-want +got):\n%s", diff)
			}
			var body map[string]any
			if err := json.Unmarshal(msg.Data, &body); err != nil {
				t.Fatalf("body is not JSON: %v", err)
			}
			if body["runId"] != "r1" || body["companyId"] != "c1" {
				t.Errorf("body lacks the ids: %s", msg.Data)
			}
		})
	}
}

func TestPublisherStampsEventTime(t *testing.T) {
	p := newPublisher(t, noPublish{})
	msg, err := p.Msg(events.RunStatusEvent{RunID: "r1", CompanyID: "c1", Phase: events.PhaseRunning})
	if err != nil {
		t.Fatal(err)
	}
	var body struct{ At time.Time }
	if err := json.Unmarshal(msg.Data, &body); err != nil || !body.At.Equal(fixedNow) {
		t.Errorf("at = %v (%v), want the publisher's clock %v", body.At, err, fixedNow)
	}
	msg, err = p.Msg(events.RunLogEvent{RunID: "r1", CompanyID: "c1", Seq: 1})
	if err != nil {
		t.Fatal(err)
	}
	if string(msg.Data) != `{"runId":"r1","companyId":"c1","at":"2026-08-24T10:30:00.123456789Z","seq":1,"pod":"","container":"","lines":[]}` {
		t.Errorf("empty log event body = %s", msg.Data)
	}
}

func TestPublisherRejectsInvalidEvents(t *testing.T) {
	p := newPublisher(t, noPublish{})
	tests := []struct {
		name      string
		ev        events.Event
		wantField string
	}{
		{"acquire without agent", events.AcquireRequest{RunID: "r1", CompanyID: "c1", EnvironmentID: "e", Config: json.RawMessage(`{}`)}, "agentId"},
		{"log without seq", events.RunLogEvent{RunID: "r1", CompanyID: "c1"}, "seq"},
		{"status with a bad phase", events.RunStatusEvent{RunID: "r1", CompanyID: "c1", Phase: "Unknown"}, "phase"},
		{"status with a pod IP that is none", events.RunStatusEvent{RunID: "r1", CompanyID: "c1", Phase: events.PhaseRunning, PodIP: "pod-1"}, "podIp"},
		{"result with a bad outcome", events.RunResultEvent{RunID: "r1", CompanyID: "c1", Outcome: "ok"}, "outcome"},
		{"released with a bad state", events.RunReleasedEvent{RunID: "r1", CompanyID: "c1"}, "state"},
		{"failed with a bad code", events.RunFailedEvent{RunID: "r1", CompanyID: "c1", Code: "oops"}, "code"},
		{"created with a dotted run id", events.RunCreatedEvent{RunID: "r.1", CompanyID: "c1", Phase: events.PhasePending}, "runId"},
		{"exec with a dotted exec id", events.RunExecEvent{RunID: "r1", CompanyID: "c1", ExecID: "a.b", Seq: 1, Command: "sh", Stream: events.ExecStdout}, "execId"},
		{"exec without seq", events.RunExecEvent{RunID: "r1", CompanyID: "c1", ExecID: "x", Command: "sh", Stream: events.ExecStdout}, "seq"},
		{"exec chunk without stream", events.RunExecEvent{RunID: "r1", CompanyID: "c1", ExecID: "x", Seq: 1, Command: "sh"}, "stream"},
		{"exec final with text", events.RunExecEvent{RunID: "r1", CompanyID: "c1", ExecID: "x", Seq: 2, Command: "sh", Text: "x", Exit: &events.ExecExit{}}, "stream"},
		{"suspended without a volume claim", events.RunSuspendedEvent{RunID: "r1", CompanyID: "c1", ProviderLeaseID: "pc-1"}, "volumeClaim"},
		{"suspended with a negative generation", events.RunSuspendedEvent{RunID: "r1", CompanyID: "c1", ProviderLeaseID: "pc-1", Generation: -1, VolumeClaim: "v"}, "generation"},
		{"resumed from nowhere", events.RunResumedEvent{RunID: "r1", CompanyID: "c1", ProviderLeaseID: "pc-1", Resumes: 1}, "from"},
		{"resumed with a negative generation", events.RunResumedEvent{RunID: "r1", CompanyID: "c1", ProviderLeaseID: "pc-1", From: events.ResumedFromSuspended, Generation: -1, Resumes: 1}, "generation"},
		{"resumed without a resume", events.RunResumedEvent{RunID: "r1", CompanyID: "c1", ProviderLeaseID: "pc-1", From: events.ResumedFromRetained}, "resumes"},
		{"resumed naming no IP as its pod's", events.RunResumedEvent{RunID: "r1", CompanyID: "c1", ProviderLeaseID: "pc-1", From: events.ResumedFromRetained, Resumes: 1, PodIP: "pc-1"}, "podIp"},
		{"usage without a meter", usageWith(func(e *events.RunUsageEvent) { e.Meter = "" }), "meter"},
		{"usage with a dotted meter", usageWith(func(e *events.RunUsageEvent) { e.Meter = "a.b" }), "meter"},
		{"usage without seq", usageWith(func(e *events.RunUsageEvent) { e.Seq = 0 }), "seq"},
		{"usage without rows", usageWith(func(e *events.RunUsageEvent) { e.Usage = nil }), "usage"},
		{"usage of an unknown format", usageWith(func(e *events.RunUsageEvent) { e.Usage[0].Format = "gemini" }), "usage[0].format"},
		{"usage without calls", usageWith(func(e *events.RunUsageEvent) { e.Usage[0].Calls = 0 }), "usage[0].calls"},
		{"usage with negative tokens", usageWith(func(e *events.RunUsageEvent) { e.Usage[0].OutputTokens = -1 }), "usage[0].outputTokens"},
		{"usage without a key", usageWith(func(e *events.RunUsageEvent) { e.Usage[0].Key = "" }), "usage[0].key"},
		{"usage with more unmetered calls than calls", usageWith(func(e *events.RunUsageEvent) { e.Usage[0].Unmetered = map[string]int64{"failed": 2, "no_usage": 2} }), "usage[0].unmetered"},
		{"dispatch without namespace", events.DispatchRequest{AcquireRequest: events.AcquireRequest{RunID: "r1", CompanyID: "c1", EnvironmentID: "e", AgentID: "a", Config: json.RawMessage(`{}`)}}, "namespace"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := p.Msg(tc.ev)
			te, ok := events.AsTerminal(err)
			if !ok || te.Field != tc.wantField {
				t.Errorf("got %v, want a TerminalError about %s", err, tc.wantField)
			}
		})
	}
	if _, err := events.NewPublisher(events.PublisherOptions{}); err == nil {
		t.Errorf("NewPublisher without JS should fail")
	}
}

func TestHeaderValueEncoding(t *testing.T) {
	tests := []struct{ in, want string }{
		{"io.paperclip.run.log.v1", "io.paperclip.run.log.v1"},
		{"/companies/c1/runs/r1", "/companies/c1/runs/r1"},
		{"a b", "a%20b"},
		{`a"b`, "a%22b"},
		{"100%", "100%25"},
		{"société", "soci%C3%A9t%C3%A9"},
		{"tab\there", "tab%09here"},
		{"~!#$&'()+,/:;=?@[]", "~!#$&'()+,/:;=?@[]"},
	}
	for _, tc := range tests {
		got := events.EncodeHeaderValue(tc.in)
		if got != tc.want {
			t.Errorf("EncodeHeaderValue(%q) = %q, want %q", tc.in, got, tc.want)
		}
		// A reader percent-decodes the value (docs/contract.md).
		back, err := url.PathUnescape(got)
		if err != nil || back != tc.in {
			t.Errorf("decoding %q = %q, %v; want %q", got, back, err, tc.in)
		}
	}
}

func TestSourceRoundTripsOddIDs(t *testing.T) {
	p := newPublisher(t, noPublish{})
	msg, err := p.Msg(events.RunStatusEvent{RunID: `r%"1`, CompanyID: "société", Phase: events.PhaseRunning})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := msg.Header.Get(events.HeaderSource), "/companies/soci%25C3%25A9t%25C3%25A9/runs/r%2525%2522"+"1"; got != want {
		t.Errorf("ce-source = %q, want %q", got, want)
	}
	if got, want := msg.Header.Get(events.HeaderID), "soci%C3%A9t%C3%A9.r%25%221.status.Running"; got != want {
		t.Errorf("ce-id = %q, want %q", got, want)
	}
	c, r := events.MsgIDs(msg.Subject)
	if c != "société" || r != `r%"1` {
		t.Errorf("MsgIDs = (%q, %q)", c, r)
	}
	if c, r := events.MsgIDs("paperclip.run.c9.r9.log"); c != "c9" || r != "r9" {
		t.Errorf("MsgIDs from a subject = (%q, %q)", c, r)
	}
	if c, r := events.MsgIDs("paperclip.lease.c9.acquire"); c != "c9" || r != "" {
		t.Errorf("MsgIDs from a lease subject = (%q, %q)", c, r)
	}
}

// noPublish is a publisher that must not be reached: Msg never publishes.
type noPublish struct{}

func (noPublish) PublishMsg(context.Context, *nats.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	panic("Msg must not publish")
}

func TestPublishStoresHeadersAndDeduplicates(t *testing.T) {
	_, _, js := natstest.Start(t)
	ctx := t.Context()
	if err := events.EnsureStreams(ctx, js, events.Options{}); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, js)
	var s events.Subjects
	for _, smp := range samples() {
		ack, err := p.Publish(ctx, smp.ev)
		if err != nil {
			t.Fatalf("publishing %s: %v", smp.wantID, err)
		}
		if ack.Duplicate {
			t.Fatalf("first publish of %s reported a duplicate", smp.wantID)
		}
		again, err := p.Publish(ctx, smp.ev)
		if err != nil {
			t.Fatalf("republishing %s: %v", smp.wantID, err)
		}
		if !again.Duplicate || again.Sequence != ack.Sequence || again.Stream != ack.Stream {
			t.Errorf("republishing %s: ack %+v, want a duplicate of %+v", smp.wantID, again, ack)
		}

		stream, err := js.Stream(ctx, ack.Stream)
		if err != nil {
			t.Fatal(err)
		}
		stored, err := stream.GetMsg(ctx, ack.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		// Direct gets add the stream's own metadata headers; they are not part of the message.
		for _, k := range []string{"Nats-Sequence", "Nats-Stream", "Nats-Subject", "Nats-Time-Stamp"} {
			delete(stored.Header, k)
		}
		want := smp.wantHeader()
		want["Nats-Expected-Stream"] = []string{ack.Stream}
		if diff := cmp.Diff(want, stored.Header); diff != "" {
			t.Errorf("%s stored headers (-want +got):\n%s", smp.wantID, diff)
		}
		if stored.Subject != smp.wantSubject {
			t.Errorf("%s stored on %q, want %q", smp.wantID, stored.Subject, smp.wantSubject)
		}
		if ack.Stream == s.RunStream() {
			if _, err := s.DecodeRunEvent(stored.Subject, stored.Data); err != nil {
				t.Errorf("stored %s does not decode: %v", smp.wantID, err)
			}
		}
	}
	// One stored message per distinct id, whatever was republished.
	for stream, want := range map[string]uint64{s.LeaseStream(): 3, s.RunStream(): 16, events.WorkStream: 1} {
		st, err := js.Stream(ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != want {
			t.Errorf("stream %s holds %d messages, want %d", stream, info.State.Msgs, want)
		}
	}
}
