package ops_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kubeclip/kubeclip/internal/natstest"
	"github.com/kubeclip/kubeclip/internal/ops"
	"github.com/kubeclip/kubeclip/pkg/lease"
)

// BenchmarkLeaseCollectorRead measures one read of the lease records (what a scrape costs once
// per DefaultLeaseRefresh) at 1,000 and 10,000 records over 1,000 companies.
func BenchmarkLeaseCollectorRead(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			ctx := b.Context()
			_, _, js := natstest.Start(b)
			kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: lease.Bucket})
			if err != nil {
				b.Fatal(err)
			}
			states := []lease.State{lease.StateCreated, lease.StateFinished, lease.StateReleased}
			for i := range n {
				company := fmt.Sprint("co-", i%1000)
				rec, _ := json.Marshal(lease.Record{RunID: fmt.Sprint("run-", i), CompanyID: company, State: states[i%3], Namespace: "paperclip-" + company, WorkloadName: "pc-01m8cbts3ysye3kja58pbpac33"})
				if _, err := kv.Put(ctx, fmt.Sprintf("%s.run-%d", company, i), rec); err != nil {
					b.Fatal(err)
				}
			}
			now := time.Unix(0, 0)
			c := ops.NewLeaseCollector()
			c.Watch(kv, ops.LeaseCollectorOptions{Refresh: time.Nanosecond, Timeout: time.Minute, Now: func() time.Time { now = now.Add(time.Second); return now }})
			reg := prometheus.NewRegistry()
			reg.MustRegister(c)
			b.ResetTimer()
			for b.Loop() {
				mfs, err := reg.Gather()
				if err != nil || len(mfs) != 2 {
					b.Fatalf("gather: %d families, %v", len(mfs), err)
				}
			}
		})
	}
}
