package dispatch

import (
	"testing"
	"time"

	"go.uber.org/goleak"
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
