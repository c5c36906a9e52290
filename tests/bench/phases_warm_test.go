package main

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubeclip/kubeclip/pkg/policy"
)

func TestWarmRows(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	hit := func(ready, exec int) warmResult {
		return warmResult{leaseTimes: leaseTimes{created: ms(ready - 5), ready: ms(ready), firstExec: ms(exec), warm: true}}
	}
	miss := func(ready, exec int) warmResult {
		return warmResult{leaseTimes: leaseTimes{created: ms(ready - 1000), ready: ms(ready), firstExec: ms(exec)}}
	}
	failed := warmResult{err: errors.New("quota_exceeded")}
	raw := samples{d: []time.Duration{ms(1900), ms(2000)}}
	type want struct {
		n                              int
		p50, p99                       *float64
		met                            *bool
		hitN, missN, errors            int
		hitRate, achieved              *float64
		readyMetric, hitRateMetricUnit string
	}
	f, yes, no := func(v float64) *float64 { return &v }, true, false
	tests := []struct {
		name    string
		results []warmResult
		want    want
	}{
		{
			name:    "hits fast, one miss, one failure",
			results: []warmResult{hit(20, 25), hit(30, 35), hit(40, 45), miss(2000, 2010), failed},
			want: want{n: 4, p50: f(30), p99: f(2000), met: &no, hitN: 3, missN: 1, errors: 1, hitRate: f(75), achieved: f(44.9),
				readyMetric: phaseWarmPool + ": acquire → ready (status Running/Ready), every acquire", hitRateMetricUnit: "%"},
		},
		{
			name:    "every acquire a hit within the goal",
			results: []warmResult{hit(20, 25), hit(30, 35), hit(40, 45)},
			want: want{n: 3, p50: f(30), p99: f(40), met: &yes, hitN: 3, hitRate: f(100), achieved: f(44.9),
				readyMetric: phaseWarmPool + ": acquire → ready (status Running/Ready), every acquire", hitRateMetricUnit: "%"},
		},
		{
			// Warm pools off: every acquire is a miss, reported as such.
			name:    "every acquire a miss",
			results: []warmResult{miss(1900, 1950), miss(2100, 2150)},
			want: want{n: 2, p50: f(1900), p99: f(2100), met: &no, missN: 2, hitRate: f(0), achieved: f(44.9),
				readyMetric: phaseWarmPool + ": acquire → ready (status Running/Ready), every acquire", hitRateMetricUnit: "%"},
		},
		{
			// A hit whose status Ready never came: a hit all the same, its exec counted, its
			// ready a failure.
			name:    "a hit without its ready",
			results: []warmResult{hit(20, 25), {leaseTimes: leaseTimes{created: ms(10), firstExec: ms(30), warm: true}, err: errors.New("waiting for run: deadline exceeded")}},
			want: want{n: 1, p50: f(20), p99: f(20), met: &no, hitN: 1, errors: 1, hitRate: f(100), achieved: f(44.9),
				readyMetric: phaseWarmPool + ": acquire → ready (status Running/Ready), every acquire", hitRateMetricUnit: "%"},
		},
		{
			// The phase could not run: the goal's row is there, NOT MET, without samples.
			name:    "nothing measured",
			results: nil,
			want: want{met: &no,
				readyMetric: phaseWarmPool + ": acquire → ready (status Running/Ready), every acquire", hitRateMetricUnit: "%"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			achieved := 44.94
			if tc.results == nil {
				achieved = 0
			}
			rows := warmRows(tc.results, raw, 45, achieved)
			byMetric := map[string]row{}
			for _, r := range rows {
				byMetric[r.Metric] = r
			}
			ready := rows[0]
			got := want{
				n: ready.N, p50: ready.P50, p99: ready.P99, met: ready.Met, errors: ready.Errors,
				hitN:              byMetric["(o') warm pool: acquire → ready, hits only"].N,
				missN:             byMetric["(o') warm pool: acquire → ready, misses only (cold path under the same load)"].N,
				hitRate:           byMetric["(o') warm pool: hit rate (created events saying warm, of the acquires answered)"].P50,
				achieved:          byMetric["(o') warm pool: achieved acquire rate, 45/s offered open loop"].P50,
				readyMetric:       ready.Metric,
				hitRateMetricUnit: byMetric["(o') warm pool: hit rate (created events saying warm, of the acquires answered)"].Unit,
			}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("warmRows (-want +got):\n%s", diff)
			}
			if ready.RawN != 2 || ready.Target != warmGoal {
				t.Errorf("the ready row: raw n %d, target %q; want the 2 raw samples and %q", ready.RawN, ready.Target, warmGoal)
			}
		})
	}
}

