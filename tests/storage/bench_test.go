package storage_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kubeclip/kubeclip/internal/clustertest"
	"github.com/kubeclip/kubeclip/pkg/policy"
)

// BenchmarkPodReadyWithClaim measures the raw primitives a reusable lease's pod stands on, in a
// tenant namespace on the local cluster: a pod created with a fresh lease claim (claim create,
// then pod create, until the pod is Ready: the provisioner's helper pod makes the volume first),
// and a pod created on a claim already bound (the next run of a suspended lease), beside the same
// pod with no volume. Reported per op and as p50/max in milliseconds.
//
//	go test -run '^$' -bench PodReadyWithClaim -benchtime 5x ./tests/storage/
func BenchmarkPodReadyWithClaim(b *testing.B) {
	cs := clustertest.Clientset(b)
	op := policy.DefaultOperator()
	ns, company := applyTenant(b, cs, op)

	// The baseline: the same pod with no volume.
	b.Run("no-claim", func(b *testing.B) {
		var took []time.Duration
		for i := range b.N {
			pod := claimPod(fmt.Sprintf("plain-%d", i), "", "true")
			pod.Spec.Volumes, pod.Spec.Containers[0].VolumeMounts = nil, nil
			took = append(took, startPod(b, cs, ns, pod))
			b.StopTimer()
			deletePod(b, cs, ns, pod.Name)
			b.StartTimer()
		}
		report(b, took)
	})

	b.Run("fresh-claim", func(b *testing.B) {
		var took []time.Duration
		for i := range b.N {
			start := time.Now()
			claim := createLeaseClaim(b, cs, op, ns, company, "")
			startPod(b, cs, ns, claimPod(fmt.Sprintf("fresh-%d", i), claim, "true"))
			took = append(took, time.Since(start))
			b.StopTimer()
			deletePod(b, cs, ns, fmt.Sprintf("fresh-%d", i))
			b.StartTimer()
		}
		report(b, took)
	})

	b.Run("bound-claim", func(b *testing.B) {
		claim := createLeaseClaim(b, cs, op, ns, company, "")
		startPod(b, cs, ns, claimPod("binder", claim, "true"))
		deletePod(b, cs, ns, "binder")
		b.ResetTimer()
		var took []time.Duration
		for i := range b.N {
			name := fmt.Sprintf("bound-%d", i)
			took = append(took, startPod(b, cs, ns, claimPod(name, claim, "true")))
			b.StopTimer()
			deletePod(b, cs, ns, name)
			b.StartTimer()
		}
		report(b, took)
	})
}

func report(b *testing.B, took []time.Duration) {
	slices.Sort(took)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	b.ReportMetric(ms(took[len(took)/2]), "p50-ms")
	b.ReportMetric(ms(took[len(took)-1]), "max-ms")
	b.Logf("create -> Ready: %v", took)
}
