package main

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/kubeclip/kubeclip/internal/app"
)

func TestSettingsPhasesAndReuseCounts(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr string // "" for none
	}{
		{"reusable lease phase", []string{"--phases", "n"}, ""},
		{"with others", []string{"--phases", "k,m,n"}, ""},
		{"warm pool phase", []string{"--phases", "n,o"}, ""},
		{"no phase q", []string{"--phases", "n,q"}, "--phases (KUBECLIP_BENCH_PHASES) takes phase letters a to p"},
		{"no warm pool", []string{"--warm-pool-max", "0"}, "--warm-pool-max (KUBECLIP_BENCH_WARM_POOL_MAX) must be > 0"},
		{"no rate", []string{"--warm-pool-rate", "0"}, "--warm-pool-rate (KUBECLIP_BENCH_WARM_POOL_RATE) and --warm-pool-fill-timeout (KUBECLIP_BENCH_WARM_POOL_FILL_TIMEOUT) must be > 0"},
		{"no warm samples", []string{"--warm-pool-samples", "-1"}, "--warm-pool-samples (KUBECLIP_BENCH_WARM_POOL_SAMPLES) must be > 0"},
		{"no leases", []string{"--reuse-leases", "0"}, "--reuse-leases (KUBECLIP_BENCH_REUSE_LEASES) must be > 0"},
		{"no live resumes", []string{"--reuse-live-resumes", "0"}, "--reuse-live-resumes (KUBECLIP_BENCH_REUSE_LIVE_RESUMES) must be > 0"},
		{"no suspended resumes", []string{"--reuse-suspended-resumes", "-1"}, "--reuse-suspended-resumes (KUBECLIP_BENCH_REUSE_SUSPENDED_RESUMES) must be > 0"},
	}
	noEnv := func(string) (string, bool) { return "", false }
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := parseSettings(append([]string{"--kubeconfig", "kc"}, tc.args...), noEnv, io.Discard)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("parseSettings(%q): %v", tc.args, err)
				}
				if !s.runs(phaseReuse) {
					t.Errorf("--phases %s does not run %s", s.phases, phaseReuse)
				}
				return
			}
			var usage *app.UsageError
			if !errors.As(err, &usage) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("parseSettings(%q) = %v, want a usage error containing %q", tc.args, err, tc.wantErr)
			}
		})
	}
}

// make bench runs every phase unless told otherwise: (n) and (o) among them.
func TestSettingsDefaultRunsReusableLeasePhase(t *testing.T) {
	s, err := parseSettings([]string{"--kubeconfig", "kc"}, func(string) (string, bool) { return "", false }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{phaseReuse, phaseWarmPool} {
		if !s.runs(p) {
			t.Errorf("the default phases (%q) do not run %s", s.phases, p)
		}
	}
	if s.warmPoolMax != 12 || s.warmPoolRate != 45 || s.warmPoolSamples != 60 {
		t.Errorf("(o) defaults: --warm-pool-max %d, --warm-pool-rate %g, --warm-pool-samples %d; want 12, 45, 60 (issue 17's load)", s.warmPoolMax, s.warmPoolRate, s.warmPoolSamples)
	}
}

// (p) needs no cluster: alone it needs no --kubeconfig and skips the set-up and the pipeline;
// with any other phase (or all) the cluster is needed again.
func TestSettingsBrokerPhase(t *testing.T) {
	noEnv := func(string) (string, bool) { return "", false }
	for _, tc := range []struct {
		name             string
		args             []string
		wantErr          string
		wantNeedsCluster bool
		wantLevels       []int
	}{
		{name: "alone, no kubeconfig", args: []string{"--phases", "p"}, wantLevels: []int{250, 500, 1000}},
		{name: "with another phase", args: []string{"--kubeconfig", "kc", "--phases", "o,p"}, wantNeedsCluster: true, wantLevels: []int{250, 500, 1000}},
		{name: "all", args: []string{"--kubeconfig", "kc"}, wantNeedsCluster: true, wantLevels: []int{250, 500, 1000}},
		{name: "another phase needs the kubeconfig", args: []string{"--phases", "a,p"}, wantErr: "--kubeconfig (KUBECLIP_KUBECONFIG) is required"},
		{name: "levels", args: []string{"--phases", "p", "--broker-streams", "10, 20"}, wantLevels: []int{10, 20}},
		{name: "levels not ascending", args: []string{"--phases", "p", "--broker-streams", "500,250"}, wantErr: "--broker-streams (KUBECLIP_BENCH_BROKER_STREAMS) takes stream counts in ascending order"},
		{name: "level not a count", args: []string{"--phases", "p", "--broker-streams", "250,x"}, wantErr: `"x" is not a count > 0`},
		{name: "no calls", args: []string{"--phases", "p", "--broker-calls", "0"}, wantErr: "--broker-calls (KUBECLIP_BENCH_BROKER_CALLS) must be > 0"},
		{name: "negative warm-up", args: []string{"--phases", "p", "--broker-warmup", "-1"}, wantErr: "--broker-warmup (KUBECLIP_BENCH_BROKER_WARMUP) must not be negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := parseSettings(tc.args, noEnv, io.Discard)
			if tc.wantErr != "" {
				var usage *app.UsageError
				if !errors.As(err, &usage) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseSettings(%q) = %v, want a usage error containing %q", tc.args, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parseSettings(%q): %v", tc.args, err)
			}
			if got := s.needsCluster(); got != tc.wantNeedsCluster {
				t.Errorf("needsCluster() = %v, want %v", got, tc.wantNeedsCluster)
			}
			if !s.runs(phaseBroker) {
				t.Errorf("--phases %s does not run %s", s.phases, phaseBroker)
			}
			if !slices.Equal(s.brokerStreamLevels, tc.wantLevels) {
				t.Errorf("stream levels %v, want %v", s.brokerStreamLevels, tc.wantLevels)
			}
		})
	}
}
