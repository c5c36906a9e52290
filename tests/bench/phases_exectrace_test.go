package main

import (
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/kubeclip/kubeclip/internal/app"
)

// (i)'s hop rows and its slowest execs must add up to each exec's round trip: a hop left out
// (or counted twice) would send the tail's reader to the wrong place.
func TestExecTraceSplitsEachRoundTripIntoItsHops(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 8, 0, 0, 0, time.UTC)
	at := func(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }
	tr := execTrace{hops: []execHops{
		{published: at(0), received: at(0.1), answered: at(1.9), started: at(2.2), exited: at(2.8)},
		{published: at(10), received: at(10.2), answered: at(35.8), started: at(36.2), exited: at(37)},
		{published: at(40), received: at(40.1), answered: at(41), started: at(41.3), exited: at(62.4)},
	}}
	rows := tr.stages("(i)", "daemon")
	var got []float64
	for _, r := range rows {
		got = append(got, *r.Total)
	}
	if diff := cmp.Diff([]float64{0.4, 28.3, 1.0, 22.5}, got); diff != "" {
		t.Errorf("stage totals (-want +got):\n%s", diff)
	}
	var sum float64
	for _, v := range got {
		sum += v
	}
	if want := 2.8 + 27 + 22.4; sum < want-0.001 || sum > want+0.001 {
		t.Errorf("stages add up to %.3f ms, want the round trips' %.3f ms", sum, want)
	}
	if got, want := tr.slowest(2), "27.0 = 0.2 + 25.6 + 0.4 + 0.8; 22.4 = 0.1 + 0.9 + 0.3 + 21.1"; got != want {
		t.Errorf("slowest(2) = %q, want %q", got, want)
	}
}

func TestParseCPUStat(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       cpuThrottle
	}{
		{"cgroup v1", "nr_periods 235\nnr_throttled 3\nthrottled_time 31773930\nnr_bursts 0\nburst_time 0\n",
			cpuThrottle{periods: 235, throttled: 3, throttledTime: 31773930 * time.Nanosecond, ok: true}},
		{"cgroup v2", "usage_usec 5000\nuser_usec 3000\nsystem_usec 2000\nnr_periods 12\nnr_throttled 8\nthrottled_usec 144900\n",
			cpuThrottle{periods: 12, throttled: 8, throttledTime: 144900 * time.Microsecond, ok: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, parseCPUStat(tc.stat), cmp.AllowUnexported(cpuThrottle{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// --exec-cpu-limit is the (i) pod's CPU limit, and only that: the rest of the pod config stays.
func TestExecCPULimit(t *testing.T) {
	noEnv := func(string) (string, bool) { return "", false }
	for _, tc := range []struct {
		limit   string
		wantErr bool
	}{{"2", false}, {"750m", false}, {"0", true}, {"-1", true}, {"lots", true}} {
		t.Run(tc.limit, func(t *testing.T) {
			s, err := parseSettings([]string{"--kubeconfig", "kc", "--exec-cpu-limit", tc.limit}, noEnv, io.Discard)
			var usage *app.UsageError
			switch {
			case tc.wantErr && (!errors.As(err, &usage) || !strings.Contains(err.Error(), "--exec-cpu-limit (KUBECLIP_BENCH_EXEC_CPU_LIMIT) must be a CPU quantity")):
				t.Fatalf("parseSettings = %v, want a usage error naming --exec-cpu-limit", err)
			case !tc.wantErr && err != nil:
				t.Fatalf("parseSettings: %v", err)
			case !tc.wantErr && s.execCPULimit != tc.limit:
				t.Fatalf("execCPULimit = %q, want %q", s.execCPULimit, tc.limit)
			}
		})
	}
	var got, want map[string]any
	if err := json.Unmarshal(podConfigWithCPULimit("2"), &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(podConfig(), &want); err != nil {
		t.Fatal(err)
	}
	want["defaultResources"].(map[string]any)["limits"].(map[string]any)["cpu"] = "2"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("podConfigWithCPULimit(2) (-want +got):\n%s", diff)
	}
}
