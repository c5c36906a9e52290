package app_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/kubeclip/kubeclip/internal/app"
	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/pkg/events"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// TestFirstStartOnAFreshCluster: on a fresh 3-node cluster with every stream and bucket at 3
// replicas, the workers all start at once (a first install), each ensuring the streams and
// buckets while the JetStream meta leader is being elected and the streams placed. Every one
// must get through; before, all three kinds exited with "creating or updating stream
// PAPERCLIP_LEASES: context deadline exceeded" and each restart got one stream further.
func TestFirstStartOnAFreshCluster(t *testing.T) {
	const rounds, workers = 3, 9 // three replicas of each worker kind
	for round := range rounds {
		t.Run(fmt.Sprintf("round%d", round+1), func(t *testing.T) {
			cluster := natstest.StartCluster(t, 3)
			c := app.Common{NATSURL: cluster.URLs(), SubjectPrefix: "paperclip"}
			subjects, _ := events.NewSubjects(c.SubjectPrefix)
			st := app.Streams{Replicas: 3, LeaseRetention: events.DefaultLeaseMaxAge, RunRetention: events.DefaultRunMaxAge, StoreBytes: natstest.ClusterStoreBytes}
			// No deadline, as a worker's own: each request waits jetstream's default timeout.
			ctx := t.Context()
			var wg sync.WaitGroup
			errs := make([]error, workers)
			for i := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					start := time.Now()
					nc, _, err := c.JetStream(ctx, "tenant-worker", st, zerolog.New(zerolog.NewTestWriter(t)))
					if err != nil {
						errs[i] = err
						return
					}
					t.Logf("worker %d set up in %s", i, time.Since(start).Round(time.Millisecond))
					nc.Close()
				}()
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("worker %d: %v", i, err)
				}
			}
			_, js := cluster.Connect(t)
			for _, name := range []string{subjects.LeaseStream(), subjects.RunStream(), events.WorkStream, "KV_" + lease.Bucket, "KV_" + lease.TenantBucket} {
				s, err := js.Stream(ctx, name)
				if err != nil {
					t.Errorf("stream %s: %v", name, err)
					continue
				}
				if got := s.CachedInfo().Config.Replicas; got != 3 {
					t.Errorf("stream %s has %d replicas, want 3", name, got)
				}
			}
		})
	}
}
