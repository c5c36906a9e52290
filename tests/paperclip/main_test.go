// Package paperclip runs kubeclip under the real Paperclip server end to end: paperclipai from
// npm (hack/paperclip/paperclip.sh: pinned, cached, run as an unprivileged user), the plugin
// installed from this checkout (plugins/paperclip), the real worker binaries (tenant-worker,
// dispatcher, run-watcher, two exec-workers; internal/pipelinetest) against a real JetStream
// server, and the local cluster, whose pods run the sandbox image (a shell, coreutils, node and
// a stub `claude` that prints stream-json and calls Paperclip's API through its bridge).
//
// The tests drive Paperclip as an operator does, through its HTTP API and its CLI, and check
// what each side recorded: Paperclip's run records, run logs and lease records; kubeclip's run
// stream, its exec-workers' logs and the cluster's pods. Nothing here skips: without Node or
// Paperclip the scripts install them, and a failure to do so fails the suite.
//
// Why a Go package and not a Node test: the workers, the run stream and the cluster are Go's
// (pipelinetest, pkg/events, client-go); Paperclip is a black box behind HTTP and a CLI, which
// any language drives equally. So `go test ./...`, which `make test` runs, runs it as it is.
package paperclip

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	pt "github.com/kubeclip/kubeclip/internal/pipelinetest"
)

// env is the kubeclip pipeline: one replica of each worker and two exec-workers, so that one can
// be killed under a run.
var env *pt.Env

func TestMain(m *testing.M) {
	// The plugin's npm dependencies (its build needs TypeScript): installed by the Makefile's
	// own rule, a no-op when they are current.
	root, err := repoRoot()
	if err == nil {
		cmd := exec.Command("make", "--no-print-directory", "-s", "plugin-deps")
		cmd.Dir, cmd.Stdout, cmd.Stderr = root, os.Stderr, os.Stderr
		err = cmd.Run()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "paperclip: installing the plugin's dependencies (make plugin-deps): %v\n", err)
		os.Exit(1)
	}
	// The credential broker (broker_test.go): every pod of the suite resolves api.anthropic.com
	// to it and trusts its CA (BrokerPods); only TestPaperclipBroker's company has its key
	// brokered.
	credBroker, err = suiteBroker()
	if err != nil {
		fmt.Fprintf(os.Stderr, "paperclip: the credential broker: %v\n", err)
		os.Exit(1)
	}
	os.Exit(pt.Main(m, pt.Options{
		Name: "paperclip", ExecWorkers: 2, ClusterLock: true,
		Args:       map[string][]string{pt.Dispatcher: {"--lease-idle-window", leaseIdleWindow.String()}},
		Broker:     credBroker,
		BrokerPods: pt.BrokerPods{Address: credBroker.Address, Hosts: credBroker.Hosts, CAFile: credBroker.CAFile},
	}, &env))
}
