package events_test

import (
	"testing"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// TestFailureRefReadsRunIDStrictly pins that a lease request's failure is reported to the run
// its runId names only when the key is spelled exactly as the decoders read it: a case variant
// (`RUNID`, `runid`) or a repeated key names no run, since the request itself is refused for
// that key and a failure must never reach a run the request did not name the decoders' way.
func TestFailureRefReadsRunIDStrictly(t *testing.T) {
	const subject = "paperclip.lease.c1.acquire"
	tests := []struct {
		name    string
		data    string
		wantRun string
	}{
		{name: "exact key", data: `{"runId":"r1"}`, wantRun: "r1"},
		{name: "upper case key", data: `{"RUNID":"r1"}`},
		{name: "lower case key", data: `{"runid":"r1"}`},
		{name: "a dotless i makes another key", data: `{"runId":"r1","runıd":"r2"}`, wantRun: "r1"},
		{name: "case variant beside the key", data: `{"runId":"r1","RunId":"r2"}`},
		{name: "repeated key", data: `{"runId":"r1","runId":"r2"}`},
		{name: "repeated key nested elsewhere is fine", data: `{"runId":"r1","config":{"a":1}}`, wantRun: "r1"},
		{name: "not a string", data: `{"runId":7}`},
		{name: "malformed", data: `{"runId":"r1"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ref, kind := events.FailureRef(received{subject: subject, data: []byte(tc.data)})
			if want := events.Ref("c1", tc.wantRun); ref != want || kind != events.LeaseAcquire {
				t.Errorf("FailureRef(%s) = %+v, %q; want %+v, %q", tc.data, ref, kind, want, events.LeaseAcquire)
			}
		})
	}
}