// An open loop starts each call on schedule while the earlier ones are still running: here
// every call waits until all have started, which a loop waiting for each call never reaches.
func TestOpenLoopDoesNotWaitForEarlierCalls(t *testing.T) {
	const n = 20
	var startedCalls atomic.Int32
	all := make(chan struct{})
	var once sync.Once
	var stuck atomic.Int32
	started := openLoop(t.Context(), n, 1000, func(int) {
		if startedCalls.Add(1) == n {
			once.Do(func() { close(all) })
		}
		select {
		case <-all:
		case <-time.After(10 * time.Second):
			stuck.Add(1)
		}
	})
	if len(started) != n || stuck.Load() != 0 {
		t.Fatalf("openLoop started %d calls, %d waited in vain for the others; want %d started while the earlier ones ran", len(started), stuck.Load(), n)
	}
	for i := 1; i < n; i++ {
		if started[i].Before(started[i-1]) {
			t.Fatalf("call %d started before call %d", i, i-1)
		}
	}
}

func TestOpenLoopStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	var calls atomic.Int32
	started := openLoop(ctx, 100, 50, func(int) {
		if calls.Add(1) == 3 {
			cancel()
		}
	})
	if len(started) >= 100 || int(calls.Load()) != len(started) {
		t.Errorf("after the cancel: %d calls started, %d ran; want fewer than 100, each started call run", len(started), calls.Load())
	}
}

func TestOffsetAndAchievedRate(t *testing.T) {
	if got := offset(45, 45); got != time.Second {
		t.Errorf("offset(45, 45) = %s, want 1s", got)
	}
	if got := offset(1, 4); got != 250*time.Millisecond {
		t.Errorf("offset(1, 4) = %s, want 250ms", got)
	}
	t0 := time.Now()
	if got := achievedRate([]time.Time{t0, t0.Add(500 * time.Millisecond), t0.Add(time.Second)}); got != 2 {
		t.Errorf("achievedRate(3 starts over 1 s) = %v, want 2", got)
	}
	if got := achievedRate([]time.Time{t0}); got != 0 {
		t.Errorf("achievedRate(1 start) = %v, want 0", got)
	}
}

// warmPod is a pod of (o)'s pool: bound when runID is not empty.
func warmPod(name, runID string, ready, deleting bool) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{policy.LabelWarmPool: "shape"}}}
	if runID != "" {
		p.Labels[policy.LabelRunID] = runID
	}
	if deleting {
		now := metav1.Now()
		p.DeletionTimestamp = &now
	}
	p.Status.Phase = corev1.PodRunning
	status := corev1.ConditionFalse
	if ready {
		status = corev1.ConditionTrue
	}
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: status}}
	return p
}

func TestUnboundWarmPods(t *testing.T) {
	plain := warmPod("plain", "", true, false)
	delete(plain.Labels, policy.LabelWarmPool)
	pods := []corev1.Pod{
		warmPod("ready", "", true, false),
		warmPod("starting", "", false, false),
		warmPod("bound", "run-1", true, false),
		warmPod("deleting", "", true, true),
		plain,
	}
	total, ready := unboundWarmPods(pods)
	if total != 2 || ready != 1 {
		t.Errorf("unboundWarmPods = %d total, %d ready; want 2 and 1 (bound, deleting and plain pods are not the pool's)", total, ready)
	}
}

// settle waits for running pods, but an idle warm pod never stops: it is deleted with the
// stopped ones. A bound warm pod runs a lease and is waited for.
func TestRunningLeavesIdleWarmPodsToDelete(t *testing.T) {
	plain := warmPod("plain", "", true, false)
	delete(plain.Labels, policy.LabelWarmPool)
	pods := []corev1.Pod{warmPod("idle", "", true, false), warmPod("bound", "run-1", true, false), plain}
	var names []string
	for _, p := range running(pods) {
		names = append(names, p.Name)
	}
	if diff := cmp.Diff([]string{"bound", "plain"}, names); diff != "" {
		t.Errorf("running (-want +got):\n%s", diff)
	}
}

func TestWarmSeries(t *testing.T) {
	exposition := `# HELP kubeclip_warm_acquires_total Acquires of warm-eligible leases.
# TYPE kubeclip_warm_acquires_total counter
kubeclip_warm_acquires_total{result="hit"} 41
kubeclip_warm_acquires_total{result="miss"} 20
kubeclip_warm_pods 12
kubeclip_warm_pods_other 3
kubeclip_warm_pool_pods{company="c"} 12
kubeclip_warm_pools_read_ok 1
kubeclip_acquires_total 61
`
	want := `kubeclip_warm_acquires_total{result="hit"} 41, kubeclip_warm_acquires_total{result="miss"} 20, kubeclip_warm_pods 12, kubeclip_warm_pool_pods{company="c"} 12`
	if got := warmSeries(exposition); got != want {
		t.Errorf("warmSeries = %q, want %q", got, want)
	}
	if got := warmSeries("kubeclip_acquires_total 3\n"); got != "no kubeclip_warm_acquires_total or kubeclip_warm_pods or kubeclip_warm_pool_pods or kubeclip_warm_pool_acquires series" {
		t.Errorf("warmSeries without warm series = %q", got)
	}
}
