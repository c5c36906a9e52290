// Package isolation runs the real worker binaries against a real JetStream server and the local
// cluster and attacks the tenant boundary the way a hostile company could with its own provider
// config and its own subjects (issue 8): namespace escapes, worker environment, other companies'
// runs, forged headers, one company stalling all, replays and races. Each test names the defect
// it pins.
package isolation

import (
	"os"
	"testing"
	"time"

	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
)

const (
	// agentBusyTimeout is the dispatchers' --agent-busy-timeout: long enough that a thousand
	// parked acquires are still waiting when another company's acquire is measured.
	agentBusyTimeout = 2 * time.Minute
	// opsNamespace stands for kubeclip's own namespace (--kubeclip-namespace), put where a
	// company's config could name it (prefix paperclip-, slug ops).
	opsNamespace = "paperclip-ops"
	// operatorSecret is in the dispatcher's environment: no config may copy it into a run.
	operatorSecret = "op-secret-9f1c"
	runTimeout     = 2 * time.Minute
)

var env *pt.Env

func TestMain(m *testing.M) {
	tenancy := []string{"--kubeclip-namespace", opsNamespace, "--max-namespaces-per-company", "3"}
	os.Exit(pt.Main(m, pt.Options{
		Name:             "isolation",
		AgentBusyTimeout: agentBusyTimeout,
		ClusterLock:      true,
		Args:             map[string][]string{pt.TenantWorker: tenancy, pt.Dispatcher: tenancy},
		Env: map[string][]string{pt.Dispatcher: {
			"KUBECLIP_SHADOW_SECRET=" + operatorSecret, "AWS_SECRET_ACCESS_KEY=" + operatorSecret,
			"ANTHROPIC_API_KEY=sk-ant-isolation",
		}},
		// Two exec-workers at their defaults, as tests/paperclip runs them: the noisy
		// neighbour's execs go through them.
		ExecWorkers: 2,
		// The suite's nats-server a process of its own, as in production, not a -race server
		// inside the test process: TestNoisyNeighbour measures company B beside company A's
		// flood, and in-process B's acquire → created took 169-532 ms beside A (27-183 ms as a
		// process; docs/security.md, Fairness, admission and tenant RBAC).
		NATSProcess: true,
	}, &env))
}
