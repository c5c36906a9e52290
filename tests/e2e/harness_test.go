// Package e2e runs the real worker binaries against a real JetStream server and the local
// Kubernetes cluster, and checks what Paperclip would see: the run events. The harness is
// internal/pipelinetest, shared with tests/failover.
package e2e

import (
	"os"
	"testing"
	"time"

	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
)

// agentBusyTimeout is the dispatcher's --agent-busy-timeout in these tests.
const agentBusyTimeout = 15 * time.Second

// env is shared by every test: one JetStream server and one replica of each worker.
var env *pt.Env

func TestMain(m *testing.M) {
	os.Exit(pt.Main(m, pt.Options{Name: "e2e", AgentBusyTimeout: agentBusyTimeout, ClusterLock: true}, &env))
}
