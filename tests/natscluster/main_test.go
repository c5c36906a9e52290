// Package natscluster runs kubeclip on a 3-node NATS cluster that loses nodes, as the production
// overlay runs NATS (every stream and bucket at 3 replicas): three nats-server processes on
// loopback (internal/natstest), the worker binaries with every server in --nats-url, and runs of
// the agent stub on the local cluster. The workers first start together with the fresh cluster;
// then the run stream's leader is SIGKILLed mid-run and brought back, and the two other nodes
// are restarted one after the other under load. Every run's history must be whole, new
// publishes and acquires must succeed afterwards, and every worker must still run. The
// production overlay's own nats.conf runs here too (routes_test.go): its routes refuse a server
// without the installation's route certificate, and their certificates rotate without a split.
package natscluster

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"

	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
)

func TestMain(m *testing.M) {
	// The runs' pods share the node with the other suites' (pt.LockCluster).
	unlock, err := pt.LockCluster(false)
	if err != nil {
		fmt.Fprintf(os.Stderr, "natscluster: %v\n", err)
		os.Exit(1)
	}
	code := m.Run()
	unlock()
	if err := goleak.Find(pt.LeakOptions()...); err != nil {
		fmt.Fprintf(os.Stderr, "natscluster: leaked goroutines: %v\n", err)
		code = 1
	}
	os.Exit(code)
}
