package dispatch

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// eventually polls cond until it holds or a generous deadline passes: many conditions wait on
// the kubelet (a resume waits for its pod to be ready), which took up to 19 s on a loaded 2-core
// machine (TestResumeTakesTheAgent, in CI beside other suites).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// planned is req with the plan the tenant-worker would decide for it under the default
// operator policy: what a dispatch carries (lease.Plan.Encode).
func planned(t *testing.T, req events.DispatchRequest) events.DispatchRequest {
	t.Helper()
	plan, err := lease.New(req.AcquireRequest, time.Now(), policy.DefaultOperator())
	if err != nil {
		t.Fatalf("planning run %s: %v", req.RunID, err)
	}
	if req.Plan, err = plan.Encode(); err != nil {
		t.Fatal(err)
	}
	return req
}
