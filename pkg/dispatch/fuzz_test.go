package dispatch

import (
	"testing"

	"github.com/kubeclip/kubeclip/pkg/events"
)

// FuzzDispatchSubjectOf checks that a parked dispatch goes back to the subject it was accepted
// on: the parking subject names the agent, so the work subject is rebuilt from the payload. Its
// seed corpus under testdata/fuzz runs with every `go test`; `make fuzz` explores.
func FuzzDispatchSubjectOf(f *testing.F) {
	f.Add("kubeclip.dispatch.c1.r1", []byte(`{"runId":"r1","companyId":"c1","environmentId":"e","agentId":"a","config":{},"namespace":"paperclip-c1"}`))
	f.Fuzz(func(t *testing.T, subject string, data []byte) {
		rebuilt := dispatchSubjectOf(data)
		if rebuilt != "" {
			if _, _, err := events.ParseDispatchSubject(rebuilt); err != nil {
				t.Fatalf("dispatchSubjectOf = %q: %v", rebuilt, err)
			}
		}
		if _, err := events.DecodeDispatch(subject, data); err == nil && rebuilt != subject {
			t.Fatalf("a dispatch accepted on %q is republished on %q", subject, rebuilt)
		}
	})
}
