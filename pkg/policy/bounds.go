package policy

import "fmt"

// Bounds on every list a company sends (issue 15 item 18). A config or an egress grant is a
// request from a company that may be hostile: each list is rendered into Kubernetes objects
// (40,000 FQDNs became one network policy), so each has a fixed bound far above what an agent
// run needs. A list over its bound is refused as a whole, naming the field and the bound, and its
// entries are not checked one by one.
const (
	// MaxEgressEntries bounds egressAllowFqdns and egressAllowCidrs, and each list of a run's
	// egress grant (executionWorkspaceSettings.networkEgress.allowFqdns, allowCidrs).
	MaxEgressEntries = 100
	// MaxAdapters bounds the adapters registry.
	MaxAdapters = 32
	// MaxAdapterEntries bounds each list of one adapter: envKeys, allowFqdns, probeCommand.
	MaxAdapterEntries = 32
	// MaxDefaultEnv bounds one adapter's defaultEnv.
	MaxDefaultEnv = 64
	// MaxImageAllowList bounds imageAllowList.
	MaxImageAllowList = 64
	// MaxSmallMap bounds imagePullSecrets, serviceAccountAnnotations and
	// paperclipServerPodLabels.
	MaxSmallMap = 16
)

// withinBound reports whether a list of n entries fits max, and when it does not adds the error
// naming field and the bound.
func withinBound(errs *fieldErrors, field string, n, max int) bool {
	if n <= max {
		return true
	}
	errs.add(field, fmt.Sprintf("has %d entries; at most %d are allowed", n, max))
	return false
}
