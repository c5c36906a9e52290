package dispatch

import (
	"testing"

	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// TestWarmEligibility: with warm pools on, only an acquire whose workload can be a warm pod (backend
// pod) and that is not a reusable lease gets one; a Job or a Sandbox treated as warm would be
// handed a bare pod. With pools off, nothing is eligible.
func TestWarmEligibility(t *testing.T) {
	tests := []struct {
		name     string
		poolsOn  bool
		backend  policy.Backend
		reusable bool
		want     bool
	}{
		{"pod", true, policy.BackendPod, false, true},
		{"job", true, policy.BackendJob, false, false},
		{"sandbox-cr", true, policy.BackendSandboxCR, false, false},
		{"reusable pod", true, policy.BackendPod, true, false},
		{"unknown backend", true, policy.Backend("deployment"), false, false},
		{"pod, pools off", false, policy.BackendPod, false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := &Dispatcher{}
			if tc.poolsOn {
				d.warm = &warmPools{}
			}
			plan := lease.Plan{Config: policy.Config{Backend: tc.backend}}
			if got := d.warmEligible(plan, lease.Record{Reusable: tc.reusable}); got != tc.want {
				t.Errorf("warmEligible(backend %s, reusable %t) = %t, want %t", tc.backend, tc.reusable, got, tc.want)
			}
		})
	}
}
