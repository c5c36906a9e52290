package app

import (
	"slices"
	"testing"

	"github.com/kubeclip/kubeclip/pkg/broker"
	"github.com/kubeclip/kubeclip/pkg/dispatch"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/execsvc"
	"github.com/kubeclip/kubeclip/pkg/lease"
	"github.com/kubeclip/kubeclip/pkg/runwatch"
)

// TestWatchedStoresAreTheOwners: the workers report every stream and bucket under the name its
// owner gives it; pkg/events' table names them itself so as not to link every owner into every
// worker.
func TestWatchedStoresAreTheOwners(t *testing.T) {
	names := events.Subjects{}.StreamNames()
	for _, want := range []string{
		dispatch.ParkedStream, events.RetryStream, events.WorkStream,
		"KV_" + lease.Bucket, "KV_" + lease.TenantBucket, "KV_" + dispatch.AgentBucket, "KV_" + dispatch.WarmBucket,
		"KV_" + runwatch.OwnershipBucket, "KV_" + execsvc.RecordedBucket, "KV_" + events.BudgetBucket, "KV_" + broker.Bucket,
	} {
		if !slices.Contains(names, want) {
			t.Errorf("the watched stores %v leave out %s", names, want)
		}
	}
}
