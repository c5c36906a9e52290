package pipelinetest

import "strings"

// BrokerPods wires the suite's tenant pods to a credential broker (issue 27; pkg/policy.Broker):
// the tenant-worker and the dispatcher get it as --broker-address, --broker-hosts and
// --broker-ca-file. The zero value wires nothing.
type BrokerPods struct {
	Address string   // IP the bound hosts resolve to in pods (hostAliases)
	Hosts   []string // bound hosts (api.anthropic.com, ...)
	CAFile  string   // PEM of the installation CA's certificate (public)
}

// args are the flags of a worker that renders tenant objects (Tenancy's: the tenant-worker and
// the dispatcher must agree), none for the zero BrokerPods or another worker.
func (b BrokerPods) args(kind string) []string {
	if b.Address == "" || (kind != TenantWorker && kind != Dispatcher) {
		return nil
	}
	return []string{"--broker-address", b.Address, "--broker-hosts", strings.Join(b.Hosts, ","), "--broker-ca-file", b.CAFile}
}
